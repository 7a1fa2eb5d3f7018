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
        distribution_bits: 31744.0,
        verify_fixed_s: u(0.01, 0.08),
        verify_per_device_s: u(0.002, 0.02),
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

/// An "ordinary" paper-A scenario as a careless user might write one (the generator of issue 13's slow cases):
/// K ~ U{2..40}, α ~ U(0.5, 0.97), T^S ~ U(10, 60) ms, r ~ U(1, 12) bit/s/Hz, B ~ U(1, 40) MHz,
/// Q_tok = 1024·(16 + 18) bits (paper A), T_fix and T_lin one of paper A's two A100 fits (Llama-2-7B:
/// 22.68 ms, 12.72 ms; Qwen3.5-27B: 75.07 ms, 19.78 ms) scaled by U(0.8, 1.2), L_max = 25.
pub fn ordinary_scenario<R: Rng + ?Sized>(rng: &mut R) -> Scenario {
    let devices = rng.random_range(2..=40usize);
    ordinary_scenario_with(rng, devices, 25)
}

/// [`ordinary_scenario`] with a given device count and L_max.
pub fn ordinary_scenario_with<R: Rng + ?Sized>(rng: &mut R, devices: usize, max_draft_len: u32) -> Scenario {
    let (fix, lin) = if rng.random_bool(0.5) {
        (0.02268, 0.01272)
    } else {
        (0.07507, 0.01978)
    };
    let mut u = |lo: f64, hi: f64| lo + (hi - lo) * rng.random::<f64>();
    let spec = ScenarioSpec {
        bandwidth_hz: u(1e6, 4e7),
        distribution_bits: 1024.0 * (16.0 + 18.0),
        verify_fixed_s: fix * u(0.8, 1.2),
        verify_per_device_s: lin * u(0.8, 1.2),
        max_draft_len,
        min_draft_len: 1,
        devices: (0..devices)
            .map(|_| DeviceSpec {
                acceptance: u(0.5, 0.97),
                draft_token_s: u(0.01, 0.06),
                spectral_efficiency: u(1.0, 12.0),
            })
            .collect(),
    };
    Scenario::new(&spec).unwrap_or_else(|e| unreachable!("ordinary scenario invalid: {e}"))
}
