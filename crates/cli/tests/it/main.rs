//! End-to-end tests of the `guild` command: the binary run as an operator or a publisher runs
//! it, judged by what it prints, its exit code and what it leaves in a store.
//!
//! The binary is the one cargo builds for these tests (`CARGO_BIN_EXE_guild`); the fixtures
//! (stores, keys, packages, the C test plugins) are guild-test-support's, shared with
//! guild-host's tests. The tests with real plugins read `target/test-plugins/lib` (or
//! `GUILD_TEST_PLUGIN_DIR`): run `cargo xtask plugins` first.

mod check;
mod cli;
mod cli_snapshots;
mod fleet;
mod fleet_eight;
mod fleet_requirements;
mod fleet_thousand;
mod key_rotation;
mod oci;
mod publication_bounds;
mod registration;
mod sync;
mod trust_taint;

use guild_test_support::guild::Guild;

/// The `guild` binary under test.
pub fn guild() -> Guild {
    Guild::new(env!("CARGO_BIN_EXE_guild"))
}
