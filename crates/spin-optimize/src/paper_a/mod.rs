//! Paper A: joint draft-length control and OFDMA uplink bandwidth allocation.
//!
//! [`scenario`] validates inputs and evaluates eq. 27; [`bandwidth`] holds Lemmas 1 and 3; [`homogeneous`] is
//! Theorem 1 and the Homo baseline; [`heterogeneous`] is Proposition 1 and Algorithm 1; [`exact`] is the integer
//! optimum of (P2); [`brute`] the exhaustive reference; [`baselines`] the paper's other comparisons;
//! [`simulate`] a seeded Monte-Carlo round simulator; [`testing`] seeded random scenarios.

pub mod bandwidth;
pub mod baselines;
pub mod brute;
pub mod exact;
pub mod heterogeneous;
pub mod homogeneous;
pub mod scenario;
pub mod simulate;
pub mod testing;

pub use scenario::{DeviceSpec, Optimality, Plan, Scenario, ScenarioDevice, ScenarioSpec};
