//! Exhaustive search over every draft-length vector (small instances only): the reference the exact planner is
//! tested against. Bandwidth by Lemma 3 for each vector, so the result is the integer optimum of (P2).

use super::bandwidth::{lemma3_bandwidth, lemma3_latency_s};
use super::scenario::{Optimality, Plan, Scenario};
use crate::OptimizeError;

/// The default largest number of draft-length vectors `brute_force` visits (L_max^K ≤ 2·10⁶, e.g. 25⁴ = 390,625
/// or 10⁶ for K = 6, L_max = 10).
pub const BRUTE_FORCE_LIMIT: u128 = 2_000_000;

/// The number of vectors an exhaustive search visits, saturating.
pub fn search_size(s: &Scenario) -> u128 {
    let per = u128::from(s.max_draft_len - s.min_draft_len + 1);
    (0..s.len()).fold(1u128, |acc, _| acc.saturating_mul(per))
}

/// The integer optimum of (P2) by enumeration; refuses with `TooLarge` (naming `devices`) above `limit` vectors.
pub fn brute_force(s: &Scenario, limit: u128) -> Result<Plan, OptimizeError> {
    let size = search_size(s);
    if size > limit {
        return Err(OptimizeError::TooLarge {
            field: "devices".into(),
            size,
            limit,
        });
    }
    let verify = s.verify_s();
    let mut lens = vec![s.min_draft_len; s.len()];
    let mut best = (f64::NEG_INFINITY, lens.clone());
    loop {
        let tokens = s.expected_tokens_sum(&lens);
        let tau = tokens / (lemma3_latency_s(s, &lens) + verify);
        if tau > best.0 {
            best = (tau, lens.clone());
        }
        // Odometer step.
        let mut k = 0;
        loop {
            if k == lens.len() {
                let (_, bandwidth) = lemma3_bandwidth(s, &best.1);
                let mut plan = Plan::evaluated(s, best.1, bandwidth)?;
                plan.optimality = Optimality::Optimal;
                return Ok(plan);
            }
            if lens[k] < s.max_draft_len {
                lens[k] += 1;
                break;
            }
            lens[k] = s.min_draft_len;
            k += 1;
        }
    }
}
