//! Both expected-goodput evaluators (paper B's SAA and the unified model) against values recorded from their
//! implementation before they shared one incremental engine: the same plans and values bit for bit.
//!
//! Each case is a seeded scenario; every number the evaluators and planners return on it (full evaluations,
//! incremental tries, applied moves, bounds, statistics, scored plans, every planner's plan) is folded as raw bits
//! into one 64-bit FNV-1a digest per case. `tests/data/engine_reference.txt` holds the digests the code of
//! 02d7c11 (two evaluators, each with its own `State`, `Scratch`, scan and T_comm) printed for the same cases;
//! `ENGINE_REFERENCE_PRINT=1 cargo test -p spin-optimize --test engine_reference -- --nocapture` prints the
//! current ones.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spin_optimize::paper_b::{self, ModeScheme, Objective, proactive, saa};
use spin_optimize::round::{
    CorrectionPolicy, CorrectionSplit, PaperPlanner, PayloadPolicy, PlanEstimate, Planner, Radio, Round,
    RoundDevice, RoundPlan, RoundSpec, Scheme, TokenPayload,
};
use spin_optimize::unified::{self, Evaluator, Expectation, Options, Scratch};

/// 64-bit FNV-1a over the bits of everything fed to it.
struct Digest(u64);

impl Digest {
    fn new() -> Digest {
        Digest(0xcbf2_9ce4_8422_2325)
    }

    fn u64(&mut self, x: u64) {
        for b in x.to_le_bytes() {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn f64(&mut self, x: f64) {
        self.u64(x.to_bits());
    }

    fn opt(&mut self, x: Option<f64>) {
        match x {
            Some(x) => {
                self.u64(1);
                self.f64(x);
            }
            None => self.u64(0),
        }
    }

    fn draft_lengths(&mut self, draft_lengths: &[u32]) {
        self.u64(draft_lengths.len() as u64);
        for &l in draft_lengths {
            self.u64(u64::from(l));
        }
    }

    fn flags(&mut self, flags: &[bool]) {
        self.u64(flags.len() as u64);
        for &f in flags {
            self.u64(u64::from(f));
        }
    }

    fn plan(&mut self, p: &RoundPlan) {
        self.draft_lengths(&p.draft_lengths);
        self.flags(&p.sends_distributions);
        for &b in &p.uplink_share_hz {
            self.f64(b);
        }
        for x in [
            p.rate_tokens_per_s,
            p.mean_ratio_tokens_per_s,
            p.tokens_per_round,
            p.uplink_latency_s,
            p.verify_s,
            p.comm_delay_s,
        ] {
            self.f64(x);
        }
        self.u64(u64::from(p.proven_optimal));
        match p.estimate {
            PlanEstimate::Exact => self.u64(0),
            PlanEstimate::Saa {
                samples,
                rate_ci95_tokens_per_s,
                mean_ratio_ci95_tokens_per_s,
            } => {
                self.u64(1 + u64::from(samples));
                self.opt(rate_ci95_tokens_per_s);
                self.opt(mean_ratio_ci95_tokens_per_s);
            }
        }
    }
}

const MODES: [ModeScheme; 4] = [
    ModeScheme::Optimal,
    ModeScheme::AllUl,
    ModeScheme::AllDl,
    ModeScheme::Random,
];

const OBJECTIVES: [Objective; 2] = [Objective::Rate, Objective::MeanRatio];

/// A paper-B scenario with gains and powers spread over many decades (UL and DL SNRs close and far apart; every
/// fourth case has a gain outside the SNR shortcut's range).
fn paper_b_case(rng: &mut ChaCha8Rng, case: usize) -> paper_b::Scenario {
    let k = [1, 2, 3, 5, 9, 17, 40, 64][case % 8];
    let devices = (0..k)
        .map(|i| paper_b::DeviceSpec {
            acceptance: rng.random_range(0.2..0.97),
            draft_token_s: 0.0152 * rng.random_range(1.0..1.3),
            channel_gain: if case % 4 == 3 && i == 0 {
                1e-70
            } else {
                10f64.powf(rng.random_range(-14.0..-9.0))
            },
        })
        .collect();
    paper_b::Scenario::new(paper_b::ScenarioSpec {
        bandwidth_hz: 1e7 * rng.random_range(0.2..3.0),
        distribution_bits: 34_816.0,
        verify_fixed_s: 0.0428,
        verify_per_device_s: 0.0076,
        max_draft_len: [1, 3, 8, 12, 20][case % 5],
        ul_power_w: 10f64.powf(rng.random_range(-3.0..0.0)),
        dl_power_w: 10f64.powf(rng.random_range(-3.0..1.0)),
        noise_psd_server_w_per_hz: 1.26e-20,
        noise_psd_device_w_per_hz: 2.0e-20,
        saa_samples: [1, 7, 60, 200][case % 4],
        seed: rng.random(),
        devices,
    })
    .unwrap()
}

/// Every number of paper B's evaluator on one scenario: states, a walk of tried and applied moves with their bounds,
/// statistics, and every paper-B planner.
fn paper_b_digest(rng: &mut ChaCha8Rng, sc: &paper_b::Scenario) -> u64 {
    let mut d = Digest::new();
    let k = sc.device_count();
    let g_max = sc.max_draft_len;
    for modes in MODES {
        for objective in OBJECTIVES {
            let ev = paper_b::SaaEvaluator::new(sc, modes, objective).unwrap();
            let draft_lengths: Vec<u32> = (0..k).map(|_| rng.random_range(0..=g_max)).collect();
            let mut state = ev.state(&draft_lengths);
            d.f64(state.value);
            let mut scratch = saa::SaaScratch::default();
            for step in 0..24 {
                let count = [1, 2, k][step % 3].min(k);
                let changes: Vec<(usize, u32)> = rand::seq::index::sample(rng, k, count)
                    .into_iter()
                    .map(|j| {
                        let g = state.draft_lengths[j];
                        let to = match step % 4 {
                            0 => (g + 1).min(g_max),
                            1 => g.saturating_sub(1),
                            _ => rng.random_range(0..=g_max),
                        };
                        (j, to)
                    })
                    .collect();
                d.f64(ev.try_moves_with(&state, &changes, &mut scratch));
                d.opt(ev.upper_bound(&state, &changes));
                for &(j, to) in &changes {
                    if to < state.draft_lengths[j] {
                        let drop = ev.leave_drop(&state, j, to, changes.len() == 1);
                        d.f64(drop);
                        d.f64(ev.bound_after_drop(&state, &changes, drop));
                    }
                }
                if step % 5 == 4 {
                    // Applied without the try just made.
                    ev.try_moves_with(&state, &[(0, state.draft_lengths[0])], &mut scratch);
                }
                ev.apply_moves(&mut state, &changes, &mut scratch);
                d.draft_lengths(&state.draft_lengths);
                d.f64(state.value);
            }
            let st = ev.stats(&state.draft_lengths);
            for x in [
                st.rate_tokens_per_s,
                st.mean_ratio_tokens_per_s,
                st.tokens_per_round,
                st.latency_s,
                st.comm_delay_s,
                st.frac_accepted,
                st.frac_ul,
                st.frac_dl,
            ] {
                d.f64(x);
            }
            if k <= 17 {
                for plan in [
                    proactive::greedy(&ev),
                    proactive::uniform(&ev),
                    proactive::comp_only(&ev),
                    proactive::best(&ev),
                ] {
                    d.draft_lengths(&plan.draft_lengths);
                    d.f64(plan.value);
                }
                if let Ok(plan) = proactive::exhaustive(&ev, 500) {
                    d.draft_lengths(&plan.draft_lengths);
                    d.f64(plan.value);
                }
            }
        }
    }
    d.0
}

/// A unified round with separate UL and DL gains spread over many decades, the case's payload policy and length
/// range; every fourth case has a gain outside the SNR shortcut's range.
fn unified_case(rng: &mut ChaCha8Rng, case: usize) -> Round {
    let k = [1, 2, 3, 4, 6, 9, 20, 64][case % 8];
    let policy = [
        PayloadPolicy::Pair,
        PayloadPolicy::Choose,
        PayloadPolicy::Distribution,
    ][case % 3];
    let max = [1, 3, 6, 10][case % 4];
    let min = [0, 0, 1, 2][(case / 4) % 4].min(max);
    let devices = (0..k)
        .map(|i| {
            let ul = if case % 4 == 3 && i == 0 {
                1e-70
            } else {
                10f64.powf(rng.random_range(-14.0..-9.0))
            };
            RoundDevice {
                acceptance: rng.random_range(0.2..0.97),
                draft_token_s: 0.0152 * rng.random_range(1.0..1.3),
                spectral_efficiency: 10f64.powf(rng.random_range(-2.0..1.0)),
                uplink_gain: ul,
                downlink_gain: if case.is_multiple_of(2) {
                    ul
                } else {
                    10f64.powf(rng.random_range(-14.0..-9.0))
                },
            }
        })
        .collect();
    Round::new(RoundSpec {
        bandwidth_hz: 1e7 * rng.random_range(0.05..3.0),
        verify_fixed_s: 0.0428,
        verify_per_device_s: 0.0076,
        verify_per_draft_token_s: 0.0,
        min_draft_len: min,
        max_draft_len: max,
        radio: Radio {
            ul_power_w: 10f64.powf(rng.random_range(-3.0..0.0)),
            dl_power_w: 10f64.powf(rng.random_range(-3.0..1.0)),
            ..Radio::paper_b()
        },
        payload: TokenPayload {
            distribution_bits: 34_816.0,
            pair_bits: [34.0, 0.0][case % 5 / 4],
            policy,
        },
        correction_split: CorrectionSplit::Equal,
        saa_samples: [1, 9, 80, 200][case % 4],
        seed: rng.random(),
        devices,
    })
    .unwrap()
}

fn payloads(rng: &mut ChaCha8Rng, policy: PayloadPolicy, k: usize) -> Vec<bool> {
    (0..k)
        .map(|_| match policy {
            PayloadPolicy::Pair => false,
            PayloadPolicy::Distribution => true,
            PayloadPolicy::Choose => rng.random_bool(0.4),
        })
        .collect()
}

/// Every number of the unified evaluator on one round: states, a walk of bounded tries and applied moves (kept and
/// not), box bounds, scored plans at equal and Lemma-3 shares, the unified planner and every paper scheme.
fn unified_digest(rng: &mut ChaCha8Rng, round: &Round) -> u64 {
    let mut d = Digest::new();
    let k = round.len();
    let (lo, hi) = (round.min_draft_len, round.max_draft_len);
    let policy = round.payload.policy;
    for modes in MODES {
        let correction = CorrectionPolicy {
            modes,
            ..CorrectionPolicy::default()
        };
        for expectation in [
            Expectation::Saa,
            Expectation::Auto { limit: 4096 },
            Expectation::Exact { limit: 4096 },
        ] {
            let ev = match Evaluator::new(round, expectation, correction) {
                Ok(ev) => ev,
                Err(e) => {
                    d.u64(e.to_string().len() as u64);
                    continue;
                }
            };
            d.u64(u64::from(ev.is_exact()));
            for objective in OBJECTIVES {
                let draft_lengths: Vec<u32> = (0..k).map(|_| rng.random_range(lo..=hi)).collect();
                let sends_distributions = payloads(rng, policy, k);
                let mut state = ev.state(&draft_lengths, &sends_distributions, objective).unwrap();
                d.f64(state.value);
                d.f64(state.uplink_s);
                let mut scratch = Scratch::default();
                for step in 0..24 {
                    let count = [1, 1, 2, k][step % 4].min(k);
                    let changes: Vec<(usize, u32, bool)> = rand::seq::index::sample(rng, k, count)
                        .into_iter()
                        .map(|j| {
                            let l = state.draft_lengths[j];
                            let to = match step % 3 {
                                0 => (l + 1).min(hi),
                                1 => l.saturating_sub(1).max(lo),
                                _ => rng.random_range(lo..=hi),
                            };
                            let z = match policy {
                                PayloadPolicy::Choose if step % 4 == 1 => !state.sends_distributions[j],
                                _ => state.sends_distributions[j],
                            };
                            (j, to, z)
                        })
                        .collect();
                    // A threshold that prunes sometimes: the state's value, scaled.
                    let threshold = state.value * [0.0, 0.9, 1.0, 1.1, 2.0][step % 5];
                    let v = ev.try_moves_above(&state, &changes, objective, threshold, &mut scratch);
                    d.opt(v);
                    if step % 2 == 0 {
                        ev.keep_last_try(&state, &changes, &mut scratch);
                    }
                    d.f64(ev.try_moves(&state, &changes, objective, &mut scratch));
                    if step % 3 == 0 {
                        ev.keep_last_try(&state, &changes, &mut scratch);
                    }
                    ev.apply_moves(&mut state, &changes, objective, &mut scratch);
                    d.draft_lengths(&state.draft_lengths);
                    d.flags(&state.sends_distributions);
                    d.f64(state.value);
                    d.f64(state.uplink_s);
                }
                let a: Vec<u32> = (0..k).map(|_| rng.random_range(lo..=hi)).collect();
                let b: Vec<u32> = a.iter().map(|&l| rng.random_range(l..=hi)).collect();
                let z = payloads(rng, policy, k);
                let (up, at) = ev.box_bound(&a, &b, &z, objective, &mut scratch);
                d.f64(up);
                d.f64(at);
            }
            for _ in 0..3 {
                let draft_lengths: Vec<u32> = (0..k).map(|_| rng.random_range(lo..=hi)).collect();
                let sends_distributions = payloads(rng, policy, k);
                let equal = vec![round.bandwidth_hz / k as f64; k];
                let (_, lemma3) = ev.lemma3_shares(&draft_lengths, &sends_distributions);
                for shares in [equal, lemma3] {
                    let p = ev
                        .round_plan(
                            Scheme::Fixed,
                            &draft_lengths,
                            &sends_distributions,
                            &shares,
                            false,
                        )
                        .unwrap();
                    d.plan(&p);
                    let q = unified::score(
                        round,
                        expectation,
                        correction,
                        Scheme::Fixed,
                        &draft_lengths,
                        &sends_distributions,
                        &shares,
                        false,
                    )
                    .unwrap();
                    d.plan(&q);
                }
            }
        }
        if k <= 9 && hi <= 6 && modes != ModeScheme::Random {
            for objective in OBJECTIVES {
                let options = Options {
                    objective,
                    correction,
                    ..Options::default()
                };
                let (p, stats) = unified::plan_with_stats(round, &options).unwrap();
                d.plan(&p);
                for x in [stats.evaluations, stats.moves, stats.pruned, stats.boxes] {
                    d.u64(x as u64);
                }
                d.u64(u64::from(stats.proven_optimal));
            }
        }
        if k <= 20 && hi <= 6 {
            for scheme in Scheme::PER_ROUND {
                if scheme == Scheme::Unified {
                    continue;
                }
                let planner = PaperPlanner {
                    correction,
                    ..PaperPlanner::new(scheme, Objective::Rate)
                };
                match planner.plan(round) {
                    Ok(p) => d.plan(&p),
                    Err(e) => d.u64(e.to_string().len() as u64),
                }
            }
        }
    }
    d.0
}

/// The digest lines of every case, in order.
fn digests() -> Vec<String> {
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_e161);
    let mut lines = Vec::new();
    for case in 0..32 {
        let sc = paper_b_case(&mut rng, case);
        lines.push(format!("paper-b {case:2} {:016x}", paper_b_digest(&mut rng, &sc)));
    }
    for case in 0..32 {
        let round = unified_case(&mut rng, case);
        lines.push(format!(
            "unified {case:2} {:016x}",
            unified_digest(&mut rng, &round)
        ));
    }
    lines
}

#[test]
fn both_evaluators_give_the_recorded_bits() {
    let got = digests();
    if std::env::var_os("ENGINE_REFERENCE_PRINT").is_some() {
        for line in &got {
            println!("{line}");
        }
    }
    let recorded: Vec<&str> = include_str!("data/engine_reference.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    assert_eq!(got.len(), recorded.len(), "number of cases");
    for (g, r) in got.iter().zip(&recorded) {
        assert_eq!(g, r, "a case's numbers differ from the recorded ones");
    }
}
