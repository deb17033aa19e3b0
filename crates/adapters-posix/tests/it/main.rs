//! Integration tests of the POSIX plugin loader: real C plugins loaded through `DlopenLoader`
//! (one per outcome, plus the good plugin in depth), and the registration host driven directly
//! from Rust.
//!
//! The plugins are built by `cargo xtask plugins` from `test-plugins/` against the installed SDK.
//! `cargo xtask test` says where through `GUILD_TEST_PLUGIN_DIR`; a plain `cargo test` looks in
//! `target/test-plugins/lib` and fails, naming the command to run, when the plugins are not there.

mod extensions;
mod good_kernel;
mod minimal_kernel;
mod outcomes;
mod registration;
mod scan_module;
mod support;
