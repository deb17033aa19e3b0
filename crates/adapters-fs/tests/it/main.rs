//! Integration tests of `guild-adapters-fs`: hostile archives and the durable store.

mod archive;
mod store;
