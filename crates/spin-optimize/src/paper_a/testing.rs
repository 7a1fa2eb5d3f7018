//! Seeded random paper-A scenarios for tests and benchmarks (wide parameter ranges around the paper's setting).

use super::scenario::{DeviceSpec, Scenario, ScenarioSpec};
use rand::{Rng, RngExt};

/// A random valid scenario with `devices` devices and L_max = `max_draft_len`: α ~ U(0.5, 0.97),
/// T^S ~ U(5, 40) ms, r ~ U(1, 25) bit/s/Hz, B ~ U(1, 20) MHz, Q_tok = 31,744 bits, T_fix ~ U(10, 80) ms,
/// T_lin ~ U(2, 20) ms.
pub fn random_scenario<R: Rng + ?Sized>(rng: &mut R, devices: usize, max_draft_len: u32) -> Scenario {
    let mut u = |lo: f64, hi: f64| lo + (hi - lo) * rng.random::<f64>();
    let spec = ScenarioSpec {
        bandwidth_hz: u(1e6, 2e7),
        bits_per_draft_token: 31744.0,
        verify_fixed_s: u(0.01, 0.08),
        verify_per_draft_s: u(0.002, 0.02),
        max_draft_len,
        min_draft_len: 1,
        devices: (0..devices)
            .map(|_| DeviceSpec {
                acceptance: u(0.5, 0.97),
                draft_token_s: u(0.005, 0.04),
                spectral_efficiency: u(1.0, 25.0),
            })
            .collect(),
    };
    // Every field above is inside its domain by construction.
    Scenario::new(&spec).unwrap_or_else(|e| unreachable!("random scenario invalid: {e}"))
}
