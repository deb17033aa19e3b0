//! The C test plugins (test-plugins/, built by `cargo xtask plugins`) and the package specs the
//! tests make of them.
//!
//! The libraries are read from `GUILD_TEST_PLUGIN_DIR` when it is set (`cargo xtask test` sets
//! it), else from `target/test-plugins/lib`; a missing library fails the test with the command
//! that builds it.

use std::path::PathBuf;

use crate::Spec;

/// The scan module's inclusive scan on the CPU.
pub const INCLUSIVE: &str = "example.scan.inclusive.cpu";
/// The scan module's exclusive scan on the CPU.
pub const EXCLUSIVE: &str = "example.scan.exclusive.cpu";
/// The second scan module's inclusive scan (test-plugins scan_module_alt).
pub const ALT_INCLUSIVE: &str = "example.scan_alt.inclusive.cpu";
/// The second scan module's exclusive scan.
pub const ALT_EXCLUSIVE: &str = "example.scan_alt.exclusive.cpu";
/// The package id the scan module is built as ([`scan_spec`]).
pub const SCAN_PACKAGE: &str = "example.scan";
/// The operation the inclusive scans provide.
pub const INCLUSIVE_OP: &str = "example.sequence.inclusive_scan";
/// The operation the exclusive scans provide.
pub const EXCLUSIVE_OP: &str = "example.sequence.exclusive_scan";
/// The operation of the scan module's dependent (test-plugins scan_dependent).
pub const TOTAL_OP: &str = "example.sequence.scan_then_total";

/// The directory the C test plugins are read from.
pub fn plugin_dir() -> PathBuf {
    std::env::var_os("GUILD_TEST_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-plugins/lib")
        })
}

/// The bytes of the C test plugin `lib<name>.so`.
pub fn plugin_library(name: &str) -> Vec<u8> {
    let path = plugin_dir().join(format!("lib{name}.so"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build the C test plugins first with `cargo xtask plugins`",
            path.display()
        )
    })
}

/// The scan module (test-plugins scan_module) as `example.scan` at `version`.
pub fn scan_spec(version: &str) -> Spec {
    let mut spec = Spec::module("example.scan", version).library(&plugin_library("scan_module"));
    spec.provided_ops = vec![INCLUSIVE.into(), EXCLUSIVE.into()];
    spec
}

/// The second scan module (test-plugins scan_module_alt) as `example.scan_alt` at `version`.
pub fn alt_spec(version: &str) -> Spec {
    let mut spec =
        Spec::module("example.scan_alt", version).library(&plugin_library("scan_module_alt"));
    spec.provided_ops = vec![ALT_INCLUSIVE.into(), ALT_EXCLUSIVE.into()];
    spec
}

/// Module `id` 1.0.0 whose library is the test plugin `library`, kept under its own name
/// (`lib/lib<library>.so`), providing `ops`.
pub fn plugin_module(id: &str, library: &str, ops: &[&str]) -> Spec {
    let mut spec = Spec::module(id, "1.0.0").library(&plugin_library(library));
    spec.files[0].0 = format!("lib/lib{library}.so");
    spec.provided_ops = ops.iter().map(|s| s.to_string()).collect();
    spec
}

/// One build of test-plugins/faulty_scan (`faulty_<kind>`: `none` is the correct one), as the
/// module `example.faulty-<kind>` providing `example.faulty.<kind>`.
pub fn faulty(kind: &str) -> Spec {
    plugin_module(
        &format!("example.faulty-{}", kind.replace('_', "-")),
        &format!("faulty_{kind}"),
        &[&format!("example.faulty.{kind}")],
    )
}
