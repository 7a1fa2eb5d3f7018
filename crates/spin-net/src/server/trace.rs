//! What a run reports: one JSON line per round (`RoundTrace`, per device `DeviceTrace`) and the totals (`Summary`).

use super::*;

/// One device in one round of the trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceTrace {
    /// Device index.
    pub device: usize,
    /// L_k planned (the trace said `gamma` before).
    pub draft_len: u32,
    /// B_k, the device's draft-uplink share in Hz (the trace said `bandwidth_hz` before).
    pub uplink_share_hz: f64,
    /// What each drafted token carried up: `distributions` (its distribution, paper A) or `pairs` (token and
    /// probability, paper B); the unified planner picks per device and round (the trace said `dists` before).
    pub payload: UplinkPayload,
    /// Drafted tokens accepted.
    pub accepted: u32,
    /// Tokens committed this round.
    pub emitted: u32,
    /// `server` (corrected or bonus at the server), `ul`, `dl`, `dropped` (late), `silent` (no answer within the wall
    /// deadline on the virtual clock), `lost` (disconnected).
    pub mode: RoundOutcome,
    /// Payload bits put on the uplink air.
    pub bits_up: u64,
    /// Payload bits put on the downlink air.
    pub bits_down: u64,
    /// Uplink air time of the draft in seconds.
    pub air_up_s: f64,
    /// Air time of the correction exchange in seconds (UL or DL).
    pub air_corr_s: f64,
    /// Drafting time in seconds.
    pub draft_s: f64,
    /// Frame bytes received from the device.
    pub wire_up_bytes: u64,
    /// Frame bytes sent to the device.
    pub wire_down_bytes: u64,
}

/// One round of the trace (one JSON line).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoundTrace {
    /// The planning scheme.
    pub scheme: &'static str,
    /// Round number (from 0).
    pub round: u64,
    /// The clock at the end of the round in seconds (from the start of the first round: the wait for devices to
    /// join is not counted).
    pub clock_s: f64,
    /// The round's latency.
    pub latency_s: f64,
    /// Drafting and draft upload (the slowest kept device's draft + air).
    pub draft_up_s: f64,
    /// Of which the slowest kept device's drafting alone.
    pub draft_s: f64,
    /// Verification.
    pub verify_s: f64,
    /// Correction exchange (paper B).
    pub correction_s: f64,
    /// Tokens committed this round over all devices.
    pub tokens: u64,
    /// The planner's predicted goodput in tokens/s.
    pub predicted_goodput: f64,
    /// Real clock: the wall time the server planned the round before sending the plans (the devices wait for it;
    /// it is between rounds, so not in `latency_s`, but in `clock_s`). Absent on the virtual clock, which does not
    /// charge planning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_s: Option<f64>,
    /// Per device.
    pub devices: Vec<DeviceTrace>,
}

/// Per-device totals of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceSummary {
    /// Device index.
    pub device: usize,
    /// Generated tokens.
    pub tokens: usize,
    /// Tokens per second of the run's clock.
    pub goodput: f64,
    /// The server's ratio estimate of α (None below two drafted tokens).
    pub acceptance: Option<f64>,
    /// Rounds in which the device took part.
    pub rounds: u64,
    /// Rounds its draft was dropped as late.
    pub dropped: u64,
    /// Whether it finished.
    pub done: bool,
    /// The generated token ids.
    pub generated: Vec<u32>,
}

impl DeviceSummary {
    /// Device `k`'s totals from the verifier that decoded it, over `clock_s` seconds of the run's clock (goodput 0
    /// for an empty run); the round counts and whether it finished come from the caller's bookkeeping.
    pub(crate) fn from_verifier(
        verifier: &spin_runtime::verifier::Verifier<impl std::ops::Deref<Target = spin_runtime::Model>>,
        k: usize,
        clock_s: f64,
        rounds: u64,
        dropped: u64,
        done: bool,
    ) -> Result<DeviceSummary> {
        let generated = verifier.generated(k)?.to_vec();
        let acceptance = verifier
            .alpha(k)?
            .ratio_estimate(spin_core::estimate::Z_95)?
            .map(|e| e.value);
        Ok(DeviceSummary {
            device: k,
            tokens: generated.len(),
            goodput: if clock_s > 0.0 {
                generated.len() as f64 / clock_s
            } else {
                0.0
            },
            acceptance,
            rounds,
            dropped,
            done,
            generated,
        })
    }
}

/// Totals of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Scheme name.
    pub scheme: &'static str,
    /// The clock.
    pub clock: Clock,
    /// Rounds run.
    pub rounds: u64,
    /// Tokens generated over all devices.
    pub tokens: u64,
    /// The run's duration on its clock in seconds, from the start of its first round.
    pub elapsed_s: f64,
    /// tokens / elapsed_s.
    pub goodput: f64,
    /// Mean of the planner's predicted goodput over rounds.
    pub predicted_goodput: f64,
    /// Σ drafting + upload phase seconds.
    pub draft_up_s: f64,
    /// Σ of which drafting.
    pub draft_s: f64,
    /// Σ verification seconds.
    pub verify_s: f64,
    /// Σ correction seconds.
    pub correction_s: f64,
    /// Per device.
    pub devices: Vec<DeviceSummary>,
    /// How the run ended.
    pub stopped: String,
    /// T_ver(K, L) the planner ended the run with: the profile's, or the fit over every timed pass; None where
    /// nothing was planned (plain decoding) or each device's run had its own (P2P-SPIN).
    pub verify_model: Option<crate::controller::VerifyModel>,
}

/// What a device's drafted tokens carried up in a round (the trace's `payload`: `"distributions"` or `"pairs"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UplinkPayload {
    /// Each token with its truncated, quantised distribution (paper A).
    Distributions,
    /// (token, probability) pairs (paper B).
    Pairs,
}

/// How a device's round ended (the trace's `mode`, by these lowercase names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RoundOutcome {
    /// Corrected or bonus token drawn at the server.
    Server,
    /// Paper B's uplink correction (the device uploaded q_r).
    Ul,
    /// Paper B's downlink correction (the device drew from the downloaded p_r).
    Dl,
    /// The draft arrived after the round deadline (on the run's clock).
    Dropped,
    /// No draft within the wall deadline (virtual clock).
    Silent,
    /// The device disconnected or was refused during the round.
    Lost,
}

impl UplinkPayload {
    /// The trace's name.
    pub fn name(self) -> &'static str {
        match self {
            UplinkPayload::Distributions => "distributions",
            UplinkPayload::Pairs => "pairs",
        }
    }
}

impl RoundOutcome {
    /// The trace's name.
    pub fn name(self) -> &'static str {
        match self {
            RoundOutcome::Server => "server",
            RoundOutcome::Ul => "ul",
            RoundOutcome::Dl => "dl",
            RoundOutcome::Dropped => "dropped",
            RoundOutcome::Silent => "silent",
            RoundOutcome::Lost => "lost",
        }
    }

    /// Whether the device's draft was verified this round (the rounds that carry acceptance information).
    pub fn verified(self) -> bool {
        matches!(self, RoundOutcome::Server | RoundOutcome::Ul | RoundOutcome::Dl)
    }
}

/// Compared with the trace's names, so that `mode == "dropped"` reads as the JSON does.
impl PartialEq<&str> for RoundOutcome {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

impl PartialEq<&str> for UplinkPayload {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}
