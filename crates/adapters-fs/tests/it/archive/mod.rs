//! GKPK v1 archives and directory sources: hostile packages, valid round trips, and generated
//! mutations.

mod craft;
mod fuzz;
mod hostile;
mod roundtrip;
