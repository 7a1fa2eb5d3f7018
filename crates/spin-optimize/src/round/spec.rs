//! The round: devices, band, radio, payload sizes and policy, T_ver, draft-length range and outcome samples, as
//! the planners see it ([`RoundSpec`], validated into a [`Round`]), with paper A's and paper B's rounds as its two
//! special cases.

use crate::OptimizeError;
use crate::paper_a;
use crate::paper_b;
use crate::paper_b::scenario::check;
use std::ops::Deref;

/// What each drafted token carries on the uplink, and hence whether a rejection needs an exchange afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadPolicy {
    /// Paper A: every drafted token goes up with its truncated distribution (D bits); the server then holds q at
    /// every position and corrects a rejection itself, so no exchange follows verification.
    Distribution,
    /// Paper B: every drafted token goes up as a (token, probability) pair; a rejected device exchanges one
    /// distribution (D bits) afterwards, in UL or DL mode.
    Pair,
    /// The planner chooses per device between the two (beyond both papers).
    Choose,
}

impl PayloadPolicy {
    /// The file and command-line name.
    pub fn name(self) -> &'static str {
        match self {
            PayloadPolicy::Distribution => "distribution",
            PayloadPolicy::Pair => "pair",
            PayloadPolicy::Choose => "choose",
        }
    }

    /// Whether a device may send distributions per token under this policy.
    pub fn allows_distribution(self) -> bool {
        self != PayloadPolicy::Pair
    }

    /// Whether a device may send pairs under this policy.
    pub fn allows_pair(self) -> bool {
        self != PayloadPolicy::Distribution
    }
}

/// How the band of the correction phase is split among the rejected devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CorrectionSplit {
    /// b = B/|R| for every rejected device, in both directions (paper B).
    #[default]
    Equal,
}

impl CorrectionSplit {
    /// The file and output name (`equal`).
    pub fn name(self) -> &'static str {
        match self {
            CorrectionSplit::Equal => "equal",
        }
    }
}

/// The payload sizes of a round in bits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenPayload {
    /// D: bits of one truncated, quantised distribution (paper A's Q_tok, paper B's D).
    pub distribution_bits: f64,
    /// Bits of one (token, probability) pair; 0 neglects them as paper B does.
    pub pair_bits: f64,
    /// Which per-token payloads the unified planner may use.
    pub policy: PayloadPolicy,
}

/// The format of an exchanged distribution: V_eff entries of a V-token vocabulary, Q bits per value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DistributionFormat {
    /// V_eff, the entries kept (1 ≤ V_eff ≤ V).
    pub effective_support: u32,
    /// V, the vocabulary size (≥ 2).
    pub vocabulary: u32,
    /// Q, bits per kept value (1..=24, as `spin_core::SparseDist::quantise` accepts).
    pub quant_bits: u32,
}

impl DistributionFormat {
    /// Paper B's setting: V_eff = 1024, V = 151,665, Q = 16 (D = 34,816 bits).
    pub const PAPER_B: DistributionFormat = DistributionFormat {
        effective_support: 1024,
        vocabulary: 151_665,
        quant_bits: 16,
    };

    /// Checks the ranges; errors name `effective_support`, `vocabulary` or `quant_bits`.
    pub fn validate(&self) -> Result<(), OptimizeError> {
        if self.vocabulary < 2 {
            return Err(OptimizeError::Invalid {
                field: "vocabulary".into(),
                reason: format!("{} is below 2", self.vocabulary),
            });
        }
        if self.effective_support == 0 || self.effective_support > self.vocabulary {
            return Err(OptimizeError::Invalid {
                field: "effective_support".into(),
                reason: format!(
                    "{} is outside [1, vocabulary = {}]",
                    self.effective_support, self.vocabulary
                ),
            });
        }
        if !(1..=24).contains(&self.quant_bits) {
            return Err(OptimizeError::Invalid {
                field: "quant_bits".into(),
                reason: format!("{} is outside [1, 24]", self.quant_bits),
            });
        }
        Ok(())
    }

    /// D = V_eff(⌈log₂V⌉ + Q) bits (`spin_core::dist::payload_bits`, the size `SparseDist::bits_on_air` reports).
    pub fn distribution_bits(&self) -> f64 {
        spin_core::dist::payload_bits(
            self.effective_support as usize,
            self.vocabulary as usize,
            self.quant_bits,
        ) as f64
    }

    /// ⌈log₂V⌉ + Q bits: one token index and one quantised probability (`spin_core::dist::pair_bits`).
    pub fn pair_bits(&self) -> f64 {
        f64::from(spin_core::dist::pair_bits(
            self.vocabulary as usize,
            self.quant_bits,
        ))
    }
}

/// The radio of the correction phase (SI units).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Radio {
    /// P_ul, each device's maximum transmit power in W.
    pub ul_power_w: f64,
    /// P_dl, the server's downlink budget in W.
    pub dl_power_w: f64,
    /// N0 at the server (uplink receiver) in W/Hz.
    pub noise_psd_server_w_per_hz: f64,
    /// N0 at the devices (downlink receivers) in W/Hz.
    pub noise_psd_device_w_per_hz: f64,
}

impl Radio {
    /// Paper B's budgets and noise: P_ul = 15 dBm, P_dl = 30 dBm, N0_ser = −169 dBm/Hz, N0_dev = −167 dBm/Hz.
    pub fn paper_b() -> Radio {
        use spin_channel::units::{dbm_per_hz_to_w_per_hz, dbm_to_w};
        Radio {
            ul_power_w: dbm_to_w(15.0),
            dl_power_w: dbm_to_w(30.0),
            noise_psd_server_w_per_hz: dbm_per_hz_to_w_per_hz(-169.0),
            noise_psd_device_w_per_hz: dbm_per_hz_to_w_per_hz(-167.0),
        }
    }
}

/// One device of a round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundDevice {
    /// α_k ∈ (0, 1), the per-token acceptance rate.
    pub acceptance: f64,
    /// T_k^S, seconds per drafted token (> 0).
    pub draft_token_s: f64,
    /// r_k, bit/s/Hz of the draft uplink (paper A's spectral efficiency, > 0).
    pub spectral_efficiency: f64,
    /// g_k^ul, linear power gain device → server for the correction upload (> 0).
    pub uplink_gain: f64,
    /// g_k^dl, linear power gain server → device for the correction download (> 0).
    pub downlink_gain: f64,
}

/// A round as the planners see it (unvalidated; [`Round::new`] checks it).
#[derive(Debug, Clone, PartialEq)]
pub struct RoundSpec {
    /// B in Hz, shared by the draft uplink (OFDMA shares) and, afterwards, by the correction phase.
    pub bandwidth_hz: f64,
    /// T_fix of T_ver(K) = T_fix + K·T_lin in seconds.
    pub verify_fixed_s: f64,
    /// T_lin in seconds per device in the batch (K counts every device).
    pub verify_per_device_s: f64,
    /// T_tok in seconds per drafted token in the batch: a verification pass scores L_k + 1 positions for device k,
    /// and on a real runtime each position beyond a device's first costs time (docs/unified.md, "Positions in the
    /// pass"). T_ver(K, L) = T_fix + K·T_lin + T_tok·Σ L_k; 0 is both papers' model, where T_ver does not depend on L.
    /// The papers' planners plan without it; every plan is scored with it.
    pub verify_per_draft_token_s: f64,
    /// Smallest draft length (0 lets a device take one token from the target model alone).
    pub min_draft_len: u32,
    /// Largest draft length L_max.
    pub max_draft_len: u32,
    /// The correction radio.
    pub radio: Radio,
    /// Payload sizes and policy.
    pub payload: TokenPayload,
    /// How the correction band is split.
    pub correction_split: CorrectionSplit,
    /// Outcome samples of the sample-average approximation (when outcomes are not enumerated).
    pub saa_samples: u32,
    /// Seed of the outcome samples.
    pub seed: u64,
    /// The devices.
    pub devices: Vec<RoundDevice>,
}

/// The largest draft length a round may allow (outcome samples store positions in 16 bits; paper B's limit).
pub const MAX_DRAFT_LEN_LIMIT: u32 = paper_b::scenario::MAX_DRAFT_LEN_LIMIT;

/// A validated round; read its fields through `Deref` to [`RoundSpec`].
#[derive(Debug, Clone, PartialEq)]
pub struct Round(RoundSpec);

impl Deref for Round {
    type Target = RoundSpec;
    fn deref(&self) -> &RoundSpec {
        &self.0
    }
}

impl Round {
    /// Checks every field once; the error names the first offending one. The checks of the fields paper B also has
    /// are paper B's (`paper_b::scenario::check`), so a field fails with the same message in both; like paper B, a
    /// round has at most `paper_b::scenario::MAX_DEVICES` devices.
    pub fn new(spec: RoundSpec) -> Result<Round, OptimizeError> {
        OptimizeError::positive("bandwidth_hz", spec.bandwidth_hz)?;
        check::verify(spec.verify_fixed_s, spec.verify_per_device_s)?;
        OptimizeError::non_negative("verify_per_draft_token_s", spec.verify_per_draft_token_s)?;
        check::max_draft_len(spec.max_draft_len)?;
        if spec.min_draft_len > spec.max_draft_len {
            return Err(OptimizeError::Invalid {
                field: "min_draft_len".into(),
                reason: format!(
                    "{} is above max_draft_len = {}",
                    spec.min_draft_len, spec.max_draft_len
                ),
            });
        }
        check::radio(
            spec.radio.ul_power_w,
            spec.radio.dl_power_w,
            spec.radio.noise_psd_server_w_per_hz,
            spec.radio.noise_psd_device_w_per_hz,
        )?;
        OptimizeError::positive("distribution_bits", spec.payload.distribution_bits)?;
        OptimizeError::non_negative("pair_bits", spec.payload.pair_bits)?;
        check::saa_samples(spec.saa_samples)?;
        check::device_count(spec.devices.len())?;
        for (k, d) in spec.devices.iter().enumerate() {
            check::device(k, d.acceptance, d.draft_token_s)?;
            // Field names are formatted only on failure (a networked server builds a round every round).
            let name =
                |field: &'static str| move |e: OptimizeError| e.naming(|| format!("devices[{k}].{field}"));
            OptimizeError::positive("", d.spectral_efficiency).map_err(name("spectral_efficiency"))?;
            OptimizeError::positive("", d.uplink_gain).map_err(name("uplink_gain"))?;
            OptimizeError::positive("", d.downlink_gain).map_err(name("downlink_gain"))?;
        }
        let round = Round(spec);
        if round.verify_s() <= 0.0 {
            return Err(OptimizeError::Invalid {
                field: "verify_fixed_s".into(),
                reason: "verification latency T_fix + K·T_lin must be positive".into(),
            });
        }
        Ok(round)
    }

    /// The file form.
    pub fn spec(&self) -> &RoundSpec {
        &self.0
    }

    /// Number of devices K.
    pub fn len(&self) -> usize {
        self.0.devices.len()
    }

    /// Always false: a validated round has a device.
    pub fn is_empty(&self) -> bool {
        self.0.devices.is_empty()
    }

    /// T_ver(K) = T_fix + K·T_lin, K counting every device (paper A eq. 7, paper B eq. 16): the pass when no
    /// device drafts, and the papers' T_ver at any L.
    pub fn verify_s(&self) -> f64 {
        verify_seconds(
            self.0.verify_fixed_s,
            self.0.verify_per_device_s,
            0.0,
            self.0.devices.len(),
            0,
        )
    }

    /// T_ver(K, L) = T_fix + K·T_lin + T_tok·Σ L_k, the pass that verifies `draft_lengths` (one per device).
    pub fn verify_s_at(&self, draft_lengths: &[u32]) -> f64 {
        verify_with_positions(self.verify_s(), self.0.verify_per_draft_token_s, draft_lengths)
    }

    /// Uplink bits per drafted token for a device that sends distributions (`true`) or pairs (`false`).
    pub fn token_bits(&self, sends_distributions: bool) -> f64 {
        if sends_distributions {
            self.0.payload.distribution_bits
        } else {
            self.0.payload.pair_bits
        }
    }

    /// The correction link in paper B's form (the radio formulas of the correction phase live there).
    pub fn link(&self) -> paper_b::Link {
        paper_b::Link {
            distribution_bits: self.0.payload.distribution_bits,
            bandwidth_hz: self.0.bandwidth_hz,
            ul_power_w: self.0.radio.ul_power_w,
            dl_power_w: self.0.radio.dl_power_w,
            noise_psd_server_w_per_hz: self.0.radio.noise_psd_server_w_per_hz,
            noise_psd_device_w_per_hz: self.0.radio.noise_psd_device_w_per_hz,
        }
    }

    /// Paper A's round as a special case: distributions per token, no correction phase, L ≥ `min_draft_len`.
    ///
    /// Paper A gives spectral efficiencies, not gains; the gains (used only if a plan sends pairs) are the ones
    /// that give r_k at full-band SNR under `radio`: g_k = (2^{r_k} − 1) N0_ser B / P_ul.
    pub fn from_paper_a(s: &paper_a::Scenario, radio: Radio) -> Result<Round, OptimizeError> {
        let devices = s
            .devices
            .iter()
            .map(|d| {
                let snr = spin_channel::snr_for_spectral_efficiency(d.spectral_efficiency);
                let gain = snr * radio.noise_psd_server_w_per_hz * s.bandwidth_hz / radio.ul_power_w;
                RoundDevice {
                    acceptance: d.acceptance,
                    draft_token_s: d.draft_token_s,
                    spectral_efficiency: d.spectral_efficiency,
                    uplink_gain: gain,
                    downlink_gain: gain,
                }
            })
            .collect();
        Round::new(RoundSpec {
            bandwidth_hz: s.bandwidth_hz,
            verify_fixed_s: s.verify_fixed_s,
            verify_per_device_s: s.verify_per_device_s,
            verify_per_draft_token_s: 0.0,
            min_draft_len: s.min_draft_len,
            max_draft_len: s.max_draft_len,
            radio,
            payload: TokenPayload {
                distribution_bits: s.distribution_bits,
                pair_bits: 0.0,
                policy: PayloadPolicy::Distribution,
            },
            correction_split: CorrectionSplit::Equal,
            saa_samples: 1000,
            seed: 0,
            devices,
        })
    }

    /// Paper B's round as a special case: pairs per token (neglected, 0 bits), one exchange per rejection with
    /// the band split equally, γ ∈ {0..γ_max}, one gain both ways. The draft uplink's spectral efficiency (unused
    /// while pairs cost 0 bits) is log₂(1 + P_ul g / (N0_ser B)) from `spin_channel::spectral_efficiency`.
    pub fn from_paper_b(s: &paper_b::Scenario) -> Result<Round, OptimizeError> {
        let radio = Radio {
            ul_power_w: s.ul_power_w,
            dl_power_w: s.dl_power_w,
            noise_psd_server_w_per_hz: s.noise_psd_server_w_per_hz,
            noise_psd_device_w_per_hz: s.noise_psd_device_w_per_hz,
        };
        let devices = s
            .devices
            .iter()
            .enumerate()
            .map(|(k, d)| {
                Ok(RoundDevice {
                    acceptance: d.acceptance,
                    draft_token_s: d.draft_token_s,
                    spectral_efficiency: full_band_spectral_efficiency(
                        &radio,
                        s.bandwidth_hz,
                        d.channel_gain,
                    )
                    .map_err(|e| OptimizeError::Invalid {
                        field: format!("devices[{k}].channel_gain"),
                        reason: e.to_string(),
                    })?,
                    uplink_gain: d.channel_gain,
                    downlink_gain: d.channel_gain,
                })
            })
            .collect::<Result<Vec<_>, OptimizeError>>()?;
        Round::new(RoundSpec {
            bandwidth_hz: s.bandwidth_hz,
            verify_fixed_s: s.verify_fixed_s,
            verify_per_device_s: s.verify_per_device_s,
            verify_per_draft_token_s: 0.0,
            min_draft_len: 0,
            max_draft_len: s.max_draft_len,
            radio,
            payload: TokenPayload {
                distribution_bits: s.distribution_bits,
                pair_bits: 0.0,
                policy: PayloadPolicy::Pair,
            },
            correction_split: CorrectionSplit::Equal,
            saa_samples: s.saa_samples,
            seed: s.seed,
            devices,
        })
    }

    /// This round as paper A sees it: distributions per token (Q_tok = D), L ≥ max(1, `min_draft_len`). Paper A's
    /// T_ver has no per-token term, so `verify_per_draft_token_s` is not in it (here and in [`Round::to_paper_b`]).
    pub fn to_paper_a(&self) -> Result<paper_a::Scenario, OptimizeError> {
        self.to_paper_a_with_token_bits(self.payload.distribution_bits)
    }

    /// This round as paper A sees it with `token_bits` uploaded per drafted token (Q_tok), L ≥ max(1,
    /// `min_draft_len`).
    pub fn to_paper_a_with_token_bits(&self, token_bits: f64) -> Result<paper_a::Scenario, OptimizeError> {
        paper_a::Scenario::new(&paper_a::ScenarioSpec {
            bandwidth_hz: self.bandwidth_hz,
            distribution_bits: token_bits,
            verify_fixed_s: self.verify_fixed_s,
            verify_per_device_s: self.verify_per_device_s,
            max_draft_len: self.max_draft_len,
            min_draft_len: self.min_draft_len.max(1),
            devices: self
                .devices
                .iter()
                .map(|d| paper_a::DeviceSpec {
                    acceptance: d.acceptance,
                    draft_token_s: d.draft_token_s,
                    spectral_efficiency: d.spectral_efficiency,
                })
                .collect(),
        })
    }

    /// This round as paper B sees it: pairs neglected, one gain both ways (paper B assumes reciprocity; the
    /// uplink gain is used), γ ∈ {0..γ_max}.
    pub fn to_paper_b(&self) -> Result<paper_b::Scenario, OptimizeError> {
        paper_b::Scenario::new(paper_b::ScenarioSpec {
            bandwidth_hz: self.bandwidth_hz,
            distribution_bits: self.payload.distribution_bits,
            verify_fixed_s: self.verify_fixed_s,
            verify_per_device_s: self.verify_per_device_s,
            max_draft_len: self.max_draft_len,
            ul_power_w: self.radio.ul_power_w,
            dl_power_w: self.radio.dl_power_w,
            noise_psd_server_w_per_hz: self.radio.noise_psd_server_w_per_hz,
            noise_psd_device_w_per_hz: self.radio.noise_psd_device_w_per_hz,
            saa_samples: self.saa_samples,
            seed: self.seed,
            devices: self
                .devices
                .iter()
                .map(|d| paper_b::DeviceSpec {
                    acceptance: d.acceptance,
                    draft_token_s: d.draft_token_s,
                    channel_gain: d.uplink_gain,
                })
                .collect(),
        })
    }
}

/// `verify_s` + `per_draft_token_s`·Σ L_k; exactly `verify_s` when `per_draft_token_s` is 0.
pub(crate) fn verify_with_positions(verify_s: f64, per_draft_token_s: f64, draft_lengths: &[u32]) -> f64 {
    let drafted: u64 = draft_lengths.iter().map(|&l| u64::from(l)).sum();
    with_positions(verify_s, per_draft_token_s, drafted)
}

/// T_ver(K, L) = T_fix + K·T_lin + T_tok·Σ L_k of a pass over `devices` drafts holding `drafted` tokens in all: the
/// one formula the planners ([`Round::verify_s_at`]) and a networked controller's fitted model price a
/// verification with; exactly the papers' T_fix + K·T_lin when T_tok is 0.
pub fn verify_seconds(
    fixed_s: f64,
    per_device_s: f64,
    per_draft_token_s: f64,
    devices: usize,
    drafted: u64,
) -> f64 {
    with_positions(
        fixed_s + per_device_s * devices as f64,
        per_draft_token_s,
        drafted,
    )
}

fn with_positions(verify_s: f64, per_draft_token_s: f64, drafted: u64) -> f64 {
    if per_draft_token_s == 0.0 {
        return verify_s;
    }
    verify_s + per_draft_token_s * drafted as f64
}

/// log₂(1 + P_ul g / (N0_ser B)): the draft uplink's spectral efficiency when the device spreads P_ul over the
/// whole band (the power spectral density stays fixed whatever its share, as paper A's linear rate assumes).
pub fn full_band_spectral_efficiency(
    radio: &Radio,
    bandwidth_hz: f64,
    gain: f64,
) -> Result<f64, spin_channel::ChannelError> {
    spin_channel::spectral_efficiency(spin_channel::snr(
        radio.ul_power_w,
        gain,
        radio.noise_psd_server_w_per_hz,
        bandwidth_hz,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_and_paper_b_scenario_name_a_bad_shared_field_alike() {
        let b = paper_b::ScenarioSpec {
            bandwidth_hz: 1e7,
            distribution_bits: 34_816.0,
            verify_fixed_s: 0.04,
            verify_per_device_s: 0.008,
            max_draft_len: 8,
            ul_power_w: 0.03,
            dl_power_w: 1.0,
            noise_psd_server_w_per_hz: 1.3e-20,
            noise_psd_device_w_per_hz: 2e-20,
            saa_samples: 100,
            seed: 1,
            devices: vec![
                paper_b::DeviceSpec {
                    acceptance: 0.8,
                    draft_token_s: 0.015,
                    channel_gain: 1e-11,
                };
                3
            ],
        };
        let r = Round::from_paper_b(&paper_b::Scenario::new(b.clone()).unwrap())
            .unwrap()
            .spec()
            .clone();
        type Bad = (fn(&mut paper_b::ScenarioSpec), fn(&mut RoundSpec));
        let cases: [Bad; 12] = [
            (|s| s.verify_fixed_s = -1.0, |r| r.verify_fixed_s = -1.0),
            (
                |s| s.verify_per_device_s = f64::NAN,
                |r| r.verify_per_device_s = f64::NAN,
            ),
            (|s| s.max_draft_len = 0, |r| r.max_draft_len = 0),
            (|s| s.max_draft_len = 1001, |r| r.max_draft_len = 1001),
            (|s| s.ul_power_w = 0.0, |r| r.radio.ul_power_w = 0.0),
            (|s| s.dl_power_w = -2.0, |r| r.radio.dl_power_w = -2.0),
            (
                |s| s.noise_psd_server_w_per_hz = f64::INFINITY,
                |r| r.radio.noise_psd_server_w_per_hz = f64::INFINITY,
            ),
            (
                |s| s.noise_psd_device_w_per_hz = 0.0,
                |r| r.radio.noise_psd_device_w_per_hz = 0.0,
            ),
            (|s| s.saa_samples = 0, |r| r.saa_samples = 0),
            (|s| s.devices.clear(), |r| r.devices.clear()),
            (
                |s| s.devices[2].acceptance = 1.0,
                |r| r.devices[2].acceptance = 1.0,
            ),
            (
                |s| s.devices[1].draft_token_s = 0.0,
                |r| r.devices[1].draft_token_s = 0.0,
            ),
        ];
        for (i, (bad_b, bad_r)) in cases.iter().enumerate() {
            let mut sb = b.clone();
            bad_b(&mut sb);
            let mut sr = r.clone();
            bad_r(&mut sr);
            let eb = paper_b::Scenario::new(sb).unwrap_err().to_string();
            let er = Round::new(sr).unwrap_err().to_string();
            assert_eq!(eb, er, "case {i}");
        }
        let mut many = r.clone();
        many.devices = vec![r.devices[0]; paper_b::scenario::MAX_DEVICES + 1];
        let e = Round::new(many).unwrap_err().to_string();
        assert!(
            e.starts_with("devices: 100001 devices are more than the limit"),
            "{e}"
        );
    }

    #[test]
    fn payload_sizes_come_from_spin_core() {
        let f = DistributionFormat::PAPER_B;
        f.validate().unwrap();
        assert_eq!(f.distribution_bits(), 34_816.0);
        assert_eq!(f.pair_bits(), 34.0);
        // The same number a 1024-entry, 16-bit SparseDist reports on the air.
        let probs: Vec<f32> = (0..2048).map(|i| 1.0 + i as f32).collect();
        let sparse = spin_core::SparseDist::truncate(spin_core::Dist::new(&probs).unwrap(), 1024)
            .unwrap()
            .quantise(16)
            .unwrap();
        let small = DistributionFormat {
            effective_support: 1024,
            vocabulary: 2048,
            quant_bits: 16,
        };
        assert_eq!(small.distribution_bits(), sparse.bits_on_air() as f64);
        let bad = DistributionFormat { quant_bits: 0, ..f };
        assert!(bad.validate().unwrap_err().to_string().starts_with("quant_bits:"));
        // Moved from spin-channel's `paper_b::distribution_bits` test: an empty support is refused by name.
        let empty = DistributionFormat {
            effective_support: 0,
            ..f
        };
        assert!(
            empty
                .validate()
                .unwrap_err()
                .to_string()
                .starts_with("effective_support")
        );
    }
}
