//! Integration tests of guild-adapters-crypto: signatures, keys, key files, and
//! interoperability with the `openssl` command line (which these tests require).

mod backends;
mod fleet;
mod key_files;
mod keys;
mod openssl_interop;
mod signatures;
mod support;
