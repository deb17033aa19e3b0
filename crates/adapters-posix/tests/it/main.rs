//! Integration tests of the POSIX plugin loader's foundations against real C plugins.
//!
//! The plugins are built by `cargo xtask plugins` from `test-plugins/` against the installed SDK.
//! `cargo xtask test` says where through `GUILD_TEST_PLUGIN_DIR`; a plain `cargo test` looks in
//! `target/test-plugins/lib` and fails, naming the command to run, when the plugins are not there.

mod minimal_kernel;
mod support;
