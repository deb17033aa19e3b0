/*
 * no_entry: a shared library built against the SDK that does not define guild_plugin_entry_v1,
 * like a stray library in a package or one built with the wrong entry name. It exports nothing at
 * all; `cargo xtask plugins` checks exactly that for this one library. A host must refuse it as
 * "not a Guild plugin" without calling anything in it.
 */
#include <guild/abi/kernel_abi.h>

/* Hidden by the SDK's visibility settings, so the dynamic symbol table stays empty. */
int no_entry_answer(void);

int no_entry_answer(void) {
    return 42;
}
