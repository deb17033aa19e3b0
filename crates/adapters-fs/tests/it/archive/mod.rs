//! GKPK v1 archives and directory sources: hostile packages, valid round trips, and generated
//! mutations.

mod bounds;
mod craft;
mod fuzz;
mod hostile;
mod roundtrip;
