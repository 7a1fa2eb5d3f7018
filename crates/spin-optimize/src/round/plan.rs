//! A round's plan: the decisions (draft lengths, uplink shares, payload per device, correction rule) and what the
//! unified model predicts for them, with how that prediction was taken ([`PlanEstimate`]).

use super::scheme::Scheme;
use super::spec::CorrectionSplit;
use crate::paper_b::{ModeScheme, Objective};

/// How the rejected devices are corrected: the mode rule and the band split; DL powers follow Lemma 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CorrectionPolicy {
    /// The mode rule (paper B's reactive schemes; `optimal` is Proposition 1).
    pub modes: ModeScheme,
    /// The split of the correction band.
    pub split: CorrectionSplit,
}

impl Default for CorrectionPolicy {
    fn default() -> Self {
        CorrectionPolicy {
            modes: ModeScheme::Optimal,
            split: CorrectionSplit::Equal,
        }
    }
}

/// One round's decisions and what the unified model predicts for them.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundPlan {
    /// The scheme that made the plan.
    pub scheme: Scheme,
    /// L_k per device.
    pub draft_lengths: Vec<u32>,
    /// B_k of the draft uplink per device in Hz (Σ ≤ B; 0 for a device with nothing to send).
    pub uplink_share_hz: Vec<f64>,
    /// Per device: true = distributions per token (paper A), false = pairs (paper B).
    pub sends_distributions: Vec<bool>,
    /// The correction rule for the rejected devices (DL powers by Lemma 1).
    pub correction: CorrectionPolicy,
    /// The predicted goodput E\[ΣN\]/E\[T\] (renewal–reward) in tokens/s.
    pub rate_tokens_per_s: f64,
    /// The predicted mean per-round goodput E[ΣN/T] in tokens/s.
    pub mean_ratio_tokens_per_s: f64,
    /// E\[ΣN\], tokens per round.
    pub tokens_per_round: f64,
    /// Drafting and draft upload, max_k L_k (T_k^S + u_k/(B_k r_k)), seconds.
    pub uplink_latency_s: f64,
    /// T_ver(K) in seconds.
    pub verify_s: f64,
    /// E\[T_comm\] of the correction phase in seconds.
    pub comm_delay_s: f64,
    /// Whether the planner proved this plan optimal for its objective (exact search completed).
    pub proven_optimal: bool,
    /// How the predicted numbers were taken: exactly, or as a sample average with its confidence intervals.
    pub estimate: PlanEstimate,
}

/// How the expectation behind a [`RoundPlan`]'s numbers was taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PlanEstimate {
    /// The exact expectation: every rejection outcome enumerated, or none that changes the round (tokens in
    /// closed form, no correction phase).
    Exact,
    /// A sample-average approximation over `samples` outcome samples with the half-widths of its 95 % confidence
    /// intervals (normal approximation; the rate's by the delta method for a ratio of means). `None` below two
    /// samples.
    Saa {
        /// Outcome samples N_SAA.
        samples: u32,
        /// Half-width of the 95 % interval of `rate_tokens_per_s`.
        rate_ci95_tokens_per_s: Option<f64>,
        /// Half-width of the 95 % interval of `mean_ratio_tokens_per_s`.
        mean_ratio_ci95_tokens_per_s: Option<f64>,
    },
}

impl PlanEstimate {
    /// Whether the numbers are the exact expectation.
    pub fn is_exact(&self) -> bool {
        matches!(self, PlanEstimate::Exact)
    }

    /// The 95 % half-width of the goodput under `objective` (0 when exact, `None` when unknown).
    pub fn ci95(&self, objective: Objective) -> Option<f64> {
        match *self {
            PlanEstimate::Exact => Some(0.0),
            PlanEstimate::Saa {
                rate_ci95_tokens_per_s,
                mean_ratio_ci95_tokens_per_s,
                ..
            } => match objective {
                Objective::Rate => rate_ci95_tokens_per_s,
                Objective::MeanRatio => mean_ratio_ci95_tokens_per_s,
            },
        }
    }
}

impl RoundPlan {
    /// The plan of a round without devices: nothing drafted, nothing predicted.
    pub fn idle(scheme: Scheme, correction: CorrectionPolicy) -> RoundPlan {
        RoundPlan {
            scheme,
            draft_lengths: vec![],
            uplink_share_hz: vec![],
            sends_distributions: vec![],
            correction,
            rate_tokens_per_s: 0.0,
            mean_ratio_tokens_per_s: 0.0,
            tokens_per_round: 0.0,
            uplink_latency_s: 0.0,
            verify_s: 0.0,
            comm_delay_s: 0.0,
            proven_optimal: false,
            estimate: PlanEstimate::Exact,
        }
    }

    /// The goodput under `objective`.
    pub fn goodput(&self, objective: Objective) -> f64 {
        match objective {
            Objective::Rate => self.rate_tokens_per_s,
            Objective::MeanRatio => self.mean_ratio_tokens_per_s,
        }
    }
}
