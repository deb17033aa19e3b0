//! The GGUF reader: files written by the `gguf` Python package, the hostile-file suite, and
//! generated mutations.

mod craft;
mod fuzz;
mod hostile;
mod python;
mod valid;
