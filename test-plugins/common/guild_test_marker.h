/*
 * Marker files for the C test plugins: a way for a plugin to tell the Rust tests that something
 * happened at a moment when no host callback can carry the news (shutdown, or a call made after
 * init through a host table the plugin should not have kept).
 *
 * The tests set GUILD_TEST_MARKER_DIR once, before any plugin is loaded. A plugin appends one line
 * to <dir>/<plugin>.log per event; without the variable it writes nothing, so the plugins behave
 * the same outside the tests. Only the C99 standard library is used.
 */
#ifndef GUILD_TEST_MARKER_H
#define GUILD_TEST_MARKER_H

#include <stdio.h>
#include <stdlib.h>

/* Appends `line` and a newline to $GUILD_TEST_MARKER_DIR/<plugin>.log, if the variable is set. */
static inline void guild_test_marker(const char* plugin, const char* line) {
    char path[1024];
    FILE* file;
    int written;
    const char* dir = getenv("GUILD_TEST_MARKER_DIR");
    if (dir == NULL || plugin == NULL || line == NULL) {
        return;
    }
    written = snprintf(path, sizeof path, "%s/%s.log", dir, plugin);
    if (written < 0 || (size_t)written >= sizeof path) {
        return;
    }
    file = fopen(path, "a");
    if (file == NULL) {
        return;
    }
    (void)fputs(line, file);
    (void)fputc('\n', file);
    (void)fclose(file);
}

#endif /* GUILD_TEST_MARKER_H */
