//! Helpers shared by the tests and benches.
