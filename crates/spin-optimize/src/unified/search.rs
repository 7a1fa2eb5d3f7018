//! The unified planner: seeds from both papers' best planners, coordinate search on the unified objective, and a
//! branch and bound over draft-length boxes that proves the optimum where the instance is small enough.
//!
//! For fixed draft lengths L and payload choice z, Lemma 3's shares minimise the uplink latency, and both
//! objectives fall with it, so the shares are optimal (docs/unified.md); per outcome the modes of Proposition 1 with
//! Lemma-1 powers minimise T_comm. What remains is a search over (L, z). The branch and bound splits the box
//! [L_min, L_max]^K (for every z) and drops a box when N(hi)/T(lo) — an upper bound, because tokens, uplink latency
//! and every outcome's T_comm all rise with each L_k — is not above the incumbent.

use super::model::{Change, Evaluator, Expectation, Scratch, State};
use crate::OptimizeError;
use crate::paper_a;
use crate::paper_b::{self, ModeScheme, Objective};
use crate::round::plan::{CorrectionPolicy, RoundPlan};
use crate::round::scheme::Scheme;
use crate::round::spec::{PayloadPolicy, Round};

/// Options of the unified planner.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// The objective maximised: E\[ΣN\]/E\[T\] (default) or E[ΣN/T].
    pub objective: Objective,
    /// How the expectation over outcomes is taken.
    pub expectation: Expectation,
    /// The correction rule.
    pub correction: CorrectionPolicy,
    /// Seed the search with paper B's `best` plan up to this many devices (above, with its uniform plan):
    /// `best` costs about as much as the rest of the planner at K = 20 and far more at K = 200.
    pub paper_b_best_max_devices: usize,
    /// Run the branch and bound when the number of (L, z) points is at most this.
    pub exact_space_limit: u128,
    /// The most boxes the branch and bound visits before it gives up proving optimality.
    pub exact_node_limit: usize,
    /// Pair moves (+1 on one device, −1 on another) when single moves stall, up to this many devices.
    pub pair_moves_max_devices: usize,
    /// A wall-clock deadline for a caller that plans on the real clock (a server between rounds): paper B's
    /// `best` seed stops its exhaustive step there ([`paper_b::proactive::best_until`]) and the branch and bound
    /// stops proving (the plan is then not `proven_optimal`); the seeds and local searches always complete. None
    /// (the default): no clock is read and the plan is reproducible.
    pub deadline: Option<std::time::Instant>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            objective: Objective::Rate,
            expectation: Expectation::Auto { limit: 4096 },
            correction: CorrectionPolicy::default(),
            paper_b_best_max_devices: 64,
            exact_space_limit: 50_000_000,
            exact_node_limit: 200_000,
            pair_moves_max_devices: 64,
            deadline: None,
        }
    }
}

/// What the search did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SearchStats {
    /// Points evaluated in full.
    pub evaluations: usize,
    /// Candidate moves scored incrementally (pruned ones included).
    pub moves: usize,
    /// Candidate moves dropped by a bound before any T_comm was recomputed.
    pub pruned: usize,
    /// Boxes of the branch and bound.
    pub boxes: usize,
    /// Whether the branch and bound completed (the plan is then optimal up to a relative 1e−12).
    pub proven_optimal: bool,
}

/// The unified model's planner as a [`crate::round::Planner`] (the impl is in `round::planner`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct UnifiedPlanner {
    /// Its options.
    pub options: Options,
}

/// Plans `round` with the unified planner.
pub fn plan(round: &Round, options: &Options) -> Result<RoundPlan, OptimizeError> {
    plan_with_stats(round, options).map(|(p, _)| p)
}

/// A relative margin below which a bound does not beat the incumbent (only stops splitting on exact ties).
const TIE_TOLERANCE: f64 = 1e-12;

struct Search<'e> {
    ev: &'e Evaluator,
    objective: Objective,
    best: Option<State>,
    stats: SearchStats,
    scratch: Scratch,
}

impl Search<'_> {
    fn offer(&mut self, s: State) {
        if self.best.as_ref().is_none_or(|b| s.value > b.value) {
            self.best = Some(s);
        }
    }

    fn state(&mut self, draft_lengths: &[u32], sends_distributions: &[bool]) -> Result<State, OptimizeError> {
        self.stats.evaluations += 1;
        self.ev.state(draft_lengths, sends_distributions, self.objective)
    }

    /// The value of `changes` if it may beat `threshold` (`None` only when a bound proves it cannot).
    fn try_above(&mut self, state: &State, changes: &[Change], threshold: f64) -> Option<f64> {
        self.stats.moves += 1;
        let v = self
            .ev
            .try_moves_above(state, changes, self.objective, threshold, &mut self.scratch);
        if v.is_none() {
            self.stats.pruned += 1;
        }
        v
    }

    /// Coordinate search: sweeps over the devices, each taking its best improving move among ±1 on its length
    /// and a payload flip (policy `choose`, also with ±1); then ±1 on every device together; when a sweep finds
    /// nothing, the best pair move (+1 on one device, −1 on another, up to `pair_limit` devices). Ends at a point
    /// no such move improves.
    fn local_search(&mut self, start: State, pair_limit: usize, flips: bool) -> State {
        let ev = self.ev;
        let range = ev.draft_range();
        let (l_min, l_max) = (*range.start(), *range.end());
        let choose = flips && ev.payload() == PayloadPolicy::Choose;
        let k_n = ev.devices();
        let mut state = start;
        let mut changes: Vec<Change> = Vec::with_capacity(k_n);
        let mut candidates: Vec<Change> = Vec::with_capacity(6);
        loop {
            let mut improved = false;
            for k in 0..k_n {
                let (l, d) = (state.draft_lengths[k], state.sends_distributions[k]);
                candidates.clear();
                for flip in if choose { &[false, true][..] } else { &[false][..] } {
                    let nd = d ^ flip;
                    if *flip {
                        candidates.push((k, l, nd));
                    }
                    if l < l_max {
                        candidates.push((k, l + 1, nd));
                    }
                    if l > l_min {
                        candidates.push((k, l - 1, nd));
                    }
                }
                let mut best: Option<(f64, Change)> = None;
                for &c in &candidates {
                    let threshold = best.map_or(state.value, |b| b.0);
                    if let Some(v) = self.try_above(&state, &[c], threshold)
                        && v > threshold
                    {
                        best = Some((v, c));
                        self.ev.keep_last_try(&state, &[c], &mut self.scratch);
                    }
                }
                if let Some((_, c)) = best {
                    self.apply(&mut state, &[c]);
                    improved = true;
                }
            }
            for up in [true, false] {
                changes.clear();
                for k in 0..k_n {
                    let l = state.draft_lengths[k];
                    let to = if up {
                        (l + 1).min(l_max)
                    } else {
                        l.saturating_sub(1).max(l_min)
                    };
                    if to != l {
                        changes.push((k, to, state.sends_distributions[k]));
                    }
                }
                if !changes.is_empty()
                    && self
                        .try_above(&state, &changes, state.value)
                        .is_some_and(|v| v > state.value)
                {
                    self.ev.keep_last_try(&state, &changes, &mut self.scratch);
                    let moves = changes.clone();
                    self.apply(&mut state, &moves);
                    improved = true;
                }
            }
            if !improved && k_n <= pair_limit {
                let mut best: Option<(f64, [Change; 2])> = None;
                for i in 0..k_n {
                    for j in 0..k_n {
                        let (li, lj) = (state.draft_lengths[i], state.draft_lengths[j]);
                        if i != j && li < l_max && lj > l_min {
                            let m = [
                                (i, li + 1, state.sends_distributions[i]),
                                (j, lj - 1, state.sends_distributions[j]),
                            ];
                            let threshold = best.map_or(state.value, |b| b.0);
                            if let Some(v) = self.try_above(&state, &m, threshold)
                                && v > threshold
                            {
                                best = Some((v, m));
                                self.ev.keep_last_try(&state, &m, &mut self.scratch);
                            }
                        }
                    }
                }
                if let Some((_, m)) = best {
                    self.apply(&mut state, &m);
                    improved = true;
                }
            }
            if !improved {
                return state;
            }
        }
    }

    fn apply(&mut self, state: &mut State, changes: &[Change]) {
        self.stats.evaluations += 1;
        self.ev
            .apply_moves(state, changes, self.objective, &mut self.scratch);
    }

    /// Branch and bound over boxes of draft lengths at payload choice `sends_distributions`; false if the node
    /// limit or the deadline stopped it.
    fn branch_and_bound(
        &mut self,
        sends_distributions: &[bool],
        node_limit: usize,
        deadline: Option<std::time::Instant>,
    ) -> Result<bool, OptimizeError> {
        let ev = self.ev;
        let range = ev.draft_range();
        let k_n = ev.devices();
        let mut stack = vec![(vec![*range.start(); k_n], vec![*range.end(); k_n])];
        while let Some((lo, hi)) = stack.pop() {
            self.stats.boxes += 1;
            if self.stats.boxes > node_limit || deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(false);
            }
            let (upper, at_lo) =
                ev.box_bound(&lo, &hi, sends_distributions, self.objective, &mut self.scratch);
            let incumbent = self.best.as_ref().map_or(0.0, |b| b.value);
            if at_lo > incumbent {
                let s = self.state(&lo, sends_distributions)?;
                self.offer(s);
            }
            let incumbent = self.best.as_ref().map_or(0.0, |b| b.value);
            if upper <= incumbent * (1.0 + TIE_TOLERANCE) || lo == hi {
                continue;
            }
            // Split the widest coordinate; explore the upper half first (longer drafts usually win).
            let k = (0..k_n)
                .max_by_key(|&k| (hi[k] - lo[k], std::cmp::Reverse(k)))
                .unwrap_or(0);
            let mid = lo[k] + (hi[k] - lo[k]) / 2;
            let (mut lo_hi, mut hi_lo) = (hi.clone(), lo.clone());
            lo_hi[k] = mid;
            hi_lo[k] = mid + 1;
            stack.push((lo, lo_hi));
            stack.push((hi_lo, hi));
        }
        Ok(true)
    }
}

/// The number of (L, z) points of the round's search space, saturating.
pub fn search_space(round: &Round) -> u128 {
    let per = u128::from(round.max_draft_len - round.min_draft_len + 1)
        * if round.payload.policy == PayloadPolicy::Choose {
            2
        } else {
            1
        };
    (0..round.len()).fold(1u128, |acc, _| acc.saturating_mul(per))
}

/// Plans `round`, returning what the search did.
pub fn plan_with_stats(round: &Round, options: &Options) -> Result<(RoundPlan, SearchStats), OptimizeError> {
    plan_with_paper_b_best(round, options, None)
}

/// [`plan_with_stats`] for a caller that has already run paper B's `best` search on this round
/// (`paper_b::proactive::best` on `round.to_paper_b()` with optimal modes and `options.objective`, as the `best`
/// scheme does): its draft lengths seed the search instead of a second run of that search. The plan then is never
/// below the given one; passing anything else only changes a starting point. An error names `paper_b_best` when its
/// length is not the number of devices.
pub fn plan_with_paper_b_best(
    round: &Round,
    options: &Options,
    paper_b_best: Option<&[u32]>,
) -> Result<(RoundPlan, SearchStats), OptimizeError> {
    if let Some(g) = paper_b_best
        && g.len() != round.len()
    {
        return Err(OptimizeError::Invalid {
            field: "paper_b_best".into(),
            reason: format!("{} draft lengths for {} devices", g.len(), round.len()),
        });
    }
    let ev = Evaluator::new(round, options.expectation, options.correction)?;
    let k_n = round.len();
    let policy = round.payload.policy;
    let mut search = Search {
        ev: &ev,
        objective: options.objective,
        best: None,
        stats: SearchStats::default(),
        scratch: Scratch::default(),
    };
    let range = ev.draft_range();
    let l_min = *range.start();
    let mut seeds: Vec<(Vec<u32>, Vec<bool>)> = Vec::new();
    let mut paper_a_exact = false;
    if policy.allows_distribution() {
        let s = round.to_paper_a()?;
        let p = paper_a::exact::exact(&s)?;
        // Without a correction phase and with L ≥ 1 the unified objective is paper A's (P2): its exact planner
        // is then exact here too.
        paper_a_exact = policy == PayloadPolicy::Distribution && l_min >= 1;
        seeds.push((p.draft_lengths, vec![true; k_n]));
    }
    if policy.allows_pair() {
        let s = round.to_paper_b()?;
        let pb = || paper_b::SaaEvaluator::new(&s, ModeScheme::Optimal, options.objective);
        let mut push =
            |g: Vec<u32>| seeds.push((g.into_iter().map(|l| l.max(l_min)).collect(), vec![false; k_n]));
        if k_n <= options.paper_b_best_max_devices {
            match paper_b_best {
                Some(g) => push(g.to_vec()),
                None => push(paper_b::proactive::best_until(&pb()?, options.deadline).draft_lengths),
            }
        } else {
            // Paper B's greedy costs O(K²) SAA moves per unit of length; its uniform plan is cheap.
            push(paper_b::proactive::uniform(&pb()?).draft_lengths);
        }
        if policy == PayloadPolicy::Choose {
            // Mixed start: every device keeps the paper-B length and sends distributions when that alone helps.
            if let Some((g, _)) = seeds.last().cloned() {
                seeds.push((g, vec![true; k_n]));
            }
        }
    }
    if policy.allows_distribution() {
        seeds.push((vec![l_min; k_n], vec![true; k_n]));
    }
    if policy.allows_pair() {
        seeds.push((vec![l_min; k_n], vec![false; k_n]));
    }
    for (draft_lengths, sends_distributions) in seeds {
        let start = search.state(&draft_lengths, &sends_distributions)?;
        search.offer(start.clone());
        if !paper_a_exact {
            // First without payload flips (so `choose` never ends below the single-payload searches from the same
            // seeds), then with them.
            let end = search.local_search(start, options.pair_moves_max_devices, false);
            search.offer(end.clone());
            if policy == PayloadPolicy::Choose {
                let end = search.local_search(end, options.pair_moves_max_devices, true);
                search.offer(end);
            }
        }
    }
    let mut proven = paper_a_exact;
    if !proven && search_space(round) <= options.exact_space_limit {
        proven = true;
        let z_sets: Vec<Vec<bool>> = match policy {
            PayloadPolicy::Distribution => vec![vec![true; k_n]],
            PayloadPolicy::Pair => vec![vec![false; k_n]],
            PayloadPolicy::Choose => (0..1u64 << k_n.min(63))
                .map(|mask| (0..k_n).map(|k| mask >> k & 1 == 1).collect())
                .collect(),
        };
        for z in z_sets {
            if !search.branch_and_bound(&z, options.exact_node_limit, options.deadline)? {
                proven = false;
                break;
            }
        }
    }
    search.stats.proven_optimal = proven;
    let best = search.best.ok_or_else(|| OptimizeError::Infeasible {
        reason: "unified planner: no plan evaluated".into(),
    })?;
    let (_, shares) = ev.lemma3_shares(&best.draft_lengths, &best.sends_distributions);
    let plan = ev.round_plan(
        Scheme::Unified,
        &best.draft_lengths,
        &best.sends_distributions,
        &shares,
        proven,
    )?;
    Ok((plan, search.stats))
}
