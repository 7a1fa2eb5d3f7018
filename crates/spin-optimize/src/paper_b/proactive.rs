//! Proactive draft-length control (paper B §V): the paper's two-phase greedy, its baselines and a stronger search.
//!
//! All schemes score candidates with one [`SaaEvaluator`] (one set of outcome samples), so their values compare
//! exactly. Schemes:
//! - `greedy` (paper B, §V-A): from γ = 0 ⟨C⟩, phase 1 adds the all-ones vector while that improves; phase 2
//!   raises the single γ_k with the largest improvement while any improves.
//! - `uniform`: the best common γ ∈ {0..γ_max} (exhaustive).
//! - `comp-only`: the γ maximising Σ E[N_k(γ_k)] / (max_k γ_k T_k^dft + T_ver), i.e. ignoring communication,
//!   solved exactly by enumerating the drafting deadline; then scored with communication.
//! - `best` (beyond the paper): best-improvement local search with ±1 single moves, ±1 common shifts and, when the
//!   singles stall, pair moves (+1 on one device, −1 on another), from four starts (zeros, greedy, uniform,
//!   comp-only), each stopped at a local optimum or after a step cap; exhaustive when (γ_max + 1)^K is small.
//!   Never below greedy or uniform on the same samples.
//! - `exhaustive`: every vector of {0..γ_max}^K (tiny K only).

use super::saa::{BOUND_MARGIN, Objective, SaaEvaluator, SaaScratch, SaaState};
use crate::OptimizeError;
use spin_core::expected_accepted;
use std::collections::{HashMap, HashSet};
use std::time::Instant;

/// The largest number of draft-length vectors the exhaustive scheme visits.
pub const EXHAUSTIVE_LIMIT: u128 = 200_000;
/// `best` adds an exhaustive search when the space has at most this many points.
pub const BEST_EXHAUSTIVE_LIMIT: u128 = 20_000;
/// `best` tries pair moves only up to this many devices (K(K − 1) candidates per step).
pub const PAIR_MOVES_MAX_DEVICES: usize = 64;
/// Improving steps each local search of `best` may take, per device and draft level: a start walks at most
/// 4·K·(γ_max + 1) steps (four times the K·γ_max of a climb from zeros to γ_max everywhere) before it stops with the
/// best point so far. Every step strictly improves the objective, so the search also ends at a local optimum; the
/// cap makes its worst case a bound rather than a property of the landscape (docs/paper-b.md).
pub const LOCAL_SEARCH_STEPS_PER_LEVEL: usize = 4;

/// A chosen draft-length vector with its SAA objective value.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// γ_k per device.
    pub draft_lengths: Vec<u32>,
    /// The objective (tokens/s) on the evaluator's samples.
    pub value: f64,
}

impl Plan {
    /// Mean draft length over the devices.
    pub fn mean_draft_len(&self) -> f64 {
        self.draft_lengths.iter().map(|&g| f64::from(g)).sum::<f64>() / self.draft_lengths.len() as f64
    }
}

fn to_plan(state: SaaState) -> Plan {
    Plan {
        draft_lengths: state.draft_lengths,
        value: state.value,
    }
}

/// Paper B's greedy: all-ones updates from γ = 0, then single-coordinate increases, best first.
pub fn greedy(ev: &SaaEvaluator) -> Plan {
    Planner::new(ev).greedy()
}

/// The optimal common draft length γ ∈ {0..γ_max}.
pub fn uniform(ev: &SaaEvaluator) -> Plan {
    Planner::new(ev).uniform()
}

/// The draft lengths a computation-only controller picks: maximise Σ_k E[N_k | γ_k] / (max_k γ_k T_k + T_ver).
///
/// For a drafting deadline t every device drafts as long as it can, γ_k = min(γ_max, ⌊t / T_k⌋) (E[N|γ] rises in
/// γ); the optimum is among the deadlines t ∈ {0} ∪ {γ T_k}. Exact, deterministic (no samples).
pub fn comp_only_lengths(
    acceptance: &[f64],
    draft_token_s: &[f64],
    verify_s: f64,
    max_draft_len: u32,
) -> Vec<u32> {
    // Every deadline once, in the order of first appearance: a repeated deadline gives the same lengths and value,
    // which never beat the first (devices often share a drafting speed).
    // A repeated drafting speed repeats all its deadlines, so each speed is visited once (in order of first
    // appearance too): the same deadlines in the same order, with fewer set lookups.
    let mut deadlines = vec![0.0];
    let mut seen: HashSet<u64> = HashSet::from([0.0f64.to_bits()]);
    let mut speeds: HashSet<u64> = HashSet::new();
    for &t in draft_token_s {
        if !speeds.insert(t.to_bits()) {
            continue;
        }
        for g in 1..=max_draft_len {
            let d = f64::from(g) * t;
            if seen.insert(d.to_bits()) {
                deadlines.push(d);
            }
        }
    }
    let lengths_at = |deadline: f64| -> Vec<u32> {
        draft_token_s
            .iter()
            .map(|&t| {
                // x ≥ 0, so ⌊x⌋ ≥ γ_max iff x ≥ γ_max, and below it ⌊x⌋ is the truncation `as` takes.
                let x = deadline / t * (1.0 + 1e-12);
                if x >= f64::from(max_draft_len) {
                    max_draft_len
                } else {
                    x as u32
                }
            })
            .collect()
    };
    // E[N_k | γ] for every device and length, computed once instead of once per deadline (the same values).
    let levels = max_draft_len as usize + 1;
    let expected: Vec<f64> = acceptance
        .iter()
        .flat_map(|&a| (0..=max_draft_len).map(move |g| expected_accepted(a, g)))
        .collect();
    let mut best = (f64::NEG_INFINITY, vec![0; acceptance.len()]);
    for d in deadlines {
        let draft_lengths = lengths_at(d);
        let draft = draft_lengths
            .iter()
            .zip(draft_token_s)
            .map(|(&g, t)| f64::from(g) * t)
            .fold(0.0, f64::max);
        let tokens: f64 = draft_lengths
            .iter()
            .enumerate()
            .map(|(k, &g)| expected[k * levels + g as usize])
            .sum();
        let v = tokens / (draft + verify_s);
        if v > best.0 {
            best = (v, draft_lengths);
        }
    }
    best.1
}

/// Computation-only control, scored with communication on the evaluator's samples.
pub fn comp_only(ev: &SaaEvaluator) -> Plan {
    let draft_lengths = comp_only_lengths(
        ev.acceptance(),
        ev.draft_token_s(),
        ev.verify_s(),
        ev.max_draft_len(),
    );
    to_plan(ev.state(&draft_lengths))
}

/// Exhaustive search over {0..γ_max}^K; refuses more than `limit` points.
pub fn exhaustive(ev: &SaaEvaluator, limit: u128) -> Result<Plan, OptimizeError> {
    exhaustive_until(ev, limit, None)
}

/// Points the exhaustive search scores between two looks at its deadline.
const DEADLINE_STRIDE: u128 = 32;

/// [`exhaustive`] for a caller on the wall clock: with a `deadline`, it looks at the clock every
/// 32 points (`DEADLINE_STRIDE`) and stops with the best vector scored so far as soon as the deadline has passed or
/// the points left, at the pace so far, would end after it (so a search that cannot finish in time costs one
/// stride, not the whole budget). Without a deadline it reads no clock and is [`exhaustive`].
pub fn exhaustive_until(
    ev: &SaaEvaluator,
    limit: u128,
    deadline: Option<Instant>,
) -> Result<Plan, OptimizeError> {
    let k_n = ev.devices();
    let g_max = ev.max_draft_len();
    let size = (0..k_n).fold(1u128, |acc, _| acc.saturating_mul(u128::from(g_max) + 1));
    if size > limit {
        return Err(OptimizeError::TooLarge {
            field: "devices".into(),
            size,
            limit,
        });
    }
    let mut draft_lengths = vec![0u32; k_n];
    let mut best = ev.state(&draft_lengths);
    let start = deadline.map(|_| Instant::now());
    let mut scored = 1u128;
    loop {
        if let (Some(d), Some(start)) = (deadline, start)
            && scored.is_multiple_of(DEADLINE_STRIDE)
        {
            let now = Instant::now();
            let per_point = now.duration_since(start).as_secs_f64() / scored as f64;
            let rest = per_point * size.saturating_sub(scored) as f64;
            if now >= d || rest > d.duration_since(now).as_secs_f64() {
                return Ok(to_plan(best));
            }
        }
        let mut k = 0;
        while k < k_n {
            if draft_lengths[k] < g_max {
                draft_lengths[k] += 1;
                break;
            }
            draft_lengths[k] = 0;
            k += 1;
        }
        if k == k_n {
            return Ok(to_plan(best));
        }
        let v = ev.value(&draft_lengths);
        scored += 1;
        if v > best.value {
            best = ev.state(&draft_lengths);
        }
    }
}

/// The most improving steps one local search of `best` takes on `ev`
/// ([`LOCAL_SEARCH_STEPS_PER_LEVEL`]·K·(γ_max + 1)).
pub fn local_search_step_cap(ev: &SaaEvaluator) -> usize {
    LOCAL_SEARCH_STEPS_PER_LEVEL
        .saturating_mul(ev.devices())
        .saturating_mul(ev.max_draft_len() as usize + 1)
}

/// Where the value of a candidate move was computed, so that applying the winner reuses that work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The planner's `kept` buffers (a single or pair move).
    Kept,
    /// The buffers of shift `0` (up) or `1` (down).
    Shift(usize),
    /// The common draft length `g`, evaluated in full by [`Planner::uniform_state`].
    Uniform(u32),
}

/// A scored move: its value, where it was scored, and its one or two changes (the first `usize` in use; a shift's
/// changes are rebuilt from the state).
type Candidate = (f64, Source, [(usize, u32); 2], usize);

/// One planning call's shared work: the full states of the common draft lengths (greedy's first phase, `uniform`
/// and the common shifts of the local search from a common point all visit them) and reusable buffers. Every
/// value it returns is the one a full evaluation gives, bit for bit; the shortcuts only skip work:
/// - a move is scored only when [`SaaEvaluator::upper_bound`] does not rule it out against the best value already
///   known (the state's, or a better candidate's), by more than [`BOUND_MARGIN`]: a skipped move could never have
///   been chosen, as the searches keep the first candidate with the largest value;
/// - the chosen move is applied from the buffers that scored it ([`SaaEvaluator::apply_moves`]) instead of a full
///   evaluation of the new point;
/// - a local search that reaches a point on the path of an earlier one that ended at a local optimum, with at
///   least as many steps left, stops there: it would retrace that path to the same end point, already kept.
struct Planner<'a> {
    ev: &'a SaaEvaluator,
    uniform: Vec<Option<SaaState>>,
    /// Whether `uniform` keeps the states (γ_max + 1 of them, N samples each).
    keep_uniform: bool,
    work: SaaScratch,
    kept: SaaScratch,
    shift: [SaaScratch; 2],
    changes: Vec<(usize, u32)>,
    /// Points on the paths of finished local searches that ended at a local optimum: the steps left to that end.
    converged: HashMap<Vec<u32>, usize>,
    /// Draft lengths held in `converged` (at most [`PATH_MEMORY_LIMIT`]).
    remembered: usize,
}

/// The most samples (N per common draft length, γ_max + 1 lengths) whose common-length states a planner keeps:
/// 2^20, about 16 MiB of per-sample totals. Above it they are evaluated again when asked, which only costs time.
const UNIFORM_MEMORY_LIMIT: usize = 1 << 20;

/// The most draft lengths (K per point) the paths of `best`'s local searches keep for the shortcut that stops a
/// search on an earlier path: 2^22 (16 MiB). A path that would exceed it is not kept, which only costs time.
const PATH_MEMORY_LIMIT: usize = 1 << 22;

impl<'a> Planner<'a> {
    fn new(ev: &'a SaaEvaluator) -> Self {
        Planner {
            ev,
            uniform: vec![None; ev.max_draft_len() as usize + 1],
            keep_uniform: (ev.max_draft_len() as usize + 1).saturating_mul(ev.samples().count())
                <= UNIFORM_MEMORY_LIMIT,
            work: SaaScratch::default(),
            kept: SaaScratch::default(),
            shift: [SaaScratch::default(), SaaScratch::default()],
            changes: Vec::with_capacity(ev.devices()),
            converged: HashMap::new(),
            remembered: 0,
        }
    }

    /// The full state at γ = (g, …, g): evaluated once when the planner keeps them (see
    /// [`UNIFORM_MEMORY_LIMIT`]), else each time.
    fn uniform_state(&mut self, g: u32) -> SaaState {
        if let Some(s) = &self.uniform[g as usize] {
            return s.clone();
        }
        let s = self.ev.state_with(&vec![g; self.ev.devices()], &mut self.work);
        if self.keep_uniform {
            self.uniform[g as usize] = Some(s.clone());
        }
        s
    }

    /// The value at γ = (g, …, g) (see [`Self::uniform_state`]).
    fn uniform_value(&mut self, g: u32) -> f64 {
        match &self.uniform[g as usize] {
            Some(s) => s.value,
            None => self.uniform_state(g).value,
        }
    }

    /// The full state at `draft_lengths` (from the common-length states when they hold it).
    fn start_state(&mut self, draft_lengths: &[u32]) -> SaaState {
        match draft_lengths.first() {
            Some(&g) if draft_lengths.iter().all(|&x| x == g) && self.uniform[g as usize].is_some() => {
                self.uniform_state(g)
            }
            _ => self.ev.state_with(draft_lengths, &mut self.work),
        }
    }

    /// Whether a move scored at most `bound` can be skipped against the best value `threshold` known so far.
    fn ruled_out(&self, state: &SaaState, changes: &[(usize, u32)], threshold: f64) -> bool {
        self.ev
            .upper_bound(state, changes)
            .is_some_and(|bound| bound < threshold * (1.0 - BOUND_MARGIN))
    }

    /// Paper B's greedy (see [`greedy`]).
    fn greedy(&mut self) -> Plan {
        let ev = self.ev;
        let k_n = ev.devices();
        let g_max = ev.max_draft_len();
        // Phase 1: synchronized all-ones updates, i.e. the common lengths 0, 1, … while they improve.
        let (mut g, mut value) = (0, self.uniform_value(0));
        while g < g_max {
            let next = self.uniform_value(g + 1);
            if next > value {
                (g, value) = (g + 1, next);
            } else {
                break;
            }
        }
        let mut state = self.uniform_state(g);
        // Phase 2: coordinate greedy refinement (increases only), the first largest improvement each step.
        loop {
            let mut best: Option<(f64, usize)> = None;
            for k in 0..k_n {
                if state.draft_lengths[k] < g_max {
                    let m = [(k, state.draft_lengths[k] + 1)];
                    let threshold = best.map_or(state.value, |b| b.0);
                    if self.ruled_out(&state, &m, threshold) {
                        continue;
                    }
                    let v = ev.try_moves_with(&state, &m, &mut self.work);
                    if v > threshold {
                        best = Some((v, k));
                        std::mem::swap(&mut self.work, &mut self.kept);
                    }
                }
            }
            match best {
                Some((_, k)) => {
                    let m = [(k, state.draft_lengths[k] + 1)];
                    ev.apply_moves(&mut state, &m, &mut self.kept);
                }
                None => return to_plan(state),
            }
        }
    }

    /// The optimal common draft length (see [`uniform`]): the first best of γ = 0, 1, …, γ_max.
    fn uniform(&mut self) -> Plan {
        let mut best: Option<SaaState> = None;
        for g in 0..=self.ev.max_draft_len() {
            // As a fold that keeps the earlier state unless the later one is better.
            let s = self.uniform_state(g);
            if !best.as_ref().is_some_and(|b| b.value >= s.value) {
                best = Some(s);
            }
        }
        best.map(to_plan).unwrap_or(Plan {
            draft_lengths: vec![0; self.ev.devices()],
            value: 0.0,
        })
    }

    /// The common shift of `state` by one up (`up`) or down, capped at 0 and γ_max, into `self.changes`.
    fn shift_changes(&mut self, state: &SaaState, up: bool) {
        let g_max = self.ev.max_draft_len();
        self.changes.clear();
        for (k, &g) in state.draft_lengths.iter().enumerate() {
            let to = if up {
                (g + 1).min(g_max)
            } else {
                g.saturating_sub(1)
            };
            if to != g {
                self.changes.push((k, to));
            }
        }
    }

    /// Best-improvement local search from `start`: ±1 single moves and ±1 common shifts; pair moves when those
    /// stall. Stops at a local optimum or after `max_steps` improving steps, whichever comes first. `None` when it
    /// reached the path of an earlier search that ends at a point already returned.
    fn local_search(&mut self, mut state: SaaState, max_steps: usize) -> Option<SaaState> {
        let ev = self.ev;
        let k_n = ev.devices();
        let g_max = ev.max_draft_len();
        let mut path = vec![state.draft_lengths.clone()];
        let mut converged = false;
        for step in 0..max_steps {
            if self
                .converged
                .get(&state.draft_lengths)
                .is_some_and(|&left| left <= max_steps - step)
            {
                return None;
            }
            // The common shifts first (scored in full, or read from the common-length states): their values
            // raise the threshold the single moves must beat. They are still considered after the singles.
            let common = state
                .draft_lengths
                .iter()
                .all(|&g| g == state.draft_lengths[0])
                .then_some(state.draft_lengths[0]);
            let mut shifts: [Option<(f64, Source)>; 2] = [None, None];
            for (i, up) in [true, false].into_iter().enumerate() {
                self.shift_changes(&state, up);
                if self.changes.is_empty() {
                    continue;
                }
                shifts[i] = Some(match common {
                    Some(g) => {
                        let to = if up { g + 1 } else { g - 1 };
                        (self.uniform_value(to), Source::Uniform(to))
                    }
                    None => {
                        let changes = std::mem::take(&mut self.changes);
                        let v = ev.try_moves_with(&state, &changes, &mut self.shift[i]);
                        self.changes = changes;
                        (v, Source::Shift(i))
                    }
                });
            }
            let mut threshold = shifts.iter().flatten().fold(state.value, |t, &(v, _)| t.max(v));
            // The winner so far, in the order the candidates are considered: singles, then shifts up and down.
            let mut best: Option<Candidate> = None;
            let consider = |v: f64, source: Source, m: &[(usize, u32)], best: &mut Option<_>| {
                if v > best.as_ref().map_or(state.value, |b: &Candidate| b.0) {
                    let mut moves = [(0, 0); 2];
                    moves[..m.len()].copy_from_slice(m);
                    *best = Some((v, source, moves, m.len()));
                    true
                } else {
                    false
                }
            };
            for k in 0..k_n {
                let g = state.draft_lengths[k];
                for to in [(g < g_max).then(|| g + 1), g.checked_sub(1)]
                    .into_iter()
                    .flatten()
                {
                    let m = [(k, to)];
                    if self.ruled_out(&state, &m, threshold) {
                        continue;
                    }
                    let v = ev.try_moves_with(&state, &m, &mut self.work);
                    threshold = threshold.max(v);
                    if consider(v, Source::Kept, &m, &mut best) {
                        std::mem::swap(&mut self.work, &mut self.kept);
                    }
                }
            }
            for (v, source) in shifts.iter().flatten() {
                consider(*v, *source, &[], &mut best);
            }
            if best.is_none() && k_n <= PAIR_MOVES_MAX_DEVICES {
                // The bound of a pair only needs the drop of its leaving device j: once per j, not per pair.
                let rate = ev.objective() == Objective::Rate;
                let drops: Vec<f64> = (0..k_n)
                    .map(|j| match state.draft_lengths[j] {
                        gj if rate && gj > 0 => ev.leave_drop(&state, j, gj - 1, true),
                        _ => 0.0,
                    })
                    .collect();
                for i in 0..k_n {
                    for (j, &drop) in drops.iter().enumerate() {
                        let (gi, gj) = (state.draft_lengths[i], state.draft_lengths[j]);
                        if i != j && gi < g_max && gj > 0 {
                            let m = [(i, gi + 1), (j, gj - 1)];
                            if rate
                                && ev.bound_after_drop(&state, &m, drop) < threshold * (1.0 - BOUND_MARGIN)
                            {
                                continue;
                            }
                            let v = ev.try_moves_with(&state, &m, &mut self.work);
                            threshold = threshold.max(v);
                            if consider(v, Source::Kept, &m, &mut best) {
                                std::mem::swap(&mut self.work, &mut self.kept);
                            }
                        }
                    }
                }
            }
            match best {
                Some((_, Source::Kept, moves, len)) => {
                    ev.apply_moves(&mut state, &moves[..len], &mut self.kept)
                }
                Some((_, Source::Shift(i), _, _)) => {
                    self.shift_changes(&state, i == 0);
                    let changes = std::mem::take(&mut self.changes);
                    ev.apply_moves(&mut state, &changes, &mut self.shift[i]);
                    self.changes = changes;
                }
                Some((_, Source::Uniform(g), _, _)) => state = self.uniform_state(g),
                None => {
                    converged = true;
                    break;
                }
            }
            // Remember the path while it stays small; past the limit start again from here (a suffix of the path
            // still gives every kept point its steps to the end).
            if path.len() * k_n < PATH_MEMORY_LIMIT {
                path.push(state.draft_lengths.clone());
            } else {
                path.clear();
            }
        }
        if converged && !path.is_empty() && self.remembered + path.len() * k_n <= PATH_MEMORY_LIMIT {
            self.remembered += path.len() * k_n;
            let last = path.len() - 1;
            for (i, p) in path.into_iter().enumerate() {
                self.converged.entry(p).or_insert(last - i);
            }
        }
        Some(state)
    }

    /// [`best`]'s search: the greedy, uniform and comp-only plans computed here, then [`Planner::best_from`].
    fn best(&mut self, deadline: Option<Instant>) -> Plan {
        let g = self.greedy();
        let u = self.uniform();
        let ev = self.ev;
        let draft_lengths = comp_only_lengths(
            ev.acceptance(),
            ev.draft_token_s(),
            ev.verify_s(),
            ev.max_draft_len(),
        );
        let c = to_plan(self.start_state(&draft_lengths));
        self.best_from(g, u, c, deadline)
    }

    /// [`best_from`] on this planner's evaluator.
    fn best_from(&mut self, greedy: Plan, uniform: Plan, comp_only: Plan, deadline: Option<Instant>) -> Plan {
        let ev = self.ev;
        let k_n = ev.devices();
        let starts = [
            greedy,
            uniform,
            comp_only,
            Plan {
                draft_lengths: vec![0; k_n],
                value: 0.0,
            },
        ];
        let mut winner: Option<SaaState> = None;
        let mut keep = |s: SaaState| {
            if winner.as_ref().is_none_or(|w| s.value > w.value) {
                winner = Some(s);
            }
        };
        let cap = local_search_step_cap(ev);
        for (i, start) in starts.iter().enumerate() {
            // The search is deterministic: a start equal to an earlier one ends where that one did.
            if starts[..i].iter().any(|s| s.draft_lengths == start.draft_lengths) {
                continue;
            }
            let first = self.start_state(&start.draft_lengths);
            keep(first.clone());
            if let Some(end) = self.local_search(first, cap) {
                keep(end);
            }
        }
        if let Ok(plan) = exhaustive_until(ev, BEST_EXHAUSTIVE_LIMIT, deadline) {
            keep(ev.state(&plan.draft_lengths));
        }
        winner.map(to_plan).unwrap_or(Plan {
            draft_lengths: vec![0; k_n],
            value: 0.0,
        })
    }
}

/// Best-improvement local search from `start` (see [`Planner::local_search`]), on its own.
#[cfg(test)]
fn local_search(ev: &SaaEvaluator, start: &[u32], max_steps: usize) -> SaaState {
    let mut planner = Planner::new(ev);
    let first = planner.start_state(start);
    planner
        .local_search(first, max_steps)
        .expect("a fresh planner has no earlier paths")
}

/// [`best`] by a planner that keeps no common-length states (as one above [`UNIFORM_MEMORY_LIMIT`]).
#[cfg(test)]
fn best_without_kept_states(ev: &SaaEvaluator) -> Plan {
    let mut planner = Planner::new(ev);
    planner.keep_uniform = false;
    planner.best(None)
}

/// The stronger search: local search from zeros, greedy, uniform and comp-only (and exhaustive when small); the
/// best of all visited end points, so never below [`greedy`] or [`uniform`] on the same samples.
pub fn best(ev: &SaaEvaluator) -> Plan {
    Planner::new(ev).best(None)
}

/// [`best`] for a caller with a wall-clock budget: the local searches from the four starts always run (each is
/// bounded by its step cap), and the exhaustive step, when the space is small enough for it, stops at `deadline`
/// with the best vector it has scored. The plan is never below the local searches' best; without a deadline it is
/// [`best`]'s, bit for bit.
pub fn best_until(ev: &SaaEvaluator, deadline: Option<Instant>) -> Plan {
    Planner::new(ev).best(deadline)
}

/// [`best`] for a caller that has already computed the [`greedy`], [`uniform`] and [`comp_only`] plans on `ev`
/// (a figure that reports them too): the same search from the same starts, without computing them again. Plans
/// from another evaluator only change the starting points.
pub fn best_from(ev: &SaaEvaluator, greedy: Plan, uniform: Plan, comp_only: Plan) -> Plan {
    Planner::new(ev).best_from(greedy, uniform, comp_only, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper_b::reactive::ModeScheme;
    use crate::paper_b::saa::Objective;
    use crate::paper_b::scenario::{Scenario, ScenarioSpec, tests::example};
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn random_scenario(rng: &mut ChaCha8Rng, k: usize, g_max: u32, samples: u32) -> Scenario {
        let mut spec: ScenarioSpec = example(k);
        spec.max_draft_len = g_max;
        spec.saa_samples = samples;
        spec.seed = rng.random();
        spec.dl_power_w = 10f64.powf(rng.random_range(-2.0..1.0));
        spec.ul_power_w = 10f64.powf(rng.random_range(-3.0..-1.0));
        for d in &mut spec.devices {
            d.acceptance = rng.random_range(0.5..0.95);
            d.channel_gain = 10f64.powf(rng.random_range(-14.0..-11.0));
        }
        Scenario::new(spec).unwrap()
    }

    #[test]
    fn best_is_never_below_greedy_or_uniform_and_exhaustive_is_the_ceiling() {
        let mut rng = ChaCha8Rng::seed_from_u64(77);
        for case in 0..16 {
            let k = 1 + case % 3;
            let sc = random_scenario(&mut rng, k, 6, 200);
            for objective in [Objective::Rate, Objective::MeanRatio] {
                let ev = SaaEvaluator::new(&sc, ModeScheme::Optimal, objective).unwrap();
                let g = greedy(&ev);
                let u = uniform(&ev);
                let b = best(&ev);
                let c = comp_only(&ev);
                let e = exhaustive(&ev, EXHAUSTIVE_LIMIT).unwrap();
                assert!(
                    b.value >= g.value && b.value >= u.value,
                    "case {case}: {b:?} {g:?} {u:?}"
                );
                for p in [&g, &u, &b, &c] {
                    assert!(p.value <= e.value, "case {case}: {p:?} above exhaustive {e:?}");
                    assert_eq!(p.value.to_bits(), ev.value(&p.draft_lengths).to_bits());
                }
                // Small spaces are searched exhaustively inside `best`.
                assert_eq!(b.value, e.value);
            }
        }
    }

    /// A deadline far away changes nothing, bit for bit; one already passed stops `best`'s exhaustive step after
    /// one stride of points (the vectors it had reached vary only the first devices' lengths) while the local
    /// searches from the four starts still run, so the plan is never below greedy or uniform.
    #[test]
    fn a_deadline_cuts_only_the_exhaustive_step() {
        use std::time::Duration;
        let mut rng = ChaCha8Rng::seed_from_u64(81);
        for case in 0..8 {
            let k = 3 + case % 2;
            let sc = random_scenario(&mut rng, k, 6, 60);
            let ev = SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::Rate).unwrap();
            let full = best(&ev);
            let far = Some(Instant::now() + Duration::from_secs(3600));
            assert_eq!(best_until(&ev, None), full, "case {case}");
            assert_eq!(best_until(&ev, far), full, "case {case}");
            let e = exhaustive(&ev, EXHAUSTIVE_LIMIT).unwrap();
            assert_eq!(exhaustive_until(&ev, EXHAUSTIVE_LIMIT, far).unwrap(), e);
            let cut = exhaustive_until(&ev, EXHAUSTIVE_LIMIT, Some(Instant::now())).unwrap();
            assert!(cut.value <= e.value, "case {case}");
            // 7 × 7 > 32 points: only devices 0 and 1 were moved.
            assert!(
                cut.draft_lengths[2..].iter().all(|&g| g == 0),
                "case {case}: {cut:?}"
            );
            let short = best_until(&ev, Some(Instant::now()));
            let (g, u) = (greedy(&ev), uniform(&ev));
            assert!(short.value >= g.value && short.value >= u.value, "case {case}");
            assert!(short.value <= full.value, "case {case}");
            assert_eq!(short.value.to_bits(), ev.value(&short.draft_lengths).to_bits());
        }
    }

    /// The searches as written before the shortcuts (every candidate scored, every step a full evaluation, every
    /// start walked to its end): the planner must return the same plans, bit for bit.
    mod reference {
        use super::super::*;

        pub fn greedy(ev: &SaaEvaluator) -> Plan {
            let k_n = ev.devices();
            let g_max = ev.max_draft_len();
            let mut state = ev.state(&vec![0; k_n]);
            while state.draft_lengths.iter().all(|&g| g < g_max) {
                let next: Vec<u32> = state.draft_lengths.iter().map(|g| g + 1).collect();
                let cand = ev.state(&next);
                if cand.value > state.value {
                    state = cand;
                } else {
                    break;
                }
            }
            loop {
                let mut best: Option<(f64, usize)> = None;
                for k in 0..k_n {
                    if state.draft_lengths[k] < g_max {
                        let v = ev.try_moves(&state, &[(k, state.draft_lengths[k] + 1)]);
                        if v > best.map_or(state.value, |b| b.0) {
                            best = Some((v, k));
                        }
                    }
                }
                match best {
                    Some((_, k)) => {
                        let mut next = state.draft_lengths.clone();
                        next[k] += 1;
                        state = ev.state(&next);
                    }
                    None => return to_plan(state),
                }
            }
        }

        pub fn uniform(ev: &SaaEvaluator) -> Plan {
            let k_n = ev.devices();
            (0..=ev.max_draft_len())
                .map(|g| ev.state(&vec![g; k_n]))
                .fold(None::<SaaState>, |best, s| match best {
                    Some(b) if b.value >= s.value => Some(b),
                    _ => Some(s),
                })
                .map(to_plan)
                .unwrap()
        }

        fn local_search(ev: &SaaEvaluator, start: &[u32], max_steps: usize) -> SaaState {
            let k_n = ev.devices();
            let g_max = ev.max_draft_len();
            let mut state = ev.state(start);
            for _ in 0..max_steps {
                let mut best: Option<(f64, Vec<(usize, u32)>)> = None;
                let consider =
                    |v: f64, moves: &[(usize, u32)], best: &mut Option<(f64, Vec<(usize, u32)>)>| {
                        if v > best.as_ref().map_or(state.value, |b| b.0) {
                            *best = Some((v, moves.to_vec()));
                        }
                    };
                for k in 0..k_n {
                    let g = state.draft_lengths[k];
                    if g < g_max {
                        consider(ev.try_moves(&state, &[(k, g + 1)]), &[(k, g + 1)], &mut best);
                    }
                    if g > 0 {
                        consider(ev.try_moves(&state, &[(k, g - 1)]), &[(k, g - 1)], &mut best);
                    }
                }
                for up in [true, false] {
                    let changes: Vec<(usize, u32)> = state
                        .draft_lengths
                        .iter()
                        .enumerate()
                        .map(|(k, &g)| {
                            (
                                k,
                                if up {
                                    (g + 1).min(g_max)
                                } else {
                                    g.saturating_sub(1)
                                },
                            )
                        })
                        .filter(|&(k, to)| to != state.draft_lengths[k])
                        .collect();
                    if !changes.is_empty() {
                        consider(ev.try_moves(&state, &changes), &changes, &mut best);
                    }
                }
                if best.is_none() && k_n <= PAIR_MOVES_MAX_DEVICES {
                    for i in 0..k_n {
                        for j in 0..k_n {
                            let (gi, gj) = (state.draft_lengths[i], state.draft_lengths[j]);
                            if i != j && gi < g_max && gj > 0 {
                                let m = [(i, gi + 1), (j, gj - 1)];
                                consider(ev.try_moves(&state, &m), &m, &mut best);
                            }
                        }
                    }
                }
                match best {
                    Some((_, moves)) => {
                        let mut next = state.draft_lengths.clone();
                        for (k, g) in moves {
                            next[k] = g;
                        }
                        state = ev.state(&next);
                    }
                    None => return state,
                }
            }
            state
        }

        pub fn best(ev: &SaaEvaluator, cap: usize) -> Plan {
            let k_n = ev.devices();
            let starts = [
                greedy(ev),
                uniform(ev),
                comp_only(ev),
                Plan {
                    draft_lengths: vec![0; k_n],
                    value: 0.0,
                },
            ];
            let mut winner: Option<SaaState> = None;
            let mut keep = |s: SaaState| {
                if winner.as_ref().is_none_or(|w| s.value > w.value) {
                    winner = Some(s);
                }
            };
            for (i, start) in starts.iter().enumerate() {
                if starts[..i].iter().any(|s| s.draft_lengths == start.draft_lengths) {
                    continue;
                }
                keep(ev.state(&start.draft_lengths));
                keep(local_search(ev, &start.draft_lengths, cap));
            }
            if let Ok(plan) = exhaustive(ev, BEST_EXHAUSTIVE_LIMIT) {
                keep(ev.state(&plan.draft_lengths));
            }
            to_plan(winner.unwrap())
        }
    }

    #[test]
    fn searches_equal_the_reference_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(79);
        for case in 0..10 {
            let k = [4, 9, 16, 33, 64][case % 5];
            let g_max = rng.random_range(2..=8);
            let sc = random_scenario(&mut rng, k, g_max, 40);
            for (policy, objective) in [
                (ModeScheme::Optimal, Objective::Rate),
                (ModeScheme::AllUl, Objective::Rate),
                (ModeScheme::Random, Objective::Rate),
                (ModeScheme::Optimal, Objective::MeanRatio),
            ] {
                let ev = SaaEvaluator::new(&sc, policy, objective).unwrap();
                assert_eq!(
                    greedy(&ev),
                    reference::greedy(&ev),
                    "case {case} {policy:?} {objective:?}"
                );
                assert_eq!(uniform(&ev), reference::uniform(&ev));
                let cap = local_search_step_cap(&ev);
                let want = reference::best(&ev, cap);
                assert_eq!(best(&ev), want, "case {case} {policy:?} {objective:?}");
                assert_eq!(best_without_kept_states(&ev), want);
                // A figure that reports greedy, uniform and comp-only too hands them to `best_from`: the same plan.
                let from = best_from(&ev, greedy(&ev), uniform(&ev), comp_only(&ev));
                assert_eq!(from, want);
                assert_eq!(from.value.to_bits(), want.value.to_bits());
            }
        }
    }

    #[test]
    fn best_beats_or_ties_greedy_at_scale() {
        let mut rng = ChaCha8Rng::seed_from_u64(78);
        let mut strictly = 0;
        for _ in 0..4 {
            let sc = random_scenario(&mut rng, 10, 12, 150);
            let ev = SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::Rate).unwrap();
            let (g, u, b) = (greedy(&ev), uniform(&ev), best(&ev));
            assert!(b.value >= g.value && b.value >= u.value);
            if b.value > g.value * (1.0 + 1e-9) {
                strictly += 1;
            }
        }
        // Not a requirement of correctness, but the point of `best`: record that it does find more somewhere.
        assert!(
            strictly >= 1,
            "best never improved on greedy in 4 random scenarios"
        );
    }

    #[test]
    fn local_search_stops_at_its_step_cap() {
        let mut spec: ScenarioSpec = example(6);
        spec.max_draft_len = 12;
        spec.saa_samples = 200;
        let sc = Scenario::new(spec).unwrap();
        let ev = SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::Rate).unwrap();
        let zeros = vec![0u32; 6];
        let free = local_search(&ev, &zeros, usize::MAX);
        // From zeros the climb needs more than one step here; with a cap of one it stops after the first,
        // strictly better than the start and no better than the uncapped end point.
        assert!(
            free.draft_lengths.iter().sum::<u32>() > 1,
            "{:?}",
            free.draft_lengths
        );
        let one = local_search(&ev, &zeros, 1);
        assert!(one.value > ev.value(&zeros));
        assert!(one.value <= free.value);
        let changed: u32 = one.draft_lengths.iter().sum();
        assert!(
            changed <= 6,
            "one step moves each device by at most one: {:?}",
            one.draft_lengths
        );
        assert_eq!(local_search(&ev, &zeros, 0).draft_lengths, zeros);
        assert_eq!(local_search_step_cap(&ev), 4 * 6 * 13);
    }

    #[test]
    fn greedy_matches_a_hand_run_on_one_device() {
        // K = 1 and no communication cost worth noting: the greedy walks up the unimodal curve to its peak.
        let mut spec = example(1);
        spec.devices[0].channel_gain = 1e-6;
        spec.max_draft_len = 20;
        let sc = Scenario::new(spec).unwrap();
        let ev = SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::Rate).unwrap();
        let e = exhaustive(&ev, EXHAUSTIVE_LIMIT).unwrap();
        let g = greedy(&ev);
        assert_eq!(g.draft_lengths, e.draft_lengths);
        assert!(g.draft_lengths[0] >= 1);
    }

    #[test]
    fn comp_only_is_exact_for_its_own_objective() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for case in 0..30 {
            let k = rng.random_range(1..=4);
            let alpha: Vec<f64> = (0..k).map(|_| rng.random_range(0.3..0.97)).collect();
            // Every other case draws the speeds from two values: devices that share a speed.
            let pool = [rng.random_range(0.01..0.03), rng.random_range(0.01..0.03)];
            let t: Vec<f64> = (0..k)
                .map(|_| match case % 2 {
                    0 => rng.random_range(0.01..0.03),
                    _ => pool[rng.random_range(0..2)],
                })
                .collect();
            let t_ver = rng.random_range(0.02..0.2);
            let score = |g: &[u32]| {
                let d = g
                    .iter()
                    .zip(&t)
                    .map(|(&g, t)| f64::from(g) * t)
                    .fold(0.0, f64::max);
                g.iter()
                    .zip(&alpha)
                    .map(|(&g, &a)| expected_accepted(a, g))
                    .sum::<f64>()
                    / (d + t_ver)
            };
            let got = score(&comp_only_lengths(&alpha, &t, t_ver, 8));
            let mut best = 0.0f64;
            let mut g = vec![0u32; k];
            'outer: loop {
                best = best.max(score(&g));
                for x in g.iter_mut() {
                    if *x < 8 {
                        *x += 1;
                        continue 'outer;
                    }
                    *x = 0;
                }
                break;
            }
            assert!((got - best).abs() <= 1e-12 * best, "{got} vs {best}");
        }
    }
}
