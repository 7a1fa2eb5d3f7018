//! A validated paper-B scenario (SI units): the link budget, the verification latency and the devices.
//!
//! [`ScenarioSpec`] mirrors the JSON file; [`Scenario::new`] checks every field once and names the offending one
//! (`devices[3].acceptance: 1.2 is outside (0, 1)`), so the solvers downstream cannot fail on their inputs.

use crate::OptimizeError;
use std::ops::Deref;

/// The largest draft length a scenario may allow (outcome samples store positions in 16 bits). Paper A's planners
/// allow 1024 ([`crate::paper_a::scenario::MAX_DRAFT_LEN_LIMIT`]): their limit bounds tables, not a representation.
pub const MAX_DRAFT_LEN_LIMIT: u32 = 1000;
/// The largest number of SAA samples a scenario may ask for.
pub const SAA_SAMPLES_LIMIT: u32 = 10_000_000;
/// The most devices a paper-B scenario may have (reactive correction is O(K log K) per round).
pub const MAX_DEVICES: usize = 100_000;
/// The largest K²·(γ_max + 1)·N_SAA proactive planning accepts: the greedy's work is at most that many sample
/// visits (K·γ_max steps of K candidate moves over N_SAA samples), and the other searches scale alike. Paper B's
/// setting (K = 20, γ_max = 20, N_SAA = 1000) is 8.4·10⁶; K = 100 with 1000 samples is 2.1·10⁸.
pub const MAX_PLANNING_WORK: u128 = 1_000_000_000;

/// The field checks paper B's [`Scenario::new`] and the unified `round::Round::new` share, so the same field
/// fails with the same message in both (the tests of both assert on them).
pub(crate) mod check {
    use super::{MAX_DEVICES, MAX_DRAFT_LEN_LIMIT, SAA_SAMPLES_LIMIT};
    use crate::OptimizeError;

    /// The size limit of planning by sample-average approximation ([`super::MAX_PLANNING_WORK`]), for paper B's
    /// proactive planning and the unified planner (`planner` names it): devices² × (max_draft_len + 1) per sample,
    /// times the samples. The error names `devices` when K alone is too large (even one sample would exceed the
    /// limit; `note` is appended there), else `saa_samples`.
    pub(crate) fn planning_work(
        planner: &str,
        devices: usize,
        max_draft_len: u32,
        saa_samples: u32,
        note: &str,
    ) -> Result<(), OptimizeError> {
        let limit = super::MAX_PLANNING_WORK;
        let k = devices as u128;
        let per_sample = k * k * (u128::from(max_draft_len) + 1);
        let work = per_sample * u128::from(saa_samples);
        if per_sample > limit {
            return Err(OptimizeError::Invalid {
                field: "devices".into(),
                reason: format!(
                    "{k} devices are more than {planner} accepts: devices² × (max_draft_len + 1) = {k}² × {} = \
                     {per_sample} exceeds the planning limit of {limit} even with one SAA sample{note}",
                    max_draft_len + 1
                ),
            });
        }
        if work > limit {
            return Err(OptimizeError::Invalid {
                field: "saa_samples".into(),
                reason: format!(
                    "devices² × (max_draft_len + 1) × saa_samples = {k}² × {} × {saa_samples} = {work} exceeds the \
                     planning limit of {limit}",
                    max_draft_len + 1
                ),
            });
        }
        Ok(())
    }

    /// A time of at most [`MAX_TIME_S`](crate::paper_a::scenario::MAX_TIME_S) seconds, paper A's limit: past it a
    /// round's latency overflows to ∞ and its goodput to 0 instead of failing (1e308 s printed a `null` latency).
    fn at_most_max_time(field: impl FnOnce() -> String, seconds: f64) -> Result<(), OptimizeError> {
        const LIMIT: f64 = crate::paper_a::scenario::MAX_TIME_S;
        if seconds > LIMIT {
            return Err(OptimizeError::Invalid {
                field: field(),
                reason: format!("{seconds:e} s is above the limit of {LIMIT:e} s"),
            });
        }
        Ok(())
    }

    /// T_ver = T_fix + K·T_lin: both coefficients finite, ≥ 0 and at most paper A's time limit (their sum is checked
    /// with K by the caller).
    pub(crate) fn verify(fixed_s: f64, per_device_s: f64) -> Result<(), OptimizeError> {
        OptimizeError::non_negative("verify_fixed_s", fixed_s)?;
        OptimizeError::non_negative("verify_per_device_s", per_device_s)?;
        at_most_max_time(|| "verify_fixed_s".into(), fixed_s)?;
        at_most_max_time(|| "verify_per_device_s".into(), per_device_s)?;
        Ok(())
    }

    /// L_max (γ_max) ∈ {1, …, [`MAX_DRAFT_LEN_LIMIT`]}.
    pub(crate) fn max_draft_len(value: u32) -> Result<(), OptimizeError> {
        if value == 0 || value > MAX_DRAFT_LEN_LIMIT {
            return Err(OptimizeError::OutOfDomain {
                field: "max_draft_len".into(),
                value: f64::from(value),
                domain: "{1, …, 1000}",
            });
        }
        Ok(())
    }

    /// The correction radio: P_ul, P_dl, N0_ser, N0_dev all finite and > 0, named in that order.
    pub(crate) fn radio(
        ul_power_w: f64,
        dl_power_w: f64,
        noise_psd_server_w_per_hz: f64,
        noise_psd_device_w_per_hz: f64,
    ) -> Result<(), OptimizeError> {
        OptimizeError::positive("ul_power_w", ul_power_w)?;
        OptimizeError::positive("dl_power_w", dl_power_w)?;
        OptimizeError::positive("noise_psd_server_w_per_hz", noise_psd_server_w_per_hz)?;
        OptimizeError::positive("noise_psd_device_w_per_hz", noise_psd_device_w_per_hz)?;
        Ok(())
    }

    /// N_SAA ∈ {1, …, [`SAA_SAMPLES_LIMIT`]}.
    pub(crate) fn saa_samples(value: u32) -> Result<(), OptimizeError> {
        if value == 0 || value > SAA_SAMPLES_LIMIT {
            return Err(OptimizeError::OutOfDomain {
                field: "saa_samples".into(),
                value: f64::from(value),
                domain: "{1, …, 10000000}",
            });
        }
        Ok(())
    }

    /// At least one device and at most [`MAX_DEVICES`].
    pub(crate) fn device_count(devices: usize) -> Result<(), OptimizeError> {
        if devices == 0 {
            return Err(OptimizeError::Invalid {
                field: "devices".into(),
                reason: "at least one device is needed".into(),
            });
        }
        if devices > MAX_DEVICES {
            return Err(OptimizeError::Invalid {
                field: "devices".into(),
                reason: format!("{devices} devices are more than the limit of {MAX_DEVICES}"),
            });
        }
        Ok(())
    }

    /// Device `k`'s α_k ∈ (0, 1) and drafting time per token > 0, at most paper A's time limit.
    pub(crate) fn device(k: usize, acceptance: f64, draft_token_s: f64) -> Result<(), OptimizeError> {
        OptimizeError::probability_open("", acceptance)
            .map_err(|e| e.naming(|| format!("devices[{k}].acceptance")))?;
        OptimizeError::positive("", draft_token_s)
            .map_err(|e| e.naming(|| format!("devices[{k}].draft_token_s")))?;
        at_most_max_time(|| format!("devices[{k}].draft_token_s"), draft_token_s)?;
        Ok(())
    }
}

/// One device of a scenario, SI units (unvalidated).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceSpec {
    /// Per-token acceptance rate α_k ∈ (0, 1).
    pub acceptance: f64,
    /// On-device drafting latency per token T_k^dft in seconds (> 0).
    pub draft_token_s: f64,
    /// Power gain g_k of the device–server channel (path loss and fading, linear, > 0), the same both ways.
    pub channel_gain: f64,
}

/// A paper-B scenario, SI units (unvalidated; [`Scenario::new`] checks it; `spin-scenario` reads the files into it).
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioSpec {
    /// Total bandwidth B in Hz, split equally among the rejected devices (> 0).
    pub bandwidth_hz: f64,
    /// Bits of one vocabulary-wide distribution D = V_eff(⌈log₂V⌉ + Q) (> 0; paper B: 34,816).
    pub distribution_bits: f64,
    /// T0 of the batched verification latency T_ver = T0 + T1·K (paper B, eq. 16), in seconds (≥ 0).
    pub verify_fixed_s: f64,
    /// T1 of eq. 16, in seconds per device in the batch (≥ 0; T0 + T1·K must be > 0).
    pub verify_per_device_s: f64,
    /// γ_max: draft lengths range over 0..=γ_max (1..=1000).
    pub max_draft_len: u32,
    /// Maximum uplink power P_ul of every device in W (> 0).
    pub ul_power_w: f64,
    /// Server downlink power budget P_dl in W (> 0).
    pub dl_power_w: f64,
    /// Noise power spectral density at the server N0_ser in W/Hz (> 0; −169 dBm/Hz ≈ 1.26e−20).
    pub noise_psd_server_w_per_hz: f64,
    /// Noise power spectral density at the devices N0_dev in W/Hz (> 0; −167 dBm/Hz ≈ 2.0e−20).
    pub noise_psd_device_w_per_hz: f64,
    /// Number of outcome samples N_SAA of the sample-average approximation.
    pub saa_samples: u32,
    /// Seed of the outcome samples (and of random mode selection).
    pub seed: u64,
    /// The devices (at least one).
    pub devices: Vec<DeviceSpec>,
}

/// A validated paper-B scenario; read its fields through `Deref` to [`ScenarioSpec`].
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario(ScenarioSpec);

impl Deref for Scenario {
    type Target = ScenarioSpec;
    fn deref(&self) -> &ScenarioSpec {
        &self.0
    }
}

impl Scenario {
    /// Checks every field; the error names the first offending one.
    pub fn new(spec: ScenarioSpec) -> Result<Self, OptimizeError> {
        OptimizeError::positive("bandwidth_hz", spec.bandwidth_hz)?;
        OptimizeError::positive("distribution_bits", spec.distribution_bits)?;
        check::verify(spec.verify_fixed_s, spec.verify_per_device_s)?;
        check::max_draft_len(spec.max_draft_len)?;
        check::radio(
            spec.ul_power_w,
            spec.dl_power_w,
            spec.noise_psd_server_w_per_hz,
            spec.noise_psd_device_w_per_hz,
        )?;
        check::saa_samples(spec.saa_samples)?;
        check::device_count(spec.devices.len())?;
        for (k, d) in spec.devices.iter().enumerate() {
            check::device(k, d.acceptance, d.draft_token_s)?;
            OptimizeError::positive("", d.channel_gain)
                .map_err(|e| e.naming(|| format!("devices[{k}].channel_gain")))?;
        }
        let t_ver = spec.verify_fixed_s + spec.verify_per_device_s * spec.devices.len() as f64;
        if t_ver <= 0.0 {
            return Err(OptimizeError::Invalid {
                field: "verify_fixed_s".into(),
                reason: "verification latency T0 + T1·K must be positive".into(),
            });
        }
        Ok(Scenario(spec))
    }

    /// Checks the size limit of proactive planning ([`MAX_PLANNING_WORK`]) before an evaluator draws its samples;
    /// the error names `devices` when K alone is too large (even one sample would exceed the limit), else
    /// `saa_samples`. Memory follows from it: an evaluator holds K·N_SAA samples and O(K) tables.
    pub fn check_planning_size(&self) -> Result<(), OptimizeError> {
        check::planning_work(
            "proactive planning",
            self.0.devices.len(),
            self.0.max_draft_len,
            self.0.saa_samples,
            &format!(" (reactive correction takes up to {MAX_DEVICES} devices)"),
        )
    }

    /// The file form of this scenario.
    pub fn spec(&self) -> &ScenarioSpec {
        &self.0
    }

    /// Number of devices K.
    pub fn device_count(&self) -> usize {
        self.0.devices.len()
    }

    /// T_ver(K) = T0 + T1·K with K counting every device, also those with γ_k = 0 (paper B, eq. 16; ⟨C⟩).
    pub fn verify_s(&self) -> f64 {
        self.0.verify_fixed_s + self.0.verify_per_device_s * self.0.devices.len() as f64
    }

    /// The radio part of the scenario.
    pub fn link(&self) -> super::reactive::Link {
        super::reactive::Link {
            distribution_bits: self.0.distribution_bits,
            bandwidth_hz: self.0.bandwidth_hz,
            ul_power_w: self.0.ul_power_w,
            dl_power_w: self.0.dl_power_w,
            noise_psd_server_w_per_hz: self.0.noise_psd_server_w_per_hz,
            noise_psd_device_w_per_hz: self.0.noise_psd_device_w_per_hz,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The example of the issue, with `k` devices of spread gains and latencies.
    pub(crate) fn example(k: usize) -> ScenarioSpec {
        ScenarioSpec {
            bandwidth_hz: 1.0e7,
            distribution_bits: 34_816.0,
            verify_fixed_s: 0.0428,
            verify_per_device_s: 0.0076,
            max_draft_len: 20,
            ul_power_w: 0.0316,
            dl_power_w: 1.0,
            noise_psd_server_w_per_hz: 1.26e-20,
            noise_psd_device_w_per_hz: 2.0e-20,
            saa_samples: 1000,
            seed: 7,
            devices: (0..k)
                .map(|i| DeviceSpec {
                    acceptance: 0.6 + 0.3 * ((i * 7 % 11) as f64 / 10.0),
                    draft_token_s: 0.0152 * (1.0 + 0.15 * ((i * 5 % 7) as f64 / 6.0)),
                    channel_gain: 1.0e-13 * 10f64.powf(2.0 * ((i * 3 % 13) as f64 / 12.0)),
                })
                .collect(),
        }
    }

    type Edit = Box<dyn Fn(&mut ScenarioSpec)>;

    #[test]
    fn invalid_fields_are_named() {
        assert!(Scenario::new(example(4)).is_ok());
        let cases: Vec<(Edit, &str)> = vec![
            (Box::new(|s| s.bandwidth_hz = 0.0), "bandwidth_hz"),
            (Box::new(|s| s.distribution_bits = f64::NAN), "distribution_bits"),
            (Box::new(|s| s.verify_fixed_s = -1.0), "verify_fixed_s"),
            (Box::new(|s| s.max_draft_len = 0), "max_draft_len"),
            (Box::new(|s| s.ul_power_w = 0.0), "ul_power_w"),
            (Box::new(|s| s.dl_power_w = -1.0), "dl_power_w"),
            (
                Box::new(|s| s.noise_psd_device_w_per_hz = 0.0),
                "noise_psd_device_w_per_hz",
            ),
            (Box::new(|s| s.saa_samples = 0), "saa_samples"),
            (Box::new(|s| s.devices.clear()), "devices"),
            (
                Box::new(|s| s.devices[3].acceptance = 1.2),
                "devices[3].acceptance",
            ),
            (
                Box::new(|s| s.devices[1].draft_token_s = 0.0),
                "devices[1].draft_token_s",
            ),
            (
                Box::new(|s| s.devices[2].channel_gain = -3.0),
                "devices[2].channel_gain",
            ),
            (
                Box::new(|s| {
                    s.verify_fixed_s = 0.0;
                    s.verify_per_device_s = 0.0;
                }),
                "verify_fixed_s",
            ),
        ];
        for (edit, field) in cases {
            let mut spec = example(4);
            edit(&mut spec);
            let msg = Scenario::new(spec).unwrap_err().to_string();
            assert!(msg.starts_with(&format!("{field}:")), "{msg}");
        }
        let err = Scenario::new(ScenarioSpec {
            devices: vec![],
            ..example(1)
        })
        .unwrap_err()
        .to_string();
        assert_eq!(err, "devices: at least one device is needed");
        let msg = Scenario::new({
            let mut s = example(4);
            s.devices[3].acceptance = 1.2;
            s
        })
        .unwrap_err()
        .to_string();
        assert_eq!(msg, "devices[3].acceptance: 1.2 is outside (0, 1)");
    }
}
