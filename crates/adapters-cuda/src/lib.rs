//! The CUDA device runtime: streams, events, capabilities and graph capture, with the driver loaded
//! at run time so that the crate builds and reports "no device" without a CUDA toolkit.
