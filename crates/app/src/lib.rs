//! `guild-host`: the host that inference runners embed to load signed native kernel plugins and
//! operation modules.
//!
//! This crate is the composition root: it is the only place that names concrete adapters. The
//! package manager, kernel registry, operation service and lifecycle transaction arrive with the
//! issues that build them.

#![forbid(unsafe_code)]
