//! A seeded Monte-Carlo simulator of Multi-SPIN rounds (paper A's Fig. 3 "empirical" curve): every round draws
//! fresh block fading, re-plans with a caller's planner, draws each device's accepted tokens position by position
//! (Bernoulli(α_k) until the first rejection, plus the one corrected or bonus token) and advances the clock by the
//! round's latency. Goodput is the renewal–reward rate Σ tokens / Σ time.

use super::scenario::{Plan, Scenario, ScenarioSpec};
use crate::OptimizeError;
use rand::{Rng, RngExt};
use spin_channel::paper_a::PaperAChannel;

/// What a simulation produced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MonteCarloRounds {
    /// Rounds simulated.
    pub rounds: usize,
    /// Tokens emitted by all devices together.
    pub tokens: u64,
    /// Total simulated time in seconds.
    pub time_s: f64,
    /// Σ tokens / Σ time (tokens per second).
    pub empirical_goodput: f64,
    /// Mean over rounds of eq. 27 evaluated at each round's plan (the formula's prediction per round).
    pub mean_formula_goodput: f64,
}

/// Number of tokens one round emits for a device: 1 + the accepted prefix of `draft_len` Bernoulli(α) draws.
pub fn sample_round_tokens<R: Rng + ?Sized>(rng: &mut R, alpha: f64, draft_len: u32) -> u32 {
    let mut n = 1;
    for _ in 0..draft_len {
        if rng.random::<f64>() < alpha {
            n += 1;
        } else {
            break;
        }
    }
    n
}

/// Simulates `rounds` rounds. `base` gives everything but the spectral efficiencies, which are redrawn every round
/// from `channel` with the devices' mean gains `mean_gains`; `planner` chooses each round's plan.
pub fn simulate_rounds<R, P>(
    rng: &mut R,
    base: &ScenarioSpec,
    mean_gains: &[f64],
    channel: &PaperAChannel,
    rounds: usize,
    mut planner: P,
) -> Result<MonteCarloRounds, OptimizeError>
where
    R: Rng + ?Sized,
    P: FnMut(&Scenario) -> Result<Plan, OptimizeError>,
{
    if mean_gains.len() != base.devices.len() {
        return Err(OptimizeError::Invalid {
            field: "mean_gains".into(),
            reason: format!("{} gains for {} devices", mean_gains.len(), base.devices.len()),
        });
    }
    if rounds == 0 {
        return Err(OptimizeError::Invalid {
            field: "rounds".into(),
            reason: "must be at least 1".into(),
        });
    }
    let mut spec = base.clone();
    let (mut tokens, mut time, mut formula) = (0u64, 0.0, 0.0);
    for _ in 0..rounds {
        let rates =
            channel
                .draw_spectral_efficiencies(rng, mean_gains)
                .map_err(|e| OptimizeError::Invalid {
                    field: "channel".into(),
                    reason: e.to_string(),
                })?;
        for (d, r) in spec.devices.iter_mut().zip(rates) {
            // A deep fade can give r = 0 exactly in floating point; keep the device schedulable.
            d.spectral_efficiency = r.max(1e-9);
        }
        let scenario = Scenario::new(&spec)?;
        let plan = planner(&scenario)?;
        for (d, &l) in scenario.devices.iter().zip(&plan.draft_lengths) {
            tokens += u64::from(sample_round_tokens(rng, d.acceptance, l));
        }
        time += plan.round_latency_s;
        formula += plan.goodput_tokens_per_s;
    }
    Ok(MonteCarloRounds {
        rounds,
        tokens,
        time_s: time,
        empirical_goodput: tokens as f64 / time,
        mean_formula_goodput: formula / rounds as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper_a::homogeneous::homo;
    use crate::paper_a::scenario::DeviceSpec;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;
    use spin_core::expected_accepted;

    #[test]
    fn round_tokens_have_the_truncated_geometric_mean() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        for &(alpha, l) in &[(0.739, 6u32), (0.93, 12), (0.5, 1)] {
            let n = 100_000;
            let total: u64 = (0..n)
                .map(|_| u64::from(sample_round_tokens(&mut rng, alpha, l)))
                .sum();
            let mean = total as f64 / f64::from(n);
            let expect = expected_accepted(alpha, l);
            // Standard error ≤ sqrt(Var)/sqrt(n) < 0.02 here; allow 4σ.
            assert!(
                (mean - expect).abs() < 0.04,
                "α={alpha} L={l}: {mean} vs {expect}"
            );
        }
    }

    #[test]
    fn simulation_tracks_the_formula_and_replays() {
        let base = ScenarioSpec {
            bandwidth_hz: 1e7,
            distribution_bits: 34816.0,
            verify_fixed_s: 0.02268,
            verify_per_device_s: 0.01272,
            max_draft_len: 25,
            min_draft_len: 1,
            devices: vec![
                DeviceSpec {
                    acceptance: 0.739,
                    draft_token_s: 0.02,
                    spectral_efficiency: 1.0
                };
                5
            ],
        };
        let channel = PaperAChannel {
            mean_gain_lo: 0.2,
            mean_gain_hi: 0.5,
            noise_w: 1e-10,
            ul_power_w: 0.01,
        };
        let gains = vec![0.2, 0.3, 0.35, 0.4, 0.5];
        let run = |seed| {
            simulate_rounds(
                &mut ChaCha8Rng::seed_from_u64(seed),
                &base,
                &gains,
                &channel,
                4000,
                homo,
            )
            .unwrap()
        };
        let a = run(1);
        assert_eq!(a, run(1));
        let rel = (a.empirical_goodput - a.mean_formula_goodput).abs() / a.mean_formula_goodput;
        assert!(rel < 0.03, "{a:?}");
    }
}
