//! Paper B: uplink or downlink correction, downlink power and proactive draft control.
//!
//! After batched verification, every device with a rejected draft exchanges one vocabulary-wide distribution,
//! uploading its draft distribution (UL mode) or downloading the target distribution (DL mode). The server picks
//! the modes and DL powers once the outcomes are known ([`reactive`]) and the draft lengths before ([`proactive`]),
//! scoring candidates by sample-average approximation ([`saa`]). The model as implemented is in `docs/paper-b.md`.

pub mod proactive;
pub mod reactive;
pub mod saa;
pub mod scenario;

pub use proactive::Plan;
pub use reactive::{CorrectionPlan, Link, Mode, ModeScheme};
pub use saa::{Objective, SaaEvaluator, SaaStats, Samples};
pub use scenario::{DeviceSpec, Scenario, ScenarioSpec};
