//! A validated paper-A scenario (SI units) and the evaluation of eq. 27 at any plan.
//!
//! [`ScenarioSpec`] holds the SI values (`spin-scenario` reads the files into it); [`Scenario::new`] checks every field once and names
//! the offending one (`devices[3].acceptance: 1.2 is outside (0, 1)`), so every planner downstream is infallible
//! on its inputs.

use crate::OptimizeError;
use spin_core::expected_accepted;

/// One device of a scenario, SI units (unvalidated).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceSpec {
    /// Per-token acceptance rate α_k ∈ (0, 1).
    pub acceptance: f64,
    /// On-device SLM latency per drafted token T_k^S, in seconds (> 0).
    pub draft_token_s: f64,
    /// Uplink spectral efficiency r_k = log₂(1 + p_k H_k / N0), in bit/s/Hz (> 0).
    pub spectral_efficiency: f64,
}

/// A paper-A scenario, SI units (unvalidated; [`Scenario::new`] checks it).
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioSpec {
    /// Total uplink bandwidth B in Hz (> 0).
    pub bandwidth_hz: f64,
    /// Bits uploaded per drafted token, Q_tok = |V̂|(Q_B + ⌈log₂V⌉) (> 0).
    pub distribution_bits: f64,
    /// T_fix of the batched verification latency T_ver = T_fix + K·T_lin (paper A, eq. 7), in seconds (≥ 0).
    pub verify_fixed_s: f64,
    /// T_lin of eq. 7, in seconds per device in the batch (≥ 0).
    pub verify_per_device_s: f64,
    /// Largest allowed draft length L_max (≥ 1).
    pub max_draft_len: u32,
    /// Smallest allowed draft length (scenario files default it to 1; paper A requires L_k ∈ Z₊).
    pub min_draft_len: u32,
    /// The devices (at least one).
    pub devices: Vec<DeviceSpec>,
}

/// One validated device, with a_k = Q_tok / r_k precomputed (bandwidth-seconds per drafted token).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScenarioDevice {
    /// α_k ∈ (0, 1).
    pub acceptance: f64,
    /// T_k^S in seconds.
    pub draft_token_s: f64,
    /// r_k in bit/s/Hz.
    pub spectral_efficiency: f64,
    /// a_k = Q_tok / r_k in Hz·s: device k needs a_k L / (φ − L T_k^S) Hz to finish L tokens by time φ.
    pub hz_s_per_token: f64,
}

impl ScenarioDevice {
    /// E[N_k | L] (paper A, eq. 12).
    pub fn expected_tokens(&self, draft_len: u32) -> f64 {
        expected_accepted(self.acceptance, draft_len)
    }

    /// Bandwidth needed to draft and upload `draft_len` tokens within `latency_s` (Lemma 3, eq. 31), or +∞ when
    /// drafting alone takes `latency_s` or longer.
    pub fn bandwidth_for(&self, draft_len: u32, latency_s: f64) -> f64 {
        let l = f64::from(draft_len);
        let slack = latency_s - l * self.draft_token_s;
        if slack > 0.0 {
            self.hz_s_per_token * l / slack
        } else {
            f64::INFINITY
        }
    }
}

/// A validated paper-A scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// B in Hz.
    pub bandwidth_hz: f64,
    /// Q_tok in bits.
    pub distribution_bits: f64,
    /// T_fix in seconds.
    pub verify_fixed_s: f64,
    /// T_lin in seconds.
    pub verify_per_device_s: f64,
    /// Smallest allowed draft length (≥ 1).
    pub min_draft_len: u32,
    /// L_max.
    pub max_draft_len: u32,
    /// The devices (non-empty).
    pub devices: Vec<ScenarioDevice>,
}

/// The largest L_max accepted (E[N|L] and the planners are well defined beyond it, but no use case needs it).
/// It bounds the planners' tables, not a representation, so it is not paper B's limit
/// ([`crate::paper_b::scenario::MAX_DRAFT_LEN_LIMIT`], 1000, which the SAA samples' 16-bit positions set and the
/// unified round shares); the networked server caps the drafts it runs lower still
/// (`spin_net::server::MAX_SERVED_DRAFT_LEN`, 64), since each of them is drafted, sent and verified in a live round.
pub const MAX_DRAFT_LEN_LIMIT: u32 = 1024;

/// The most devices a paper-A scenario may have. Every planner's memory is O(K·(L_max − L_min + 1)) and
/// [`MAX_PLAN_TABLE`] caps that product; this caps K alone so that the O(K) vectors of a plan stay small.
pub const MAX_DEVICES: usize = 10_000;

/// The largest K·(L_max − L_min + 1), the size of the per-device draft-length tables the planners keep (the exact
/// planner holds a few f64 per entry, so this bounds its memory to a few hundred MB at most).
pub const MAX_PLAN_TABLE: u64 = 4_000_000;

/// Times (T_k^S, T_fix, T_lin, and the upload time of one token over the whole band Q_tok/(r_k B)) must be at most
/// this many seconds; the upload time must also be at least [`MIN_UPLOAD_S`]. Inside these limits every sum,
/// square and ratio the planners form stays a normal, finite f64 (docs/paper-a.md, "Limits and tolerances").
pub const MAX_TIME_S: f64 = 1e100;

/// The smallest upload time of one token over the whole band, Q_tok/(r_k B), in seconds (see [`MAX_TIME_S`]).
pub const MIN_UPLOAD_S: f64 = 1e-100;

/// A relative tolerance on Σ_k B_k ≤ B in [`Scenario::evaluate`]: plans a few ulps over the band (a file's
/// rounded decimals, a sum taken in another order) are accepted. The planners' own shares never exceed B at all.
pub const BANDWIDTH_TOLERANCE: f64 = 1e-9;

fn at_most(field: impl Into<String>, value: f64, limit: f64) -> Result<f64, OptimizeError> {
    if value <= limit {
        Ok(value)
    } else {
        Err(OptimizeError::Invalid {
            field: field.into(),
            reason: format!("{value:e} s is above the limit of {limit:e} s"),
        })
    }
}

impl Scenario {
    /// Validates a file's scenario; every error names its field. Size limits ([`MAX_DEVICES`],
    /// [`MAX_DRAFT_LEN_LIMIT`], [`MAX_PLAN_TABLE`]) are checked before anything is allocated.
    pub fn new(spec: &ScenarioSpec) -> Result<Self, OptimizeError> {
        OptimizeError::positive("bandwidth_hz", spec.bandwidth_hz)?;
        OptimizeError::positive("distribution_bits", spec.distribution_bits)?;
        OptimizeError::non_negative("verify_fixed_s", spec.verify_fixed_s)?;
        OptimizeError::non_negative("verify_per_device_s", spec.verify_per_device_s)?;
        at_most("verify_fixed_s", spec.verify_fixed_s, MAX_TIME_S)?;
        at_most("verify_per_device_s", spec.verify_per_device_s, MAX_TIME_S)?;
        if spec.min_draft_len == 0 {
            return Err(OptimizeError::Invalid {
                field: "min_draft_len".into(),
                reason: "must be at least 1 (paper A requires positive draft lengths)".into(),
            });
        }
        if spec.max_draft_len < spec.min_draft_len || spec.max_draft_len > MAX_DRAFT_LEN_LIMIT {
            return Err(OptimizeError::Invalid {
                field: "max_draft_len".into(),
                reason: format!(
                    "{} is outside [{}, {MAX_DRAFT_LEN_LIMIT}] (min_draft_len ..= limit)",
                    spec.max_draft_len, spec.min_draft_len
                ),
            });
        }
        if spec.devices.is_empty() {
            return Err(OptimizeError::Invalid {
                field: "devices".into(),
                reason: "the device list is empty".into(),
            });
        }
        if spec.devices.len() > MAX_DEVICES {
            return Err(OptimizeError::Invalid {
                field: "devices".into(),
                reason: format!(
                    "{} devices are more than the limit of {MAX_DEVICES}",
                    spec.devices.len()
                ),
            });
        }
        let table = spec.devices.len() as u64 * u64::from(spec.max_draft_len - spec.min_draft_len + 1);
        if table > MAX_PLAN_TABLE {
            return Err(OptimizeError::Invalid {
                field: "devices".into(),
                reason: format!(
                    "{} devices × {} draft lengths = {table} exceeds the limit of {MAX_PLAN_TABLE}",
                    spec.devices.len(),
                    spec.max_draft_len - spec.min_draft_len + 1
                ),
            });
        }
        // One token's upload time over the whole band, Q_tok / (r_k B).
        let upload_s = |r: f64| spec.distribution_bits / r / spec.bandwidth_hz;
        // The fields a file gave that make device k's upload time out of range: the shared bandwidth_hz and
        // distribution_bits when every device's is (with two devices or more), else the device's own
        // spectral_efficiency; a lone device's could be any of the three.
        let upload_culprits = |k: usize| {
            let out =
                |d: &DeviceSpec| !(MIN_UPLOAD_S..=MAX_TIME_S).contains(&upload_s(d.spectral_efficiency));
            match spec.devices.len() {
                1 => format!("bandwidth_hz, distribution_bits, devices[{k}].spectral_efficiency"),
                _ if spec.devices.iter().all(out) => "bandwidth_hz, distribution_bits".to_string(),
                _ => format!("devices[{k}].spectral_efficiency"),
            }
        };
        let devices = spec
            .devices
            .iter()
            .enumerate()
            .map(|(k, d)| {
                // The field names are formatted only on failure: a networked server builds a scenario every round,
                // and formatting three names per device was a few percent of an exact plan at K = 64.
                let field = |name: &'static str| {
                    move |e: OptimizeError| match e {
                        OptimizeError::OutOfDomain { value, domain, .. } => OptimizeError::OutOfDomain {
                            field: format!("devices[{k}].{name}"),
                            value,
                            domain,
                        },
                        OptimizeError::Invalid { reason, .. } => OptimizeError::Invalid {
                            field: format!("devices[{k}].{name}"),
                            reason,
                        },
                        other => other,
                    }
                };
                let alpha = OptimizeError::probability_open(String::new(), d.acceptance)
                    .map_err(field("acceptance"))?;
                let t = OptimizeError::positive(String::new(), d.draft_token_s).map_err(field("draft_token_s"))?;
                let r = OptimizeError::positive(String::new(), d.spectral_efficiency)
                    .map_err(field("spectral_efficiency"))?;
                at_most(String::new(), t, MAX_TIME_S).map_err(field("draft_token_s"))?;
                let upload = upload_s(r);
                if !(MIN_UPLOAD_S..=MAX_TIME_S).contains(&upload) {
                    return Err(OptimizeError::Invalid {
                        field: upload_culprits(k),
                        reason: format!(
                            "one token takes distribution_bits / (spectral_efficiency · bandwidth_hz) = {upload:e} s \
                             over the whole band, outside [{MIN_UPLOAD_S:e}, {MAX_TIME_S:e}] s"
                        ),
                    });
                }
                Ok(ScenarioDevice {
                    acceptance: alpha,
                    draft_token_s: t,
                    spectral_efficiency: r,
                    hz_s_per_token: spec.distribution_bits / r,
                })
            })
            .collect::<Result<Vec<_>, OptimizeError>>()?;
        Ok(Self {
            bandwidth_hz: spec.bandwidth_hz,
            distribution_bits: spec.distribution_bits,
            verify_fixed_s: spec.verify_fixed_s,
            verify_per_device_s: spec.verify_per_device_s,
            min_draft_len: spec.min_draft_len,
            max_draft_len: spec.max_draft_len,
            devices,
        })
    }

    /// Number of devices K.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Always false: a validated scenario has at least one device.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// T_ver = T_fix + K·T_lin (paper A, eq. 7): every device's draft is in the batch (shorter ones padded).
    pub fn verify_s(&self) -> f64 {
        self.verify_fixed_s + self.len() as f64 * self.verify_per_device_s
    }

    /// Σ_k E[N_k | L_k]: the expected tokens of one round of the plan `draft_lengths` (numerator of eq. 27).
    pub fn expected_tokens_sum(&self, draft_lengths: &[u32]) -> f64 {
        self.devices
            .iter()
            .zip(draft_lengths)
            .map(|(d, &l)| d.expected_tokens(l))
            .sum()
    }

    /// The allowed draft lengths, `min_draft_len ..= max_draft_len`.
    pub fn draft_range(&self) -> std::ops::RangeInclusive<u32> {
        self.min_draft_len..=self.max_draft_len
    }

    /// Goodput (eq. 27) and round latency T^ma + T_ver of a plan with given lengths and bandwidths.
    ///
    /// # Formula
    /// T^ma = max_k L_k (T_k^S + Q_tok / (B_k r_k)) (eq. 26); τ = Σ_k E[N_k | L_k] / (T^ma + T_ver) (eq. 27).
    /// Every B_k must be positive, except that of a device with L_k = 0, which sends nothing (B_k ≥ 0).
    pub fn evaluate(
        &self,
        draft_lengths: &[u32],
        uplink_share_hz: &[f64],
    ) -> Result<(f64, f64), OptimizeError> {
        if draft_lengths.len() != self.len() || uplink_share_hz.len() != self.len() {
            return Err(OptimizeError::Invalid {
                field: "draft_lengths".into(),
                reason: format!(
                    "{} lengths and {} bandwidths for {} devices",
                    draft_lengths.len(),
                    uplink_share_hz.len(),
                    self.len()
                ),
            });
        }
        let mut latency = 0.0f64;
        let mut tokens = 0.0;
        for (k, ((d, &l), &b)) in self
            .devices
            .iter()
            .zip(draft_lengths)
            .zip(uplink_share_hz)
            .enumerate()
        {
            // The field is named only on failure (a server evaluates a plan every round).
            let name = |e: OptimizeError| e.naming(|| format!("uplink_share_hz[{k}]"));
            if l == 0 {
                // A device that drafts nothing sends nothing: it needs no band and adds no latency.
                OptimizeError::non_negative("", b).map_err(name)?;
                tokens += d.expected_tokens(0);
                continue;
            }
            OptimizeError::positive("", b).map_err(name)?;
            let lf = f64::from(l);
            latency = latency.max(lf * (d.draft_token_s + d.hz_s_per_token / b));
            tokens += d.expected_tokens(l);
        }
        let total = uplink_share_hz.iter().sum::<f64>();
        if total > self.bandwidth_hz * (1.0 + BANDWIDTH_TOLERANCE) {
            return Err(OptimizeError::Infeasible {
                reason: format!(
                    "uplink shares sum to {total} Hz, above bandwidth_hz = {}",
                    self.bandwidth_hz
                ),
            });
        }
        let round = latency + self.verify_s();
        Ok((tokens / round, round))
    }
}

/// What a planner can say about the optimality of its plan for (P2). Outcomes, not errors: a plan always comes with
/// one of them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Optimality {
    /// Proven to be the integer optimum of (P2) (up to a relative 1e−13 that only breaks exact ties): the exact
    /// planner finished its search, or brute force enumerated every plan.
    Optimal,
    /// The exact planner's work budget ran out first: this is the best plan it found, and no plan has a goodput
    /// above `upper_bound_tokens_per_s` (a rigorous bound, docs/paper-a.md "Worst-case work").
    Bounded {
        /// An upper bound on the optimal goodput, tokens per second.
        upper_bound_tokens_per_s: f64,
        /// (upper bound − goodput) / goodput: the largest relative improvement the optimum could still offer.
        relative_gap: f64,
    },
    /// A heuristic or baseline plan: no claim about (P2) (the default of [`Plan::evaluated`]).
    #[default]
    NoClaim,
}

impl Optimality {
    /// A short name: `optimal`, `bounded` or `no-claim`.
    pub fn name(&self) -> &'static str {
        match self {
            Optimality::Optimal => "optimal",
            Optimality::Bounded { .. } => "bounded",
            Optimality::NoClaim => "no-claim",
        }
    }
}

/// A round plan: per-device draft lengths and bandwidths with its goodput (eq. 27) and round latency.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// L_k per device.
    pub draft_lengths: Vec<u32>,
    /// B_k, each device's share of the uplink band, in Hz.
    pub uplink_share_hz: Vec<f64>,
    /// τ of eq. 27 at this plan, tokens per second.
    pub goodput_tokens_per_s: f64,
    /// T^ma + T_ver, seconds.
    pub round_latency_s: f64,
    /// Whether this plan is proven optimal for (P2), within a bounded gap, or a heuristic.
    pub optimality: Optimality,
}

impl Plan {
    /// Builds a plan from lengths and bandwidths, evaluating eq. 27 ([`Optimality::NoClaim`]).
    pub fn evaluated(
        s: &Scenario,
        draft_lengths: Vec<u32>,
        uplink_share_hz: Vec<f64>,
    ) -> Result<Self, OptimizeError> {
        let (goodput, round) = s.evaluate(&draft_lengths, &uplink_share_hz)?;
        Ok(Self {
            draft_lengths,
            uplink_share_hz,
            goodput_tokens_per_s: goodput,
            round_latency_s: round,
            optimality: Optimality::NoClaim,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn spec() -> ScenarioSpec {
        ScenarioSpec {
            bandwidth_hz: 1e7,
            distribution_bits: 31744.0,
            verify_fixed_s: 0.02268,
            verify_per_device_s: 0.01272,
            max_draft_len: 25,
            min_draft_len: 1,
            devices: vec![DeviceSpec {
                acceptance: 0.86,
                draft_token_s: 0.021,
                spectral_efficiency: 12.5,
            }],
        }
    }

    type Mutation = Box<dyn Fn(&mut ScenarioSpec)>;

    #[test]
    fn every_invalid_field_is_named() {
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|s| s.bandwidth_hz = 0.0), "bandwidth_hz:"),
            (Box::new(|s| s.distribution_bits = f64::NAN), "distribution_bits:"),
            (Box::new(|s| s.verify_fixed_s = -1.0), "verify_fixed_s:"),
            (
                Box::new(|s| s.verify_per_device_s = f64::INFINITY),
                "verify_per_device_s:",
            ),
            (Box::new(|s| s.max_draft_len = 0), "max_draft_len:"),
            (Box::new(|s| s.min_draft_len = 0), "min_draft_len:"),
            (Box::new(|s| s.devices.clear()), "devices:"),
            (
                Box::new(|s| s.devices[0].acceptance = 1.0),
                "devices[0].acceptance:",
            ),
            (
                Box::new(|s| s.devices[0].draft_token_s = 0.0),
                "devices[0].draft_token_s:",
            ),
            (
                Box::new(|s| s.devices[0].spectral_efficiency = -2.0),
                "devices[0].spectral_efficiency:",
            ),
        ];
        for (mutate, prefix) in cases {
            let mut s = spec();
            mutate(&mut s);
            let err = Scenario::new(&s).unwrap_err().to_string();
            assert!(err.starts_with(prefix), "{err} should start with {prefix}");
        }
    }

    #[test]
    fn evaluate_is_eq_27() {
        let s = Scenario::new(&spec()).unwrap();
        let (tau, round) = s.evaluate(&[4], &[1e7]).unwrap();
        let t_ma = 4.0 * (0.021 + 31744.0 / (1e7 * 12.5));
        let expect = expected_accepted(0.86, 4) / (t_ma + 0.0354);
        assert!((tau - expect).abs() < 1e-12 * expect);
        assert!((round - t_ma - 0.0354).abs() < 1e-15);
        assert!(s.evaluate(&[4], &[2e7]).is_err());
    }
}
