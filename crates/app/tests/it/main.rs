//! Integration tests of `guild-host`.

mod numbering;
