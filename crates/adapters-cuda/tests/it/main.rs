//! Integration tests of `guild-adapters-cuda`.
//!
//! - `no_driver`: what a machine without a CUDA driver gets (runs everywhere).
//! - `fake`: the adapter against the fake driver in a child process: every way of having no
//!   device, the stream marks, and this binary's own `gpu::` tests (runs everywhere with a C
//!   compiler).
//! - `gpu`: the adapter on a real device; each test skips with its reason where there is none,
//!   and fails instead with `REQUIRE_GPU=1`.

mod fake;
mod gpu;
mod no_driver;
