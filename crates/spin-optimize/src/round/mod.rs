//! One planning vocabulary for both papers: a [`Round`] (devices, band, radio, payload, T_ver), a [`RoundPlan`]
//! (draft lengths, uplink shares, payload choice, correction policy), the [`Scheme`] names of every planner and
//! the [`Planner`] trait with adapters that run paper A's and paper B's planners on a `Round`.
//!
//! The model a `Round` describes is the unified model of docs/unified.md; paper A's and paper B's rounds are its
//! two special cases ([`Round::from_paper_a`], [`Round::from_paper_b`]). The payload sizes come from
//! `spin_core::dist::payload_bits` (D = V_eff(⌈log₂V⌉ + Q)), the radio formulas from `spin-channel`.
//!
//! [`spec`] holds the round, [`plan`] the plan, [`scheme`] the scheme names, [`planner`](mod@planner) the [`Planner`] trait and
//! its implementations.

pub mod plan;
pub mod planner;
pub mod scheme;
pub mod spec;

pub use plan::{CorrectionPolicy, PlanEstimate, RoundPlan};
pub use planner::{PaperPlanner, Planner, plan_paper_a, plan_paper_b, planner};
pub use scheme::{Family, Scheme};
pub use spec::{
    CorrectionSplit, DistributionFormat, MAX_DRAFT_LEN_LIMIT, PayloadPolicy, Radio, Round, RoundDevice,
    RoundSpec, TokenPayload, full_band_spectral_efficiency, verify_seconds,
};
