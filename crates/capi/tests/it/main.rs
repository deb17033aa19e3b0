//! The C embedding API, tested the ways its users meet it: through the table from Rust, as a C
//! caller would use it (`api`); by the C and C++ test programs against the header and the built
//! library, with a writer in this process changing the store under them (`programs`); and the
//! header itself, compiled as C99 and C++17 and compared with the Rust mirror (`header`).

mod api;
mod fixture;
mod header;
mod programs;
#[path = "../common/records.rs"]
mod records;
