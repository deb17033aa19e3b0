//! Integration tests of `guild-host`.

mod cli;
mod crash;
mod host;
mod kill;
mod mocks;
mod numbering;
mod operations;
mod refusals;
mod registry;
mod signatures;
mod smoke;
mod support;
