//! The POSIX plugin loader: dlopen through libloading, the plugin entry point, the temporary
//! registration host that `init` registers through, and the host's owned copies of what it
//! registers.
//!
//! - [`DlopenLoader`] implements the [`PluginLoader`](guild_ports::loader::PluginLoader) port.
//! - [`DlopenLibrary`] is its [`LoadedLibrary`](guild_ports::loader::LoadedLibrary): dropping
//!   the last `Arc` runs the plugin's `shutdown` and closes the library.
//! - [`OwnedKernel`] and [`OwnedRunner`] are the providers behind `RegisteredKernel::provider`
//!   and `RegisteredRunner::provider`: the copied C descriptors, implementing the port's
//!   provider interface by forwarding to the plugin's callbacks.
//! - [`extensions`] describes every extension the host consumes in one table and negotiates
//!   each with one mechanism; [`ExtensionCopy`] is a negotiated table.
//! - [`termination`] lets a process stopped by a signal during a load say so in the crash
//!   ledger's record, so that a routine stop is not taken for a crash.
//! - [`supervise`] runs a plugin's code in a child process whose verdict comes over a private
//!   channel, and ends every process the child started.
//! - [`StagingHost`] is the registration host itself, usable on its own to drive registrations
//!   without a library (the tests do).
//!
//! Safety in one paragraph: a plugin's code is trusted once the app asks for it to be loaded
//! (the package is authenticated); what the host still guarantees is its own side of the ABI.
//! It reads plugin structs only within their declared sizes, strings only within a bound, chains
//! only with a cycle check and a length bound; it copies everything it keeps before the
//! registration call returns; its `host_context` is a session number, never a pointer, so a
//! stale call finds no session instead of freed memory; no panic leaves a callback; and the
//! library stays mapped until `shutdown` has returned.

pub mod extensions;
mod heap;
mod library;
mod loader;
mod owned;
mod staging;
pub mod supervise;
pub mod termination;

pub use extensions::{ExtensionContract, ExtensionCopy, CONSUMED_EXTENSIONS};
pub use library::DlopenLibrary;
pub use loader::{DlopenLoader, LoaderLogSink};
pub use owned::{OwnedKernel, OwnedRunner, MAX_CHAIN_LENGTH};
pub use staging::{LogSink, PluginLog, Staged, StagingConfig, StagingHost};
