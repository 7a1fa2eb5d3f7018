//! Multi-SPIN control: draft lengths, bandwidth, correction modes and power, by the papers' methods and better.
//!
//! `paper_a` holds joint draft-length control and OFDMA bandwidth allocation (paper A); `paper_b` holds
//! uplink/downlink correction with downlink power allocation and proactive draft control (paper B). This crate
//! knows latencies, rates and acceptance statistics only: never models, files or sockets.

mod engine;
pub mod error;
pub mod paper_a;
pub mod paper_b;
pub mod round;
pub mod unified;

pub use error::OptimizeError;
