/*
 * libguild_host: the Guild host for C and C++ engines that own their process (API version 1).
 *
 * An engine opens a store of installed packages as a runner (read-only: the store must exist; a
 * runner never creates or changes one), which authenticates and loads every enabled package. It
 * then calls operations through the operation service table that plugins and runners already use
 * (guild_operation_service_v1_t, declared in guild/abi/module_abi.h): resolve, describe, scratch,
 * execute, reshape, release. This header adds only what an embedding process needs around that
 * table: open and close, the package version and currency of a handle, following the store
 * (refresh, a watcher with a callback, a pollable state), a log sink and owned error objects.
 *
 *     const guild_host_capi_v1_t* api = guild_host_get_api(GUILD_HOST_CAPI_VERSION);
 *     guild_host_open_options_v1_t options = GUILD_HOST_OPEN_OPTIONS_V1_INIT;
 *     options.store_dir = "/var/lib/guild";
 *     guild_host_t* host = NULL;
 *     guild_host_error_t* error = NULL;
 *     if (api->open(&options, &host, NULL, &error) != GUILD_HOST_OK) {
 *         fprintf(stderr, "%s\n", api->error_message(error));
 *         api->error_free(error);
 *     }
 *
 * Conventions (those of abi-headers/README.md, and the same as the operation service):
 * - Every entry returns a guild_host_code_t. Out-parameters are written only on GUILD_HOST_OK;
 *   on failure they are left as they were.
 * - Every pointer is checked: NULL where an object is required is GUILD_HOST_ERR_INVALID_ARGUMENT.
 *   Every struct starts with struct_size, which the caller sets to sizeof as its header knows it;
 *   a record smaller than this version's is refused the same way. Structs and the API table only
 *   grow by appending fields.
 * - out_error may be NULL. Otherwise, on failure, *out_error receives a new error object (its
 *   code and a one-line message in plain words, naming what was wrong); free it with
 *   api->error_free. On success *out_error is left untouched.
 * - No exception, longjmp or Rust panic crosses this boundary. A bug inside the library is
 *   reported as GUILD_HOST_ERR_INTERNAL, never an abort.
 * - Strings are NUL-terminated UTF-8.
 *
 * Threads: a guild_host_t may be used from any thread, and by several at once, except that
 * close must not race any other call on the same host. The operation service's own rules
 * (module_abi.h) apply to its handles.
 *
 * Compiles as C99 and C++17; include it from either.
 */
#ifndef GUILD_HOST_H
#define GUILD_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "guild/abi/module_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this API; pass it to guild_host_get_api. */
#define GUILD_HOST_CAPI_VERSION 1u

/* Result codes (guild_host_code_t). */
typedef int32_t guild_host_code_t;
#define GUILD_HOST_OK 0
/* A NULL, misaligned or too small argument, or text that is not UTF-8. Nothing was done. */
#define GUILD_HOST_ERR_INVALID_ARGUMENT 1
/* The store path is not a store: missing, not a directory, or no registry there. Nothing was
 * created. The message names the path. */
#define GUILD_HOST_ERR_NOT_A_STORE 2
/* The store exists but cannot be used: corrupt, unreadable, an I/O failure. */
#define GUILD_HOST_ERR_STORE 3
/* The lock file cannot be read or is not a lock file. */
#define GUILD_HOST_ERR_LOCK_FILE 4
/* Refused for now: close while operation handles are live, or a call that would wait for the
 * watcher from inside its own callback. Nothing changed; retry once the cause is gone. */
#define GUILD_HOST_ERR_BUSY 5
/* The handle is not a live handle of this host (NULL, released, or another host's). */
#define GUILD_HOST_ERR_NOT_FOUND 6
/* The host refused or failed otherwise (a package that does not load, trust, dependencies);
 * the message says what. */
#define GUILD_HOST_ERR_HOST 7
/* A bug in the library was caught at the boundary. The host stays usable where it can. */
#define GUILD_HOST_ERR_INTERNAL 8

/* An opened host. Opaque; made by open, ended by close. */
typedef struct guild_host_s guild_host_t;

/* An owned error: code and message. Opaque; free with error_free. */
typedef struct guild_host_error_s guild_host_error_t;

/*
 * Receives every record a plugin writes through its host table's log (level is a
 * GUILD_LOG_LEVEL_*), and the failure reports of providers whose caller passed no error record.
 * Called on the plugin's or the caller's thread, possibly several at once; the strings are valid
 * for the call only. Keep it short and do not call into the host from it.
 */
typedef void (*guild_host_log_fn)(void* user, const char* package_id, uint32_t level, const char* message);

/* Opening flags. */
/* Resolve CPU operations only, without probing the CUDA driver. */
#define GUILD_HOST_OPEN_CPU_ONLY (1u << 0)

/* How to open a host. Start from GUILD_HOST_OPEN_OPTIONS_V1_INIT. */
typedef struct guild_host_open_options_v1_t {
    /* sizeof(guild_host_open_options_v1_t). */
    uint32_t struct_size;
    /* GUILD_HOST_OPEN_* bits; unknown bits are refused. */
    uint32_t flags;
    /* The store directory (required). It must already be a store. */
    const char* store_dir;
    /* A lock file (`guild lock`) limiting what is loaded to the packages it names, at their
     * versions and digests; NULL for none. */
    const char* lock_file;
    /* The log sink and its first argument; NULL drops the records. */
    guild_host_log_fn log;
    void* log_user;
} guild_host_open_options_v1_t;

#define GUILD_HOST_OPEN_OPTIONS_V1_INIT \
    { (uint32_t)sizeof(guild_host_open_options_v1_t), 0u, NULL, NULL, NULL, NULL }

/* What open found. */
typedef struct guild_host_open_report_v1_t {
    /* sizeof(guild_host_open_report_v1_t), set by the caller. */
    uint32_t struct_size;
    /* Packages loaded. */
    uint32_t loaded;
    /* Packages whose library failed to load or register (they are retried by refresh). */
    uint32_t failed;
    /* Packages not opened: a dependency missing, disabled or failed. */
    uint32_t skipped;
    /* Enabled packages the lock file does not admit. */
    uint32_t refused_by_lock;
    /* Builds in crash quarantine (a process died in their init). */
    uint32_t quarantined;
    /* The committed store generation the host loaded. */
    uint64_t generation;
} guild_host_open_report_v1_t;

/* What one refresh did (also what the watcher's callback receives). Counts of packages. */
typedef struct guild_host_refresh_v1_t {
    /* sizeof(guild_host_refresh_v1_t), set by the caller (the library sets it for callbacks). */
    uint32_t struct_size;
    /* New versions loaded and published. */
    uint32_t loaded;
    /* The committed generation the host had applied before, and the one it follows now. */
    uint64_t from_generation;
    uint64_t generation;
    /* Versions taken out: disabled, removed, rolled back from, replaced, revoked. */
    uint32_t taken_out;
    /* Switches waiting for live handles into the old version to be released. */
    uint32_t deferred;
    /* Revoked versions that live handles still run: release those handles. */
    uint32_t revoked_live;
    /* Loads that failed (retried later). */
    uint32_t failed;
    /* Changes the host still owes (deferred or failed), retried by later refreshes. */
    uint32_t pending;
    /* Zero. */
    uint32_t reserved;
} guild_host_refresh_v1_t;

/*
 * Called on the watcher's thread after each refresh that changed something or still owes
 * something (report != NULL, error == NULL), and after each refresh that failed (report == NULL,
 * error borrowed for the call: do not free it). Do not call close or unwatch from it (they are
 * refused with GUILD_HOST_ERR_BUSY there); resolving, releasing and refresh are fine.
 */
typedef void (*guild_host_watch_fn)(void* user, const guild_host_refresh_v1_t* report, const guild_host_error_t* error);

/* A pollable view of the host, for engines that check between requests instead of a callback. */
typedef struct guild_host_state_v1_t {
    /* sizeof(guild_host_state_v1_t), set by the caller. */
    uint32_t struct_size;
    /* Changes the host owes (see guild_host_refresh_v1_t.pending), after the last refresh. */
    uint32_t pending;
    /* The committed generation the host last followed (open, refresh or the watcher). */
    uint64_t generation;
    /* Refreshes so far that changed something or failed; it only grows, so a poller that saw
     * another number resolves again (and checks is_current on the handles it keeps). */
    uint64_t changes;
    /* Operation handles the engine resolved through the table operation_service copied and has
     * not released yet (handles loaded modules hold are not counted). */
    uint64_t live_handles;
} guild_host_state_v1_t;

/* Bound of the strings in guild_host_handle_info_v1_t, terminating NUL included. */
#define GUILD_HOST_ID_CAPACITY 136u
#define GUILD_HOST_VERSION_CAPACITY 136u

/* Which package version a handle runs, and whether it is still the current one. */
typedef struct guild_host_handle_info_v1_t {
    /* sizeof(guild_host_handle_info_v1_t), set by the caller. */
    uint32_t struct_size;
    /* 1 while the handle's version is the one the host serves; 0 once a refresh replaced, took
     * out or revoked it (or a switch away waits for this handle): resolve again to follow. */
    uint32_t is_current;
    /* The package and its semantic version, copied (NUL-terminated). */
    char package_id[GUILD_HOST_ID_CAPACITY];
    char package_version[GUILD_HOST_VERSION_CAPACITY];
} guild_host_handle_info_v1_t;

/*
 * The API table. Every entry is non-NULL. Later versions only append entries: read an entry
 * past this version's only when struct_size covers it.
 */
typedef struct guild_host_capi_v1_t {
    /* sizeof(guild_host_capi_v1_t) as the library knows it. */
    uint32_t struct_size;
    /* GUILD_HOST_CAPI_VERSION of the library. */
    uint32_t version;

    /*
     * Opens the store at options->store_dir as a runner and loads every enabled package (under
     * options->lock_file when given). A package that fails to load does not fail the open (see
     * *out_report, which may be NULL). GUILD_HOST_ERR_NOT_A_STORE when the path is not a store.
     */
    guild_host_code_t (*open)(const guild_host_open_options_v1_t* options, guild_host_t** out_host,
                              guild_host_open_report_v1_t* out_report, guild_host_error_t** out_error);
    /*
     * Stops the watcher, unloads every package and frees the host. Refused with
     * GUILD_HOST_ERR_BUSY, changing nothing, while handles the engine resolved through the
     * table operation_service copied are live (release them first) or when called from the
     * watch callback. Handles that loaded modules keep between calls do not count: each module
     * releases its own in its shutdown, which close runs. NULL is a no-op returning
     * GUILD_HOST_OK.
     */
    guild_host_code_t (*close)(guild_host_t* host, guild_host_error_t** out_error);
    /*
     * Copies the host's operation service table into *out_service (module_abi.h). The copy and
     * its user stay valid for calls until close; after close every call through it answers
     * GUILD_STATUS_ERR_STATE.
     */
    guild_host_code_t (*operation_service)(guild_host_t* host, guild_operation_service_v1_t* out_service,
                                           guild_host_error_t** out_error);
    /* Which package version the handle runs and whether it is current. */
    guild_host_code_t (*handle_info)(guild_host_t* host, guild_op_handle_t* handle,
                                     guild_host_handle_info_v1_t* out_info, guild_host_error_t** out_error);
    /*
     * Follows the store now: loads what it newly enables, takes out what it disabled, removed,
     * rolled back or revoked (handles into those versions keep running and answer is_current 0).
     * *out_report may be NULL.
     */
    guild_host_code_t (*refresh)(guild_host_t* host, guild_host_refresh_v1_t* out_report,
                                 guild_host_error_t** out_error);
    /*
     * Starts a background watcher that refreshes whenever the store commits (and at least every
     * fallback_ms, and when an owed change is due), calling on_change (may be NULL) as described
     * at guild_host_watch_fn. A second watch replaces the first. fallback_ms of 0 means 60000.
     */
    guild_host_code_t (*watch)(guild_host_t* host, uint32_t fallback_ms, guild_host_watch_fn on_change,
                               void* user, guild_host_error_t** out_error);
    /* Stops the watcher, waiting for a refresh in progress. No watcher is not an error. */
    guild_host_code_t (*unwatch)(guild_host_t* host, guild_host_error_t** out_error);
    /* Writes the pollable state. */
    guild_host_code_t (*state)(guild_host_t* host, guild_host_state_v1_t* out_state,
                               guild_host_error_t** out_error);

    /* The error's code; GUILD_HOST_OK for NULL. */
    guild_host_code_t (*error_code)(const guild_host_error_t* error);
    /* The error's message, valid until error_free; "" for NULL. */
    const char* (*error_message)(const guild_host_error_t* error);
    /* Frees an error; NULL is a no-op. */
    void (*error_free)(guild_host_error_t* error);
} guild_host_capi_v1_t;

/*
 * The API table of version `version`, or NULL when this library does not provide it. The table
 * is static: never free it. Callable from any thread at any time.
 */
const guild_host_capi_v1_t* guild_host_get_api(uint32_t version);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GUILD_HOST_H */
