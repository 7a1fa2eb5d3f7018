//! The unified model (docs/unified.md): both papers' rounds in one — OFDMA draft upload with a per-device payload
//! (distributions per token as in paper A, or token–probability pairs as in paper B), batched verification, and one
//! UL or DL distribution exchange per rejected pair-sending device with Lemma-1 DL powers — and its planner.
//!
//! [`model`] evaluates the expected goodput (renewal–reward rate and mean ratio) over exactly enumerated or sampled
//! outcomes; [`search`] plans draft lengths, payloads and shares, proving optimality where the instance is small.

pub mod model;
pub mod search;
pub mod testing;

pub use model::{Evaluator, Expectation, Scratch, State, lemma3_shares, score};
pub use search::{
    Options, SearchStats, UnifiedPlanner, plan, plan_with_paper_b_best, plan_with_stats, search_space,
};
