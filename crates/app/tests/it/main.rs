//! Integration tests of `guild-host`.
//!
//! The fixtures (stores, keys, packages, the C test plugins, runs of the `guild` binary) are
//! guild-test-support's, shared with guild-cli's end-to-end tests of the `guild` command. The
//! tests here run `guild` only as a helper: the conformance check's child, a stand-in runner or
//! writer process, a tool that sets a store up or reads it back.

mod allocations;
mod c_face;
mod compat;
mod conformance;
mod convergence;
mod crash;
mod crash_quarantine;
mod cuda_tables;
mod draining;
mod examples;
mod experts;
mod fake_providers;
mod fleet;
mod gkmodule;
mod gpu;
mod host;
mod kept_state;
mod kill;
mod kill_modules;
mod live;
mod llama;
mod llama_isa;
mod lock_sync;
mod mocks;
mod module_deps;
mod numbering;
mod operations;
mod plan;
mod progress;
mod reconcile;
mod refusals;
mod registry;
mod rejections;
mod reshape;
mod runners;
mod service_safety;
mod signatures;
mod smoke;
mod streams;
mod taint_race;
mod trusted_state;

use guild_test_support::guild::Guild;

/// The `guild` binary, built from the current source once per run: this package has no such
/// binary for cargo to hand its tests.
pub fn guild() -> Guild {
    Guild::built()
}
