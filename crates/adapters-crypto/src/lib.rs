//! ECDSA P-256 / SHA-256 signing and verification, PEM keys, and the key material of the trust
//! store.

#![forbid(unsafe_code)]
