/*
 * manifest_echo: a plugin that registers exactly the impl ids its own package declares, so that
 * the command-line tests can give every package a real library without compiling one per package.
 *
 * init finds the library's own file with dladdr, reads the `.gkmetadata` of the package tree it
 * lies in (its directory, or up to two directories above), and registers one stock CPU kernel
 * (guild_test_kernel.h) per entry of "provided_ops". The scan is deliberately naive: package ids
 * and impl ids are validated identifiers without quotes or escapes, and the host has already
 * authenticated the file before any library of the package is opened.
 *
 * Compile-time variants, one library each (see CMakeLists.txt):
 *   MANIFEST_ECHO_SKIP_LAST  registers every declared id but the last (a registration mismatch);
 *   MANIFEST_ECHO_CRASH      aborts inside init (the process dies of SIGABRT);
 *   MANIFEST_ECHO_HANG       never returns from init;
 *   MANIFEST_ECHO_SLOW       sleeps three seconds in init, then registers as the plain one does
 *                            (a sound library that initialises slowly).
 */
#define _GNU_SOURCE
#include <guild/abi/kernel_abi.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "guild_test_kernel.h"

#define ECHO_COMPONENT "test.manifest_echo"
#define ECHO_MAX_IDS 64
#define ECHO_MAX_ID 256
#define ECHO_MAX_METADATA (1 << 20)

/* Any object inside this library: dladdr maps its address back to the library's file. */
static const int echo_anchor = 0;

/* Reads <dir>/.gkmetadata into a NUL-terminated heap buffer, or answers NULL. */
static char* echo_read_metadata(const char* dir) {
    char path[4096];
    FILE* file;
    char* text;
    size_t len;
    int written = snprintf(path, sizeof path, "%s/.gkmetadata", dir);
    if (written < 0 || (size_t)written >= sizeof path) {
        return NULL;
    }
    file = fopen(path, "rb");
    if (file == NULL) {
        return NULL;
    }
    text = (char*)malloc(ECHO_MAX_METADATA + 1);
    if (text == NULL) {
        (void)fclose(file);
        return NULL;
    }
    len = fread(text, 1, ECHO_MAX_METADATA, file);
    (void)fclose(file);
    text[len] = '\0';
    return text;
}

/* The .gkmetadata of the tree holding this library: its directory, or one of two above it. */
static char* echo_find_metadata(void) {
    Dl_info info;
    char dir[4096];
    int level;
    if (dladdr(&echo_anchor, &info) == 0 || info.dli_fname == NULL) {
        return NULL;
    }
    if (strlen(info.dli_fname) >= sizeof dir) {
        return NULL;
    }
    strcpy(dir, info.dli_fname);
    for (level = 0; level < 3; ++level) {
        char* slash = strrchr(dir, '/');
        char* text;
        if (slash == NULL) {
            return NULL;
        }
        *slash = '\0';
        text = echo_read_metadata(dir);
        if (text != NULL) {
            return text;
        }
    }
    return NULL;
}

static const char* echo_skip_space(const char* p) {
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') {
        ++p;
    }
    return p;
}

/* Copies the strings of the "provided_ops" array into ids; answers how many, or -1. */
static int echo_provided_ops(const char* text, char ids[ECHO_MAX_IDS][ECHO_MAX_ID]) {
    int count = 0;
    const char* p = strstr(text, "\"provided_ops\"");
    if (p == NULL) {
        return -1;
    }
    p = echo_skip_space(p + strlen("\"provided_ops\""));
    if (*p != ':') {
        return -1;
    }
    p = echo_skip_space(p + 1);
    if (*p != '[') {
        return -1;
    }
    p = echo_skip_space(p + 1);
    while (*p != ']') {
        const char* end;
        size_t len;
        if (*p != '"' || count == ECHO_MAX_IDS) {
            return -1;
        }
        end = strchr(p + 1, '"');
        if (end == NULL) {
            return -1;
        }
        len = (size_t)(end - (p + 1));
        if (len == 0 || len >= ECHO_MAX_ID) {
            return -1;
        }
        memcpy(ids[count], p + 1, len);
        ids[count][len] = '\0';
        ++count;
        p = echo_skip_space(end + 1);
        if (*p == ',') {
            p = echo_skip_space(p + 1);
        } else if (*p != ']') {
            return -1;
        }
    }
    return count;
}

static guild_status_t echo_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    static char ids[ECHO_MAX_IDS][ECHO_MAX_ID];
    guild_kernel_op_desc_v1_t desc;
    char* text;
    int count;
    int i;
    guild_status_t status = guild_test_init_prologue(host, plugin_state, error, ECHO_COMPONENT);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
#if defined(MANIFEST_ECHO_CRASH)
    abort();
#elif defined(MANIFEST_ECHO_HANG)
    for (;;) {
        (void)sleep(1);
    }
#elif defined(MANIFEST_ECHO_SLOW)
    (void)sleep(3);
#endif
    text = echo_find_metadata();
    if (text == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, ECHO_COMPONENT,
                                    "cannot read the .gkmetadata beside the library");
    }
    count = echo_provided_ops(text, ids);
    free(text);
    if (count < 0) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, ECHO_COMPONENT,
                                    "cannot read provided_ops from the .gkmetadata");
    }
#if defined(MANIFEST_ECHO_SKIP_LAST)
    if (count > 0) {
        --count;
    }
#endif
    for (i = 0; i < count; ++i) {
        guild_test_kernel_desc(&desc, ids[i]);
        status = host->register_kernel(host->host_context, &desc, error);
        if (status != GUILD_STATUS_OK) {
            return status;
        }
    }
    return GUILD_STATUS_OK;
}

static void echo_shutdown(void* plugin_state) {
    (void)plugin_state;
}

static const guild_plugin_descriptor_v1_t echo_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "manifest_echo",
    "1.0.0",
    echo_init,
    echo_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &echo_descriptor;
}
