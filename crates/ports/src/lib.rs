//! Port traits of the Guild kernel host, named by role, each with its own error type.
//!
//! The traits (package source, signature verifier, package store, plugin loader, device runtime)
//! arrive with the issues that need them; in-memory fakes live beside them.

#![forbid(unsafe_code)]
