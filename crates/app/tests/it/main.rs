//! Integration tests of `guild-host`.

mod numbering;
mod smoke;
