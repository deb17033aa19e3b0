//! Integration tests of `guild-adapters-fs`: hostile archives, the durable store and GGUF
//! model files.

mod archive;
mod gguf;
mod store;
