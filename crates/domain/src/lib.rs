//! The pure rules of the Guild kernel host.
//!
//! Everything here is a decision over plain data: parsing and canonicalising manifests, comparing
//! versions, validating the dependency graph, ranking operation providers, counting leases, and
//! judging the signed roots and policies a fleet of machines follows.
//! Adapters collect facts (bytes from disk, signatures, loaded descriptors) and the app carries out
//! what this crate decides. Nothing in this crate performs IO, spawns threads or uses `unsafe`,
//! which is what lets it be property-tested and fuzzed in isolation.

#![forbid(unsafe_code)]

pub mod canonical;
pub mod chunk_map;
pub mod claims;
pub mod dependency;
pub mod distribution;
pub mod fleet;
pub mod graph;
mod hex;
pub mod ids;
pub mod json;
pub mod kernel_registry;
pub mod lease;
pub mod lifecycle;
pub mod manifest;
pub mod manifest_facts;
pub mod operation;
pub mod params;
pub mod path;
pub mod platform;
pub mod store_log;
pub mod store_state;
pub mod trust;
pub mod vec_map;
pub mod version;
