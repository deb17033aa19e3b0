//! Integration tests of `guild-host`.

mod c_face;
mod cli;
mod cli_snapshots;
mod crash;
mod draining;
mod examples;
mod experts;
mod gkmodule;
mod gpu;
mod host;
mod kill;
mod kill_modules;
mod mocks;
mod module_deps;
mod numbering;
mod operations;
mod progress;
mod refusals;
mod registry;
mod rejections;
mod runners;
mod signatures;
mod smoke;
mod streams;
mod support;
