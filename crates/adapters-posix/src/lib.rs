//! The POSIX plugin loader: dlopen through libloading, the plugin entry symbol, init and shutdown.
//!
//! The loader port lands with the plugin-loading issue; this crate holds its dlopen adapter.
