//! The controller in the loop: every round it plans draft lengths (and, for paper A, bandwidth shares) with
//! spin-optimize's public schemes from what the server knows at that moment: online acceptance estimates with a
//! prior, the round's channel, the per-device drafting times and the T_ver fit. After verification it picks the
//! correction mode and DL power of every rejected device (paper B's reactive step). The `unified` scheme plans draft
//! lengths, uplink shares and each device's payload (distributions or pairs) jointly with spin-optimize's unified
//! planner (docs/unified.md), in a fast configuration (see [`unified_options`]).

use crate::error::Result;
use crate::link::LinkConfig;
use serde::Serialize;
use spin_optimize::paper_b::{ModeScheme, Objective};
use spin_optimize::round::{
    self, CorrectionPolicy, CorrectionSplit, Family, PayloadPolicy, Radio, Round, RoundDevice, RoundPlan,
    RoundSpec, TokenPayload,
};
use spin_optimize::unified;

/// A round-planning scheme: spin-optimize's one scheme vocabulary. A server plans with
/// [`Scheme::PER_ROUND`] (parse with [`Scheme::parse_per_round`]); the exhaustive references (`brute-force`,
/// `exhaustive`) are refused, they are for small offline instances. By family: paper A's drafts go up with their
/// distributions over an OFDMA split; paper B's send token–probability pairs and the rejected devices are corrected
/// UL or DL; the unified planner chooses per device and round, with Lemma-3 uplink shares and UL/DL correction of
/// the rejected pair-senders.
pub use spin_optimize::round::Scheme;

/// What the controller knows about one active device when it plans.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceView {
    /// Estimated acceptance rate α̂_k ∈ (0, 1).
    pub acceptance: f64,
    /// Estimated drafting time per token in seconds (> 0).
    pub draft_token_s: f64,
    /// The round's power gain g_k.
    pub gain: f64,
    /// The longest draft the device's token budget allows.
    pub max_draft_len: u32,
}

/// Settings of the controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControllerConfig {
    /// The scheme.
    pub scheme: Scheme,
    /// Paper B's reactive mode policy.
    pub modes: ModeScheme,
    /// L_max / γ_max.
    pub max_draft_len: u32,
    /// Fixed BW&L's length.
    pub fixed_draft_len: u32,
    /// Bits per drafted token Q_tok (paper A) or per exchanged distribution D (paper B).
    pub distribution_bits: f64,
    /// Bits of one (token, probability) pair on the uplink, ⌈log₂V⌉ + 32 (the unified planner charges them).
    pub pair_bits: f64,
    /// SAA samples for paper B's planners.
    pub saa_samples: u32,
    /// Where planning must end on the wall clock (a server on the real clock): `best`'s exhaustive step and the
    /// unified branch and bound stop there with their best plan so far ([`unified::Options::deadline`]). None:
    /// planning is unbounded in time and reproducible.
    pub plan_deadline: Option<std::time::Instant>,
}

/// The smallest and largest α̂ handed to the planners (their scenarios require α ∈ (0, 1)).
pub const ALPHA_RANGE: (f64, f64) = (0.01, 0.99);

/// α̂ = (n₀·α₀ + n·ā) / (n₀ + n): the ratio estimator's mean ā over n tokens shrunk towards the prior α₀ with
/// weight n₀ tokens, then kept inside [`ALPHA_RANGE`].
pub fn alpha_with_prior(mean: f64, samples: u64, prior: f64, prior_weight: f64) -> f64 {
    alpha_with_prior_weight(mean, samples as f64, prior, prior_weight)
}

/// [`alpha_with_prior`] with a weighted sample count n ≥ 0 (evidence that ages, as a server's does).
pub fn alpha_with_prior_weight(mean: f64, samples: f64, prior: f64, prior_weight: f64) -> f64 {
    let n = samples;
    let a = if n > 0.0 {
        (prior_weight * prior + n * mean) / (prior_weight + n)
    } else {
        prior
    };
    a.clamp(ALPHA_RANGE.0, ALPHA_RANGE.1)
}

/// The payload each family's system sends per drafted token: paper A's server receives distributions, paper B's
/// pairs; the unified planner chooses per device.
pub fn payload_policy(scheme: Scheme) -> PayloadPolicy {
    match scheme.family() {
        Family::PaperA => PayloadPolicy::Distribution,
        Family::PaperB => PayloadPolicy::Pair,
        Family::Unified => PayloadPolicy::Choose,
    }
}

/// The verification time the controller plans with: T_ver(K, L) = T_fix + K·T_lin + T_tok·Σ L_k, K devices in the
/// batch with drafts of L_k tokens (a pass of Σ (L_k + 1) positions). T_tok = 0 is both papers' model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct VerifyModel {
    /// T_fix in seconds.
    pub fixed_s: f64,
    /// T_lin in seconds per device in the batch.
    pub per_device_s: f64,
    /// T_tok in seconds per drafted token in the batch.
    pub per_draft_token_s: f64,
}

impl VerifyModel {
    /// The papers' model T_fix + K·T_lin (T_tok = 0).
    pub fn affine(fixed_s: f64, per_device_s: f64) -> VerifyModel {
        VerifyModel {
            fixed_s,
            per_device_s,
            per_draft_token_s: 0.0,
        }
    }

    /// T_ver of a pass over `devices` drafts holding `drafted` tokens in all (spin-optimize's
    /// [`spin_optimize::round::verify_seconds`], the formula the planners price the round with).
    pub fn seconds(&self, devices: usize, drafted: u64) -> f64 {
        spin_optimize::round::verify_seconds(
            self.fixed_s,
            self.per_device_s,
            self.per_draft_token_s,
            devices,
            drafted,
        )
    }
}

/// The guess before any pass is timed: 10 ms plus 1 ms per device.
pub const UNTIMED_VERIFY: VerifyModel = VerifyModel {
    fixed_s: 0.01,
    per_device_s: 0.001,
    per_draft_token_s: 0.0,
};

/// One timed verification pass: devices in the batch, drafted tokens in all, seconds.
pub type VerifyPoint = (usize, u64, f64);

/// The round the controller plans for `devices` with T_ver(K, L) of `verify`: one block-fading gain per device
/// serves both directions (reciprocity, as paper B), the draft uplink's spectral efficiency is the link's at that
/// gain, L ∈ {0..L_max}, pairs are charged `pair_bits`, and the payload policy is the scheme's system's
/// ([`payload_policy`]).
pub fn build_round(
    cfg: &ControllerConfig,
    link: &LinkConfig,
    devices: &[DeviceView],
    verify: &VerifyModel,
    seed: u64,
) -> Result<Round> {
    let spec = RoundSpec {
        bandwidth_hz: link.bandwidth_hz,
        verify_fixed_s: verify.fixed_s,
        verify_per_device_s: verify.per_device_s,
        verify_per_draft_token_s: verify.per_draft_token_s,
        min_draft_len: 0,
        max_draft_len: cfg.max_draft_len.max(1),
        radio: Radio {
            ul_power_w: link.ul_power_w,
            dl_power_w: link.dl_power_w,
            noise_psd_server_w_per_hz: link.noise_psd_server_w_per_hz,
            noise_psd_device_w_per_hz: link.noise_psd_device_w_per_hz,
        },
        payload: TokenPayload {
            distribution_bits: cfg.distribution_bits,
            pair_bits: cfg.pair_bits,
            policy: payload_policy(cfg.scheme),
        },
        correction_split: CorrectionSplit::Equal,
        saa_samples: cfg.saa_samples,
        seed,
        devices: devices
            .iter()
            .map(|d| {
                Ok(RoundDevice {
                    acceptance: d.acceptance,
                    draft_token_s: d.draft_token_s,
                    spectral_efficiency: link.spectral_efficiency(d.gain)?,
                    uplink_gain: d.gain,
                    downlink_gain: d.gain,
                })
            })
            .collect::<Result<_>>()?,
    };
    Ok(Round::new(spec)?)
}

/// Plans one round for `devices` (in the order given) with T_ver(K, L) of `verify`: one [`Round`]
/// ([`build_round`]), planned by spin-optimize's planner of the scheme ([`round::planner()`] with
/// [`unified_options`]; a paper's plan is capped where T_tok makes shorter drafts pay); its `rate_tokens_per_s` is
/// the controller's predicted goodput at its own estimates. The token budget then caps each device's draft (the
/// planners do not know it).
pub fn plan_round(
    cfg: &ControllerConfig,
    link: &LinkConfig,
    devices: &[DeviceView],
    verify: &VerifyModel,
    seed: u64,
) -> Result<RoundPlan> {
    let options = unified::Options {
        deadline: cfg.plan_deadline,
        ..unified_options(cfg.modes)
    };
    if devices.is_empty() {
        return Ok(RoundPlan::idle(cfg.scheme, options.correction));
    }
    if cfg.scheme.is_offline_reference() {
        // The type admits them; a server does not run them (the same error as parsing one).
        Scheme::parse_per_round(cfg.scheme.name())?;
    }
    let r = build_round(cfg, link, devices, verify, seed)?;
    let mut plan = round::planner(cfg.scheme, &options, cfg.fixed_draft_len).plan(&r)?;
    for (l, d) in plan.draft_lengths.iter_mut().zip(devices) {
        *l = (*l).min(d.max_draft_len);
    }
    Ok(plan)
}

/// The planners' options in the loop: the rate objective, the round's outcome samples (exact enumeration up to
/// 4096 outcomes, for the search and for scoring every scheme's plan), the server's mode rule (brute-force mode
/// selection is a test reference that gives the optimal modes), and a search cut down for a per-round budget:
/// paper B's `best` seed and pair moves only up to 16 devices, and branch and bound only on spaces of at most 2^16
/// points (so K ≤ 4 at L_max = 8 proves optimality; larger rounds get the seeded coordinate search).
pub fn unified_options(modes: ModeScheme) -> unified::Options {
    unified::Options {
        objective: Objective::Rate,
        expectation: unified::Expectation::Auto { limit: 4096 },
        correction: CorrectionPolicy {
            modes: match modes {
                ModeScheme::BruteForce => ModeScheme::Optimal,
                m => m,
            },
            split: CorrectionSplit::Equal,
        },
        paper_b_best_max_devices: 16,
        exact_space_limit: 1 << 16,
        exact_node_limit: 20_000,
        pair_moves_max_devices: 16,
        deadline: None,
    }
}

/// The least-squares fit of T_ver(K, L) = T_fix + K·T_lin + T_tok·Σ L_k over timed passes, kept as its sufficient
/// statistics (the 3×3 Gram matrix of the terms (1, K, Σ L), their products with the seconds, and the count), so
/// that adding a pass and refitting cost the same after a million rounds as after one, and hold no list of passes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VerifyFit {
    /// Σ x xᵀ over the passes, x = (1, K, Σ L).
    gram: [[f64; 3]; 3],
    /// Σ x·seconds.
    cross: [f64; 3],
    /// Passes added.
    passes: usize,
}

impl VerifyFit {
    /// A fit of `points`.
    pub fn of(points: &[VerifyPoint]) -> VerifyFit {
        let mut f = VerifyFit::default();
        points.iter().for_each(|&p| f.add(p));
        f
    }

    /// Adds one timed pass.
    pub fn add(&mut self, (devices, drafted, seconds): VerifyPoint) {
        let x = [1.0, devices as f64, drafted as f64];
        for i in 0..3 {
            for j in 0..3 {
                self.gram[i][j] += x[i] * x[j];
            }
            self.cross[i] += x[i] * seconds;
        }
        self.passes += 1;
    }

    /// Passes added.
    pub fn passes(&self) -> usize {
        self.passes
    }

    /// The fit with every coefficient ≥ 0: of the least-squares fits on each subset of the three terms whose
    /// coefficients all come out non-negative, the one with the smallest squared error (the exact non-negative
    /// least squares for three unknowns; the error of coefficients β on a subset is the seconds' own Σ y², the same
    /// for every subset, less 2β·c plus βᵀGβ, so it is compared without it). A subset whose terms the passes cannot
    /// tell apart (the same K everywhere, or Σ L always a multiple of K) is skipped, and on a tie the subset listed
    /// first wins: T_fix alone first, so with one distinct K and no drafts the mean is T_fix. None without passes.
    pub fn model(&self) -> Option<VerifyModel> {
        if self.passes == 0 {
            return None;
        }
        // Subsets of {T_fix, T_lin, T_tok} as bit masks, the simplest first.
        const SUBSETS: [u8; 7] = [0b001, 0b011, 0b101, 0b111, 0b010, 0b100, 0b110];
        let mut best: Option<([f64; 3], f64)> = None;
        for mask in SUBSETS {
            let cols: Vec<usize> = (0..3).filter(|&j| mask >> j & 1 == 1).collect();
            let n = cols.len();
            let mut a = [[0.0f64; 4]; 3];
            for (i, &ci) in cols.iter().enumerate() {
                for (j, &cj) in cols.iter().enumerate() {
                    a[i][j] = self.gram[ci][cj];
                }
                a[i][n] = self.cross[ci];
            }
            let Some(beta) = solve(&mut a, n) else {
                continue;
            };
            if beta[..n].iter().any(|&b| b < 0.0) {
                continue;
            }
            let mut coef = [0.0; 3];
            for (i, &c) in cols.iter().enumerate() {
                coef[c] = beta[i];
            }
            // Squared error less Σ y²: βᵀGβ − 2β·c.
            let mut err = 0.0;
            for i in 0..3 {
                err -= 2.0 * coef[i] * self.cross[i];
                for j in 0..3 {
                    err += coef[i] * self.gram[i][j] * coef[j];
                }
            }
            // Strictly better beyond rounding (on the scale of the terms), so a tie keeps the simpler fit.
            let scale: f64 = (0..3).map(|i| (coef[i] * self.cross[i]).abs()).sum();
            if best.is_none_or(|(_, e)| err < e - 1e-9 * scale) {
                best = Some((coef, err));
            }
        }
        best.map(|(c, _)| VerifyModel {
            fixed_s: c[0],
            per_device_s: c[1],
            per_draft_token_s: c[2],
        })
    }
}

/// [`VerifyFit::model`] of `points`.
pub fn fit_verify(points: &[VerifyPoint]) -> Option<VerifyModel> {
    VerifyFit::of(points).model()
}

/// Solves the n×n system in `a` (augmented, column n the right-hand side) by Gaussian elimination with partial
/// pivoting; None when a pivot vanishes against the matrix's scale (terms the points cannot tell apart).
fn solve(a: &mut [[f64; 4]; 3], n: usize) -> Option<[f64; 3]> {
    let scale = (0..n).map(|i| a[i][i].abs()).fold(0.0, f64::max);
    if scale == 0.0 {
        return None;
    }
    for c in 0..n {
        let p = (c..n).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))?;
        a.swap(c, p);
        if a[c][c].abs() <= 1e-9 * scale {
            return None;
        }
        let pivot = a[c];
        for row in a.iter_mut().take(n).skip(c + 1) {
            let f = row[c] / pivot[c];
            for (x, p) in row[c..=n].iter_mut().zip(&pivot[c..=n]) {
                *x -= f * p;
            }
        }
    }
    let mut x = [0.0; 3];
    for c in (0..n).rev() {
        let s: f64 = (c + 1..n).map(|k| a[c][k] * x[k]).sum();
        x[c] = (a[c][n] - s) / a[c][c];
    }
    Some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_fit_recovers_a_line_and_prior_shrinks() {
        let pts: Vec<VerifyPoint> = (1..6).map(|k| (k, 0, 0.02 + 0.003 * k as f64)).collect();
        let m = fit_verify(&pts).unwrap();
        assert!((m.fixed_s - 0.02).abs() < 1e-12 && (m.per_device_s - 0.003).abs() < 1e-12);
        assert_eq!(m.per_draft_token_s, 0.0);
        let m = fit_verify(&[(3, 0, 0.5), (3, 0, 0.7)]).unwrap();
        assert!((m.fixed_s - 0.6).abs() < 1e-12, "{m:?}");
        assert_eq!((m.per_device_s, m.per_draft_token_s), (0.0, 0.0));
        assert_eq!(alpha_with_prior(0.0, 0, 0.7, 8.0), 0.7);
        assert!((alpha_with_prior(0.5, 8, 0.7, 8.0) - 0.6).abs() < 1e-12);
        assert_eq!(alpha_with_prior(1.0, 1000, 0.7, 8.0), 0.99);
        assert!(
            Scheme::parse_per_round("nope")
                .unwrap_err()
                .to_string()
                .starts_with("scheme")
        );
        assert_eq!(
            Scheme::PER_ROUND.map(Scheme::name),
            [
                "exact",
                "paper-alg1",
                "homo",
                "uni-bw",
                "fixed",
                "best",
                "greedy",
                "uniform",
                "comp-only",
                "unified",
            ]
        );
        for n in Scheme::PER_ROUND.map(Scheme::name) {
            assert_eq!(Scheme::parse_per_round(n).unwrap().name(), n);
        }
        for n in ["brute-force", "exhaustive"] {
            let e = Scheme::parse_per_round(n).unwrap_err().to_string();
            assert!(
                e.starts_with("scheme") && e.contains("not a per-round planner"),
                "{e}"
            );
        }
    }

    #[test]
    fn verify_fit_separates_devices_from_drafted_tokens_and_stays_non_negative() {
        // A plane through passes of K = 1..4 devices drafting 0..8 tokens each.
        let plane = VerifyModel {
            fixed_s: 0.003,
            per_device_s: 0.0004,
            per_draft_token_s: 0.0006,
        };
        let pts: Vec<VerifyPoint> = (1..=4usize)
            .flat_map(|k| (0..=8u64).map(move |l| (k, k as u64 * l)))
            .map(|(k, d)| (k, d, plane.seconds(k, d)))
            .collect();
        let m = fit_verify(&pts).unwrap();
        for (got, want) in [
            (m.fixed_s, plane.fixed_s),
            (m.per_device_s, plane.per_device_s),
            (m.per_draft_token_s, plane.per_draft_token_s),
        ] {
            assert!((got - want).abs() < 1e-12, "{m:?}");
        }
        // Times that fall with K: T_lin would be negative, so it is 0 and the rest is refitted.
        let falling = [(1, 0, 0.010), (2, 0, 0.009), (1, 4, 0.014), (2, 8, 0.017)];
        let m = fit_verify(&falling).unwrap();
        assert_eq!(m.per_device_s, 0.0, "{m:?}");
        assert!(m.fixed_s > 0.0 && m.per_draft_token_s > 0.0, "{m:?}");
        // Every draft the same length: Σ L is K·L, so T_lin and T_tok cannot be told apart and the simpler
        // fit stands; its error is no larger than any other non-negative fit's.
        let same: Vec<VerifyPoint> = (1..=4)
            .map(|k| (k, 3 * k as u64, 0.01 + 0.002 * k as f64))
            .collect();
        let m = fit_verify(&same).unwrap();
        assert!((m.seconds(3, 9) - 0.016).abs() < 1e-12, "{m:?}");
        assert_eq!(fit_verify(&[]), None);
        // Added one pass at a time, the running sums give the fit of the whole list.
        let mut fit = VerifyFit::default();
        pts.iter().for_each(|&p| fit.add(p));
        assert_eq!((fit.passes(), fit.model()), (pts.len(), fit_verify(&pts)));
    }

    /// L_max 8, Fixed BW&L at 4, optimal modes, 41-bit pairs, 64 SAA samples, no deadline.
    fn test_config(scheme: Scheme, distribution_bits: f64) -> ControllerConfig {
        ControllerConfig {
            scheme,
            modes: ModeScheme::Optimal,
            max_draft_len: 8,
            fixed_draft_len: 4,
            distribution_bits,
            pair_bits: 41.0,
            saa_samples: 64,
            plan_deadline: None,
        }
    }

    #[test]
    fn a_costly_drafted_token_makes_every_scheme_draft_less() {
        let link = LinkConfig::paper_b();
        let devs: Vec<DeviceView> = (0..3)
            .map(|k| DeviceView {
                acceptance: 0.6 + 0.1 * k as f64,
                draft_token_s: 0.0005,
                gain: 1e-11 * (k + 1) as f64,
                max_draft_len: 100,
            })
            .collect();
        for scheme in Scheme::PER_ROUND {
            let cfg = test_config(scheme, 41.0);
            let cheap = plan_round(&cfg, &link, &devs, &VerifyModel::affine(0.004, 0.0005), 1).unwrap();
            let costly = VerifyModel {
                per_draft_token_s: 0.05,
                ..VerifyModel::affine(0.004, 0.0005)
            };
            let p = plan_round(&cfg, &link, &devs, &costly, 1).unwrap();
            let sum = |l: &[u32]| l.iter().sum::<u32>();
            if scheme == Scheme::Fixed {
                assert_eq!(p.draft_lengths, cheap.draft_lengths, "fixed keeps its length");
            } else {
                assert!(
                    sum(&cheap.draft_lengths) > 0,
                    "{scheme}: {:?}",
                    cheap.draft_lengths
                );
                assert_eq!(sum(&p.draft_lengths), 0, "{scheme}: {:?}", p.draft_lengths);
            }
            let want = costly.seconds(3, u64::from(sum(&p.draft_lengths)));
            assert!((p.verify_s - want).abs() < 1e-12, "{scheme}");
        }
    }

    /// The controller's T_ver(K, L) and the round's are one formula: the same bits at any draft lengths, with and
    /// without a price per drafted token.
    #[test]
    fn the_model_prices_a_pass_as_the_round_does() {
        let link = LinkConfig::paper_b();
        let devs: Vec<DeviceView> = (0..3)
            .map(|k| DeviceView {
                acceptance: 0.7,
                draft_token_s: 0.0005,
                gain: 1e-11 * (k + 1) as f64,
                max_draft_len: 100,
            })
            .collect();
        let cfg = test_config(Scheme::PER_ROUND[0], 41.0);
        for per_draft_token_s in [0.0, 0.00061, 0.05] {
            let model = VerifyModel {
                per_draft_token_s,
                ..VerifyModel::affine(0.0043, 0.00071)
            };
            let round = build_round(&cfg, &link, &devs, &model, 3).unwrap();
            for lengths in [[0u32, 0, 0], [1, 4, 9], [25, 0, 3]] {
                let drafted = lengths.iter().map(|&l| u64::from(l)).sum();
                assert_eq!(
                    round.verify_s_at(&lengths).to_bits(),
                    model.seconds(3, drafted).to_bits(),
                    "T_tok {per_draft_token_s}, lengths {lengths:?}"
                );
            }
        }
    }

    #[test]
    fn every_scheme_plans_a_round() {
        let link = LinkConfig::paper_b();
        let devs: Vec<DeviceView> = (0..4)
            .map(|k| DeviceView {
                acceptance: 0.5 + 0.1 * k as f64,
                draft_token_s: 0.01,
                gain: 1e-11 * (k + 1) as f64,
                max_draft_len: if k == 3 { 2 } else { 100 },
            })
            .collect();
        for n in Scheme::PER_ROUND.map(Scheme::name) {
            let cfg = test_config(Scheme::parse_per_round(n).unwrap(), 12_800.0);
            let p = plan_round(&cfg, &link, &devs, &VerifyModel::affine(0.02, 0.002), 1).unwrap();
            assert_eq!(p.draft_lengths.len(), 4, "{n}");
            assert!(p.draft_lengths[3] <= 2, "{n}: the budget caps the draft");
            assert!(p.rate_tokens_per_s > 0.0, "{n}");
            let b: f64 = p.uplink_share_hz.iter().sum();
            assert!(b <= link.bandwidth_hz * (1.0 + 1e-9), "{n}");
        }
    }
}
