//! Integration tests of `guild-domain`, one module per feature.

mod fleet;
mod graph;
mod manifest;
mod operation;
mod store_log;
mod trust;
