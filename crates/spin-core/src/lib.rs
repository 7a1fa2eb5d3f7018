//! Exact speculative sampling for many devices: acceptance statistics, distributions, verification.
//!
//! This crate is a leaf of the workspace: it knows token ids and probability vectors, never models, sockets or
//! files, and every random draw comes in through a caller's `&mut impl Rng`, so results replay from a seed.

pub mod error;
pub mod stats;

pub use error::CoreError;
pub use stats::{AcceptanceRate, expected_accepted, accepted_pmf};
