//! The unified model and planner against both papers (their special cases) and against brute force on small K.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spin_optimize::paper_a;
use spin_optimize::paper_b::{self, ModeScheme, Objective};
use spin_optimize::round::{
    CorrectionPolicy, CorrectionSplit, PaperPlanner, PayloadPolicy, Planner, Radio, Round, RoundDevice,
    RoundSpec, Scheme, TokenPayload, full_band_spectral_efficiency,
};
use spin_optimize::unified::{self, Evaluator, Expectation, Options, Scratch};

/// The numbers of `scenarios/examples/paper-a.json` (spin-scenario's tests read that file).
fn paper_a_example() -> paper_a::Scenario {
    let device = |acceptance, draft_token_s, spectral_efficiency| paper_a::DeviceSpec {
        acceptance,
        draft_token_s,
        spectral_efficiency,
    };
    paper_a::Scenario::new(&paper_a::ScenarioSpec {
        bandwidth_hz: 1.0e7,
        distribution_bits: 31744.0,
        verify_fixed_s: 0.02268,
        verify_per_device_s: 0.01272,
        max_draft_len: 25,
        min_draft_len: 1,
        devices: vec![
            device(0.8582, 0.021, 12.5),
            device(0.7390, 0.019, 9.1),
            device(0.7393, 0.023, 14.2),
            device(0.7126, 0.020, 6.8),
        ],
    })
    .unwrap()
}

/// The numbers of `scenarios/examples/paper-b.json`.
fn paper_b_example() -> paper_b::Scenario {
    let device = |acceptance, draft_token_s, channel_gain| paper_b::DeviceSpec {
        acceptance,
        draft_token_s,
        channel_gain,
    };
    paper_b::Scenario::new(paper_b::ScenarioSpec {
        bandwidth_hz: 1.0e7,
        distribution_bits: 34816.0,
        verify_fixed_s: 0.0428,
        verify_per_device_s: 0.0076,
        max_draft_len: 20,
        ul_power_w: 0.0316,
        dl_power_w: 1.0,
        noise_psd_server_w_per_hz: 1.26e-20,
        noise_psd_device_w_per_hz: 2.0e-20,
        saa_samples: 1000,
        seed: 7,
        devices: vec![
            device(0.85, 0.0152, 2.1e-10),
            device(0.80, 0.0161, 4.0e-11),
            device(0.72, 0.0158, 9.5e-12),
            device(0.70, 0.0170, 3.3e-12),
            device(0.85, 0.0166, 1.2e-12),
            device(0.80, 0.0154, 6.0e-13),
        ],
    })
    .unwrap()
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs())
}

#[test]
fn paper_a_payload_without_correction_gives_paper_a_numbers() {
    let s = paper_a_example();
    let round = Round::from_paper_a(&s, Radio::paper_b()).unwrap();
    let ev = Evaluator::new(&round, Expectation::Saa, CorrectionPolicy::default()).unwrap();
    for scheme in [
        Scheme::Exact,
        Scheme::PaperAlg1,
        Scheme::Homo,
        Scheme::UniBw,
        Scheme::Fixed,
        Scheme::BruteForce,
    ] {
        let ours = PaperPlanner::new(scheme, Objective::Rate).plan(&round).unwrap();
        // The same plan scored by paper A's eq. 27.
        let (tau, latency) = s.evaluate(&ours.draft_lengths, &ours.uplink_share_hz).unwrap();
        assert!(
            close(ours.rate_tokens_per_s, tau, 1e-12),
            "{scheme}: {} vs {tau}",
            ours.rate_tokens_per_s
        );
        assert!(close(ours.mean_ratio_tokens_per_s, tau, 1e-12));
        assert!(close(ours.uplink_latency_s + ours.verify_s, latency, 1e-12));
        assert_eq!(ours.comm_delay_s, 0.0);
        assert!(ours.sends_distributions.iter().all(|&d| d));
        let direct = ev.round_plan(
            scheme,
            &ours.draft_lengths,
            &ours.sends_distributions,
            &ours.uplink_share_hz,
            false,
        );
        assert_eq!(direct.unwrap().rate_tokens_per_s, ours.rate_tokens_per_s);
    }
    let exact = paper_a::exact::exact(&s).unwrap();
    let (plan, stats) = unified::plan_with_stats(&round, &Options::default()).unwrap();
    assert!(close(plan.rate_tokens_per_s, exact.goodput_tokens_per_s, 1e-12));
    assert!(stats.proven_optimal && plan.proven_optimal);
    // Lemma 3 shares: the same as paper A's.
    for (a, b) in plan.uplink_share_hz.iter().zip(&exact.uplink_share_hz) {
        assert!(close(*a, *b, 1e-9), "{a} vs {b}");
    }
}

#[test]
fn paper_b_payload_with_equal_shares_gives_paper_b_numbers() {
    let s = paper_b_example();
    let round = Round::from_paper_b(&s).unwrap();
    for objective in [Objective::Rate, Objective::MeanRatio] {
        let ev = paper_b::SaaEvaluator::new(&s, ModeScheme::Optimal, objective).unwrap();
        for scheme in [Scheme::Greedy, Scheme::Uniform, Scheme::CompOnly] {
            let theirs = spin_optimize::round::plan_paper_b(scheme, &ev).unwrap();
            // Scored on the round's samples, as paper B scores it.
            let ours = PaperPlanner {
                expectation: Expectation::Saa,
                ..PaperPlanner::new(scheme, objective)
            }
            .plan(&round)
            .unwrap();
            assert_eq!(ours.draft_lengths, theirs.draft_lengths, "{scheme}");
            assert!(ours.sends_distributions.iter().all(|&d| !d));
            let stats = ev.stats(&theirs.draft_lengths);
            assert!(
                close(ours.goodput(objective), theirs.value, 1e-12),
                "{scheme} {objective:?}"
            );
            assert!(close(ours.rate_tokens_per_s, stats.rate_tokens_per_s, 1e-12));
            assert!(close(
                ours.mean_ratio_tokens_per_s,
                stats.mean_ratio_tokens_per_s,
                1e-12
            ));
            assert!(close(ours.comm_delay_s, stats.comm_delay_s, 1e-12));
        }
    }
    // Also every policy of the reactive step, scored on the same samples.
    for modes in [ModeScheme::AllUl, ModeScheme::AllDl] {
        let ev = paper_b::SaaEvaluator::new(&s, modes, Objective::Rate).unwrap();
        let ours = Evaluator::new(
            &round,
            Expectation::Saa,
            CorrectionPolicy {
                modes,
                split: CorrectionSplit::Equal,
            },
        )
        .unwrap();
        let draft_lengths = [3, 5, 2, 7, 0, 4];
        let st = ours.state(&draft_lengths, &[false; 6], Objective::Rate).unwrap();
        assert!(close(st.value, ev.value(&draft_lengths), 1e-12));
    }
    // The unified planner on paper B's round is never below paper B's best search on the same samples.
    let ev = paper_b::SaaEvaluator::new(&s, ModeScheme::Optimal, Objective::Rate).unwrap();
    let best = paper_b::proactive::best(&ev);
    let plan = unified::plan(
        &round,
        &Options {
            expectation: Expectation::Saa,
            ..Options::default()
        },
    )
    .unwrap();
    assert!(
        plan.rate_tokens_per_s >= best.value * (1.0 - 1e-12),
        "{} < {}",
        plan.rate_tokens_per_s,
        best.value
    );
}

/// A random small round where the correction phase matters.
fn random_round(rng: &mut ChaCha8Rng, k: usize, l_min: u32, l_max: u32, policy: PayloadPolicy) -> Round {
    let mut u = |lo: f64, hi: f64| lo + (hi - lo) * rng.random::<f64>();
    let radio = Radio {
        ul_power_w: 10f64.powf(u(-3.0, -1.0)),
        dl_power_w: 10f64.powf(u(-2.0, 1.0)),
        noise_psd_server_w_per_hz: 1.26e-20,
        noise_psd_device_w_per_hz: 2.0e-20,
    };
    let bandwidth_hz = u(1e6, 2e7);
    let devices = (0..k)
        .map(|_| {
            let g = 10f64.powf(u(-14.0, -11.0));
            RoundDevice {
                acceptance: u(0.5, 0.95),
                draft_token_s: u(0.005, 0.04),
                spectral_efficiency: full_band_spectral_efficiency(&radio, bandwidth_hz, g)
                    .unwrap()
                    .max(0.5),
                uplink_gain: g,
                downlink_gain: g * 10f64.powf(u(-0.5, 0.5)),
            }
        })
        .collect();
    Round::new(RoundSpec {
        bandwidth_hz,
        verify_fixed_s: u(0.01, 0.08),
        verify_per_device_s: u(0.002, 0.02),
        // Half the rounds price the positions of the pass too (T_tok up to a quarter of a mean T_lin).
        verify_per_draft_token_s: if u(0.0, 1.0) < 0.5 { u(0.0, 0.003) } else { 0.0 },
        min_draft_len: l_min,
        max_draft_len: l_max,
        radio,
        payload: TokenPayload {
            distribution_bits: 34_816.0 * u(0.05, 1.0),
            pair_bits: 34.0,
            policy,
        },
        correction_split: CorrectionSplit::Equal,
        saa_samples: 200,
        seed: rng.random(),
        devices,
    })
    .unwrap()
}

/// The reference: every outcome enumerated with its probability, every mode assignment of the rejected devices
/// tried (Lemma-1 DL powers, equal split), tokens counted from the outcome. Shares by Lemma 3 (checked below).
fn reference_value(
    round: &Round,
    ev: &Evaluator,
    draft_lengths: &[u32],
    sends_distributions: &[bool],
    objective: Objective,
) -> f64 {
    let phi = ev.uplink_latency_s(draft_lengths, sends_distributions);
    let base = phi + round.verify_s_at(draft_lengths);
    let link = round.link();
    let k_n = round.len();
    let mut f = vec![1u32; k_n];
    let (mut e_tok, mut e_lat, mut e_ratio) = (0.0, 0.0, 0.0);
    loop {
        let mut p = 1.0;
        let mut tokens = 0u32;
        let mut rejected = Vec::new();
        for k in 0..k_n {
            let a = round.devices[k].acceptance;
            if f[k] <= draft_lengths[k] {
                p *= a.powi(f[k] as i32 - 1) * (1.0 - a);
                if !sends_distributions[k] {
                    rejected.push(k);
                }
            } else {
                p *= a.powi(draft_lengths[k] as i32);
            }
            tokens += f[k];
        }
        let m = rejected.len();
        let comm = if m == 0 {
            0.0
        } else {
            let b = link.share_hz(m);
            (0..1u32 << m)
                .map(|mask| {
                    let (mut ul, mut inv) = (0.0f64, 0.0);
                    for (i, &k) in rejected.iter().enumerate() {
                        if mask >> i & 1 == 1 {
                            ul = ul.max(link.ul_delay_s(b, round.devices[k].uplink_gain));
                        } else {
                            inv += 1.0 / round.devices[k].downlink_gain;
                        }
                    }
                    ul.max(link.dl_delay_s(b, inv))
                })
                .fold(f64::INFINITY, f64::min)
        };
        e_tok += p * f64::from(tokens);
        e_lat += p * (base + comm);
        e_ratio += p * f64::from(tokens) / (base + comm);
        let mut k = 0;
        while k < k_n {
            if f[k] <= draft_lengths[k] {
                f[k] += 1;
                break;
            }
            f[k] = 1;
            k += 1;
        }
        if k == k_n {
            break;
        }
    }
    match objective {
        Objective::Rate => e_tok / e_lat,
        Objective::MeanRatio => e_ratio,
    }
}

fn brute_force(round: &Round, objective: Objective) -> (f64, Vec<u32>, Vec<bool>) {
    let k_n = round.len();
    let policy = round.payload.policy;
    let masks: Vec<u32> = match policy {
        PayloadPolicy::Distribution => vec![(1 << k_n) - 1],
        PayloadPolicy::Pair => vec![0],
        PayloadPolicy::Choose => (0..1 << k_n).collect(),
    };
    let ev = Evaluator::new(round, Expectation::Saa, CorrectionPolicy::default()).unwrap();
    let mut best = (f64::NEG_INFINITY, vec![], vec![]);
    for mask in masks {
        let sends_distributions: Vec<bool> = (0..k_n).map(|k| mask >> k & 1 == 1).collect();
        let mut draft_lengths = vec![round.min_draft_len; k_n];
        loop {
            let v = reference_value(round, &ev, &draft_lengths, &sends_distributions, objective);
            if v > best.0 {
                best = (v, draft_lengths.clone(), sends_distributions.clone());
            }
            let mut k = 0;
            while k < k_n {
                if draft_lengths[k] < round.max_draft_len {
                    draft_lengths[k] += 1;
                    break;
                }
                draft_lengths[k] = round.min_draft_len;
                k += 1;
            }
            if k == k_n {
                break;
            }
        }
    }
    best
}

/// A deadline already passed stops the branch and bound at its first box (the plan is then not proven optimal) and
/// cuts paper B's `best` seed to its local searches; the plan is still scored by the model, never below the
/// seeds' local searches, and no better than the proven plan. A deadline far away changes nothing, bit for bit.
#[test]
fn a_deadline_stops_the_proof_not_the_plan() {
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    for case in 0..6 {
        let round = random_round(&mut rng, 3, 0, 5, PayloadPolicy::Choose);
        let options = Options {
            expectation: Expectation::Exact { limit: 1 << 16 },
            ..Options::default()
        };
        let (full, full_stats) = unified::plan_with_stats(&round, &options).unwrap();
        assert!(full_stats.proven_optimal, "case {case}");
        let far = std::time::Instant::now() + std::time::Duration::from_secs(3600);
        let (same, same_stats) = unified::plan_with_stats(
            &round,
            &Options {
                deadline: Some(far),
                ..options
            },
        )
        .unwrap();
        assert_eq!((same, same_stats), (full.clone(), full_stats), "case {case}");
        let (cut, cut_stats) = unified::plan_with_stats(
            &round,
            &Options {
                deadline: Some(std::time::Instant::now()),
                ..options
            },
        )
        .unwrap();
        assert!(!cut_stats.proven_optimal && !cut.proven_optimal, "case {case}");
        assert!(
            cut_stats.boxes < full_stats.boxes,
            "case {case}: {cut_stats:?} {full_stats:?}"
        );
        assert!(
            cut.rate_tokens_per_s <= full.rate_tokens_per_s * (1.0 + 1e-12),
            "case {case}"
        );
        let rescored = unified::score(
            &round,
            options.expectation,
            options.correction,
            Scheme::Unified,
            &cut.draft_lengths,
            &cut.sends_distributions,
            &cut.uplink_share_hz,
            false,
        )
        .unwrap();
        assert_eq!(
            rescored.rate_tokens_per_s.to_bits(),
            cut.rate_tokens_per_s.to_bits(),
            "case {case}"
        );
    }
}

#[test]
fn planner_equals_brute_force_over_lengths_payloads_and_modes() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let exact = Options {
        expectation: Expectation::Exact { limit: 1 << 16 },
        ..Options::default()
    };
    let (mut mixed, mut positions) = (0, 0);
    // (K, L_min, L_max, policy): the largest covered are K = 3 with L ∈ {0..5} (choose: 2³·6³ plans) and
    // K = 4 with L ∈ {0..3}.
    let cases = [
        (1, 0, 8, PayloadPolicy::Choose),
        (2, 0, 6, PayloadPolicy::Pair),
        (2, 1, 6, PayloadPolicy::Choose),
        (3, 0, 5, PayloadPolicy::Choose),
        (3, 0, 5, PayloadPolicy::Pair),
        (4, 0, 3, PayloadPolicy::Choose),
    ];
    for (case, &(k, l_min, l_max, policy)) in cases.iter().cycle().take(18).enumerate() {
        let round = random_round(&mut rng, k, l_min, l_max, policy);
        positions += usize::from(round.verify_per_draft_token_s > 0.0);
        for objective in [Objective::Rate, Objective::MeanRatio] {
            let (want, draft_lengths, sends_distributions) = brute_force(&round, objective);
            let (plan, stats) = unified::plan_with_stats(&round, &Options { objective, ..exact }).unwrap();
            assert!(stats.proven_optimal, "case {case}: not proven ({stats:?})");
            let got = plan.goodput(objective);
            assert!(
                close(got, want, 1e-9),
                "case {case} {objective:?}: planner {got} {:?} {:?} vs brute force {want} {draft_lengths:?} {sends_distributions:?}",
                plan.draft_lengths,
                plan.sends_distributions
            );
            if sends_distributions.iter().any(|&d| d) && sends_distributions.iter().any(|&d| !d) {
                mixed += 1;
            }
        }
    }
    assert!(
        mixed >= 3,
        "only {mixed} optima mix the payloads: the choice is not exercised"
    );
    assert!(
        positions >= 5,
        "only {positions} of 18 rounds price the pass's positions"
    );
}

/// T_ver(K, L) = T_fix + K·T_lin + T_tok·Σ L_k: as T_tok rises the proven plan drafts no more in total, its value
/// falls, and where one drafted token costs more pass time than every device's round gains, nobody drafts. The
/// papers' planners plan without T_tok (their models have none) but are scored with it.
#[test]
fn a_costly_position_in_the_pass_shortens_the_drafts() {
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let exact = Options {
        expectation: Expectation::Exact { limit: 1 << 16 },
        ..Options::default()
    };
    for case in 0..6 {
        let base = Round::new(RoundSpec {
            verify_per_draft_token_s: 0.0,
            ..random_round(&mut rng, 3, 0, 5, PayloadPolicy::Choose)
                .spec()
                .clone()
        })
        .unwrap();
        let (mut drafted, mut value) = (u64::MAX, f64::INFINITY);
        for t_tok in [0.0, 0.002, 0.01, 0.05, 10.0] {
            let round = Round::new(RoundSpec {
                verify_per_draft_token_s: t_tok,
                ..base.spec().clone()
            })
            .unwrap();
            let (plan, stats) = unified::plan_with_stats(&round, &exact).unwrap();
            assert!(stats.proven_optimal, "case {case} T_tok {t_tok}");
            let sum: u64 = plan.draft_lengths.iter().map(|&l| u64::from(l)).sum();
            assert!(
                sum <= drafted,
                "case {case} T_tok {t_tok}: {sum} drafted after {drafted}"
            );
            assert!(plan.rate_tokens_per_s <= value, "case {case} T_tok {t_tok}");
            assert!(close(
                plan.verify_s,
                round.verify_s_at(&plan.draft_lengths),
                1e-15
            ));
            if t_tok >= 10.0 {
                assert_eq!(sum, 0, "case {case}: a 10 s token is still drafted");
            }
            for scheme in [Scheme::Exact, Scheme::Best, Scheme::Greedy, Scheme::Homo] {
                let planner = PaperPlanner::new(scheme, Objective::Rate);
                let paper = planner.plan(&round).unwrap();
                assert!(close(
                    paper.verify_s,
                    round.verify_s_at(&paper.draft_lengths),
                    1e-15
                ));
                assert!(paper.rate_tokens_per_s <= plan.rate_tokens_per_s * (1.0 + 1e-12));
                // The cap never lowers the paper's own plan's value under T_tok, and is off without T_tok.
                let uncapped = planner.plan(&base).unwrap();
                let scored = unified::score(
                    &round,
                    planner.expectation,
                    planner.correction,
                    scheme,
                    &uncapped.draft_lengths,
                    &uncapped.sends_distributions,
                    &uncapped.uplink_share_hz,
                    false,
                )
                .unwrap();
                assert!(
                    paper.rate_tokens_per_s >= scored.rate_tokens_per_s,
                    "{scheme} case {case}"
                );
                if t_tok == 0.0 {
                    assert_eq!(paper, uncapped);
                } else if t_tok >= 10.0 {
                    assert!(
                        paper.draft_lengths.iter().all(|&l| l == 0),
                        "{scheme} case {case}"
                    );
                    assert!(!paper.proven_optimal);
                    // A deadline already passed scores no cap: paper A's plan stands as it planned it.
                    if scheme == Scheme::Exact {
                        let late = PaperPlanner {
                            deadline: Some(std::time::Instant::now()),
                            ..planner
                        };
                        assert_eq!(late.plan(&round).unwrap().draft_lengths, uncapped.draft_lengths);
                    }
                }
            }
            (drafted, value) = (sum, plan.rate_tokens_per_s);
        }
    }
}

#[test]
fn lemma3_shares_beat_every_other_split() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for _ in 0..50 {
        let k = rng.random_range(1..=5);
        let round = random_round(&mut rng, k, 0, 10, PayloadPolicy::Choose);
        let ev = Evaluator::new(&round, Expectation::Saa, CorrectionPolicy::default()).unwrap();
        let draft_lengths: Vec<u32> = (0..k).map(|_| rng.random_range(0..=10)).collect();
        let sends_distributions: Vec<bool> = (0..k).map(|_| rng.random_bool(0.5)).collect();
        let (phi, shares) = ev.lemma3_shares(&draft_lengths, &sends_distributions);
        let at = ev
            .uplink_latency_with_shares(&draft_lengths, &sends_distributions, &shares)
            .unwrap();
        assert!(close(at, phi, 1e-9), "{at} vs {phi}");
        for _ in 0..100 {
            let raw: Vec<f64> = (0..k).map(|_| rng.random::<f64>() + 1e-9).collect();
            let sum: f64 = raw.iter().sum();
            let other: Vec<f64> = raw.iter().map(|r| r / sum * round.bandwidth_hz).collect();
            let t = ev
                .uplink_latency_with_shares(&draft_lengths, &sends_distributions, &other)
                .unwrap();
            assert!(t >= phi * (1.0 - 1e-12), "{t} < {phi}");
        }
    }
}

#[test]
fn exact_enumeration_agrees_with_the_reference_and_saa_is_close() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for _ in 0..10 {
        let k = rng.random_range(1..=3);
        let round = random_round(&mut rng, k, 0, 4, PayloadPolicy::Choose);
        let exact = Evaluator::new(
            &round,
            Expectation::Exact { limit: 1 << 12 },
            CorrectionPolicy::default(),
        )
        .unwrap();
        assert!(exact.is_exact());
        let draft_lengths: Vec<u32> = (0..k).map(|_| rng.random_range(0..=4)).collect();
        let sends_distributions: Vec<bool> = (0..k).map(|_| rng.random_bool(0.4)).collect();
        for objective in [Objective::Rate, Objective::MeanRatio] {
            let v = exact
                .state(&draft_lengths, &sends_distributions, objective)
                .unwrap()
                .value;
            assert!(close(
                v,
                reference_value(&round, &exact, &draft_lengths, &sends_distributions, objective),
                1e-12
            ));
        }
    }
    let err = Evaluator::new(
        &random_round(&mut rng, 8, 0, 20, PayloadPolicy::Pair),
        Expectation::Exact { limit: 1000 },
        CorrectionPolicy::default(),
    )
    .unwrap_err();
    assert!(err.to_string().starts_with("devices:"), "{err}");
}

#[test]
fn incremental_moves_equal_full_evaluation() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let mut scratch = Scratch::default();
    for policy in [
        PayloadPolicy::Pair,
        PayloadPolicy::Choose,
        PayloadPolicy::Distribution,
    ] {
        let round = random_round(&mut rng, 7, 0, 12, policy);
        for expectation in [Expectation::Saa, Expectation::Exact { limit: 0 }] {
            let Ok(ev) = Evaluator::new(&round, expectation, CorrectionPolicy::default()) else {
                continue;
            };
            for objective in [Objective::Rate, Objective::MeanRatio] {
                for _ in 0..30 {
                    let draft_lengths: Vec<u32> = (0..7).map(|_| rng.random_range(0..=12)).collect();
                    let sends_distributions: Vec<bool> = (0..7).map(|_| rng.random_bool(0.5)).collect();
                    let state = ev.state(&draft_lengths, &sends_distributions, objective).unwrap();
                    let mut moved = (draft_lengths.clone(), sends_distributions.clone());
                    let mut changes = Vec::new();
                    for k in 0..7 {
                        if rng.random_bool(0.3) {
                            let c = (k, rng.random_range(0..=12), rng.random_bool(0.5));
                            moved.0[k] = c.1;
                            moved.1[k] = c.2;
                            changes.push(c);
                        }
                    }
                    let fast = ev.try_moves(&state, &changes, objective, &mut scratch);
                    let full = ev.state(&moved.0, &moved.1, objective).unwrap().value;
                    assert!(close(fast, full, 1e-12), "{fast} vs {full}");
                    // The committed move lands on the same point and value.
                    let mut applied = state.clone();
                    ev.apply_moves(&mut applied, &changes, objective, &mut scratch);
                    assert_eq!(
                        (&applied.draft_lengths, &applied.sends_distributions),
                        (&moved.0, &moved.1)
                    );
                    assert!(close(applied.value, full, 1e-12), "{} vs {full}", applied.value);
                    // Applying a kept try reuses its φ and T_comm values and lands on the same state exactly.
                    let again = ev.try_moves(&state, &changes, objective, &mut scratch);
                    assert_eq!(again.to_bits(), fast.to_bits());
                    ev.keep_last_try(&state, &changes, &mut scratch);
                    let mut reused = state.clone();
                    ev.apply_moves(&mut reused, &changes, objective, &mut scratch);
                    assert_eq!(reused, applied);
                }
            }
        }
    }
}

#[test]
fn a_move_skipped_by_the_bound_is_never_above_its_threshold() {
    // `try_moves_above` skips a move only when an upper bound (exact tokens and uplink latency over a lower
    // bound on E[T_comm]) is below the threshold; otherwise it returns exactly `try_moves`. Single-device moves
    // that remove a rejection use the per-outcome (m − 1)/m bound, the others the monotonicity of T_comm.
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let mut scratch = Scratch::default();
    let (mut skipped, mut kept) = (0, 0);
    for modes in [
        ModeScheme::Optimal,
        ModeScheme::AllUl,
        ModeScheme::AllDl,
        ModeScheme::Random,
    ] {
        let round = random_round(&mut rng, 7, 0, 12, PayloadPolicy::Choose);
        let correction = CorrectionPolicy {
            modes,
            split: CorrectionSplit::Equal,
        };
        for expectation in [Expectation::Saa, Expectation::Exact { limit: 1 << 16 }] {
            let Ok(ev) = Evaluator::new(&round, expectation, correction) else {
                continue;
            };
            for _ in 0..40 {
                let draft_lengths: Vec<u32> = (0..7).map(|_| rng.random_range(0..=12)).collect();
                let sends_distributions: Vec<bool> = (0..7).map(|_| rng.random_bool(0.3)).collect();
                let state = ev
                    .state(&draft_lengths, &sends_distributions, Objective::Rate)
                    .unwrap();
                let mut changes = vec![(
                    rng.random_range(0..7),
                    rng.random_range(0..=12),
                    rng.random_bool(0.3),
                )];
                if rng.random_bool(0.3) {
                    let k = (changes[0].0 + 1) % 7;
                    changes.push((k, rng.random_range(0..=12), rng.random_bool(0.3)));
                }
                let exact = ev.try_moves(&state, &changes, Objective::Rate, &mut scratch);
                for scale in [0.5, 0.999, 1.0, 1.001, 1.01, 1.05, 1.2, 2.0] {
                    let threshold = exact * scale;
                    match ev.try_moves_above(&state, &changes, Objective::Rate, threshold, &mut scratch) {
                        None => {
                            skipped += 1;
                            assert!(
                                exact < threshold,
                                "{modes:?} {changes:?}: skipped {exact} ≥ {threshold}"
                            );
                        }
                        Some(v) => {
                            kept += 1;
                            assert_eq!(v.to_bits(), exact.to_bits());
                        }
                    }
                }
            }
        }
    }
    // Both branches ran, so the test can fail either way.
    assert!(skipped > 100 && kept > 100, "skipped {skipped}, kept {kept}");
}

#[test]
fn unified_is_never_below_either_paper_and_choose_never_below_one_payload() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    for _ in 0..4 {
        let round = random_round(&mut rng, 6, 0, 10, PayloadPolicy::Choose);
        let options = Options {
            expectation: Expectation::Saa,
            exact_space_limit: 0,
            ..Options::default()
        };
        let unified = unified::plan(&round, &options).unwrap();
        for scheme in [Scheme::Exact, Scheme::Best, Scheme::Greedy] {
            let p = PaperPlanner {
                expectation: Expectation::Saa,
                ..PaperPlanner::new(scheme, Objective::Rate)
            }
            .plan(&round)
            .unwrap();
            assert!(
                unified.rate_tokens_per_s >= p.rate_tokens_per_s * (1.0 - 1e-12),
                "{scheme}: {} > unified {}",
                p.rate_tokens_per_s,
                unified.rate_tokens_per_s
            );
        }
        // Pairs only, on the same samples: the `choose` search runs the pair-only search from the same seeds.
        let mut spec = round.spec().clone();
        spec.payload.policy = PayloadPolicy::Pair;
        let pairs = unified::plan(&Round::new(spec).unwrap(), &options).unwrap();
        assert!(unified.rate_tokens_per_s >= pairs.rate_tokens_per_s * (1.0 - 1e-12));
        let total: f64 = unified.uplink_share_hz.iter().sum();
        assert!(total <= round.bandwidth_hz * (1.0 + 1e-9));
    }
}

#[test]
fn invalid_rounds_name_their_field() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let good = random_round(&mut rng, 3, 0, 5, PayloadPolicy::Pair)
        .spec()
        .clone();
    type Edit = Box<dyn Fn(&mut RoundSpec)>;
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|s| s.bandwidth_hz = f64::NAN), "bandwidth_hz"),
        (Box::new(|s| s.max_draft_len = 0), "max_draft_len"),
        (Box::new(|s| s.min_draft_len = 9), "min_draft_len"),
        (Box::new(|s| s.radio.dl_power_w = -1.0), "dl_power_w"),
        (
            Box::new(|s| s.payload.distribution_bits = 0.0),
            "distribution_bits",
        ),
        (Box::new(|s| s.payload.pair_bits = -1.0), "pair_bits"),
        (Box::new(|s| s.saa_samples = 0), "saa_samples"),
        (Box::new(|s| s.devices.clear()), "devices"),
        (
            Box::new(|s| s.devices[2].acceptance = 1.0),
            "devices[2].acceptance",
        ),
        (
            Box::new(|s| s.devices[1].downlink_gain = 0.0),
            "devices[1].downlink_gain",
        ),
        (
            Box::new(|s| s.devices[0].spectral_efficiency = f64::INFINITY),
            "devices[0].spectral_efficiency",
        ),
    ];
    for (edit, field) in cases {
        let mut spec = good.clone();
        edit(&mut spec);
        let msg = Round::new(spec).unwrap_err().to_string();
        assert!(msg.starts_with(&format!("{field}:")), "{msg}");
    }
    let round = Round::new(good).unwrap();
    let ev = Evaluator::new(&round, Expectation::Saa, CorrectionPolicy::default()).unwrap();
    let msg = ev
        .state(&[1, 2], &[false, false], Objective::Rate)
        .unwrap_err()
        .to_string();
    assert!(msg.starts_with("draft_lengths:"), "{msg}");
    let msg = ev
        .state(&[1, 2, 6], &[false; 3], Objective::Rate)
        .unwrap_err()
        .to_string();
    assert!(msg.starts_with("draft_lengths[2]:"), "{msg}");
}

/// A round too large to plan is refused by size before anything K² is allocated: 20,000 devices name `devices`
/// (even one sample is over the limit), 2,000 devices with 1,000 samples name `saa_samples`; the planner says the
/// same.
#[test]
fn oversized_rounds_are_refused_before_allocating() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let one = random_round(&mut rng, 1, 0, 8, PayloadPolicy::Choose)
        .spec()
        .clone();
    let sized = |k: usize, samples: u32| {
        let mut spec = one.clone();
        spec.devices = vec![spec.devices[0]; k];
        spec.saa_samples = samples;
        Round::new(spec).unwrap()
    };
    let msg = Evaluator::new(&sized(20_000, 1), Expectation::Saa, CorrectionPolicy::default())
        .unwrap_err()
        .to_string();
    assert!(msg.starts_with("devices:"), "{msg}");
    let big = sized(2_000, 1_000);
    let msg = Evaluator::new(&big, Expectation::Saa, CorrectionPolicy::default())
        .unwrap_err()
        .to_string();
    assert!(msg.starts_with("saa_samples:"), "{msg}");
    let msg = unified::plan(&big, &unified::Options::default())
        .unwrap_err()
        .to_string();
    assert!(msg.starts_with("saa_samples:"), "{msg}");
}

#[test]
fn paper_schemes_plan_inside_the_rounds_range_and_payload_policy() {
    // Every paper scheme on unified rounds with L ∈ {0..L_max} (and {2..L_max}) under each payload policy: the
    // plan lies in the round's space, and the evaluator refuses one that does not.
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let schemes = Scheme::PER_ROUND.into_iter().filter(|s| *s != Scheme::Unified);
    let schemes: Vec<Scheme> = schemes.collect();
    for policy in [
        PayloadPolicy::Distribution,
        PayloadPolicy::Pair,
        PayloadPolicy::Choose,
    ] {
        for l_min in [0, 2] {
            let round = random_round(&mut rng, 4, l_min, 6, policy);
            for &scheme in &schemes {
                let p = PaperPlanner::new(scheme, Objective::Rate).plan(&round).unwrap();
                for (k, (&l, &d)) in p.draft_lengths.iter().zip(&p.sends_distributions).enumerate() {
                    assert!((l_min..=6).contains(&l), "{scheme} {policy:?}: L[{k}] = {l}");
                    let allowed = if d {
                        policy.allows_distribution()
                    } else {
                        policy.allows_pair()
                    };
                    assert!(
                        allowed,
                        "{scheme} {policy:?}: device {k} sends distributions = {d}"
                    );
                }
                // Pairs are sent by paper B's schemes whenever allowed, distributions by paper A's.
                let want_dists = match scheme.family() {
                    spin_optimize::round::Family::PaperA => policy.allows_distribution(),
                    _ => !policy.allows_pair(),
                };
                assert!(
                    p.sends_distributions.iter().all(|&d| d == want_dists),
                    "{scheme} {policy:?}"
                );
            }
            let ev = Evaluator::new(&round, Expectation::Saa, CorrectionPolicy::default()).unwrap();
            let shares = vec![round.bandwidth_hz / 4.0; 4];
            if l_min > 0 {
                let e = ev
                    .round_plan(
                        Scheme::Fixed,
                        &[l_min - 1, 3, 3, 3],
                        &[policy != PayloadPolicy::Pair; 4],
                        &shares,
                        false,
                    )
                    .unwrap_err()
                    .to_string();
                assert!(e.starts_with("draft_lengths[0]: "), "{e}");
            }
            if policy != PayloadPolicy::Choose {
                let outside = policy == PayloadPolicy::Pair;
                let e = ev
                    .round_plan(Scheme::Fixed, &[3; 4], &[outside; 4], &shares, false)
                    .unwrap_err()
                    .to_string();
                assert!(e.starts_with("sends_distributions[0]: "), "{e}");
            }
        }
    }
}

#[test]
fn paper_a_schemes_take_the_pair_size_when_only_pairs_are_allowed() {
    // A band so narrow that a distribution per token costs seconds: under `pair` paper A plans the pair upload
    // (and beats its distribution plan by far); under `distribution` its exact planner drafts nothing where the
    // round allows it; with uncharged pairs there is nothing for it to plan.
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut spec = random_round(&mut rng, 2, 0, 4, PayloadPolicy::Pair)
        .spec()
        .clone();
    spec.bandwidth_hz = 2e4;
    let pairs = Round::new(spec.clone()).unwrap();
    let p = PaperPlanner::new(Scheme::Exact, Objective::Rate)
        .plan(&pairs)
        .unwrap();
    assert!(p.sends_distributions.iter().all(|&d| !d));
    spec.payload.policy = PayloadPolicy::Distribution;
    let idle = PaperPlanner::new(Scheme::Exact, Objective::Rate)
        .plan(&Round::new(spec.clone()).unwrap())
        .unwrap();
    assert!(idle.draft_lengths.iter().all(|&l| l == 0), "{idle:?}");
    assert!(idle.rate_tokens_per_s > p.rate_tokens_per_s);
    let mut drafting = spec.clone();
    drafting.min_draft_len = 1;
    let sends_distributions = PaperPlanner::new(Scheme::Exact, Objective::Rate)
        .plan(&Round::new(drafting).unwrap())
        .unwrap();
    assert!(
        p.rate_tokens_per_s > 2.0 * sends_distributions.rate_tokens_per_s,
        "{} vs {}",
        p.rate_tokens_per_s,
        sends_distributions.rate_tokens_per_s
    );
    spec.payload.policy = PayloadPolicy::Pair;
    spec.payload.pair_bits = 0.0;
    let e = PaperPlanner::new(Scheme::Exact, Objective::Rate)
        .plan(&Round::new(spec).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("payload: exact plans"), "{e}");
}

#[test]
fn printed_values_are_the_exact_model_values_where_the_expectation_is_exact() {
    // Small rounds (5^3 = 125 outcomes): every scheme's plan is scored exactly, bit for bit the exact evaluator's
    // value at that plan, and none is above the unified planner's proven optimum.
    let mut rng = ChaCha8Rng::seed_from_u64(77);
    for policy in [
        PayloadPolicy::Pair,
        PayloadPolicy::Choose,
        PayloadPolicy::Distribution,
    ] {
        for _ in 0..3 {
            let round = random_round(&mut rng, 3, 0, 4, policy);
            let exact = Evaluator::new(
                &round,
                Expectation::Exact { limit: 4096 },
                CorrectionPolicy::default(),
            )
            .unwrap();
            let unified = unified::plan(&round, &Options::default()).unwrap();
            assert!(unified.proven_optimal && unified.estimate.is_exact());
            for scheme in Scheme::PER_ROUND {
                let p = spin_optimize::round::planner(scheme, &Options::default(), 2)
                    .plan(&round)
                    .unwrap();
                assert!(p.estimate.is_exact(), "{scheme}: {:?}", p.estimate);
                let at = exact
                    .round_plan(
                        scheme,
                        &p.draft_lengths,
                        &p.sends_distributions,
                        &p.uplink_share_hz,
                        false,
                    )
                    .unwrap();
                assert_eq!(
                    p.rate_tokens_per_s.to_bits(),
                    at.rate_tokens_per_s.to_bits(),
                    "{scheme}"
                );
                assert_eq!(
                    p.mean_ratio_tokens_per_s.to_bits(),
                    at.mean_ratio_tokens_per_s.to_bits(),
                    "{scheme}"
                );
                assert!(
                    p.rate_tokens_per_s <= unified.rate_tokens_per_s * (1.0 + 1e-12),
                    "{scheme} {policy:?}: {} above the optimum {}",
                    p.rate_tokens_per_s,
                    unified.rate_tokens_per_s
                );
            }
        }
    }
}

#[test]
fn sampled_values_come_with_their_sample_count_and_an_interval_that_holds_the_exact_value() {
    // 7^4 = 2401 outcomes: scored by SAA on 400 samples, then exactly; the exact value lies within the printed
    // 95 % interval (widened 1.5×, a fixed-seed check, not a coverage claim) and the interval shrinks with N.
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    for _ in 0..4 {
        let mut spec = random_round(&mut rng, 4, 0, 6, PayloadPolicy::Pair)
            .spec()
            .clone();
        spec.saa_samples = 400;
        let round = Round::new(spec.clone()).unwrap();
        let saa = PaperPlanner {
            expectation: Expectation::Saa,
            fixed_draft_len: 3,
            ..PaperPlanner::new(Scheme::Fixed, Objective::Rate)
        };
        let p = saa.plan(&round).unwrap();
        assert_eq!(p.draft_lengths, [3; 4]);
        let spin_optimize::round::PlanEstimate::Saa { samples, .. } = p.estimate else {
            panic!("{:?}", p.estimate)
        };
        assert_eq!(samples, 400);
        let exact = Evaluator::new(
            &round,
            Expectation::Exact { limit: 4096 },
            CorrectionPolicy::default(),
        )
        .unwrap()
        .round_plan(
            Scheme::Fixed,
            &p.draft_lengths,
            &p.sends_distributions,
            &p.uplink_share_hz,
            false,
        )
        .unwrap();
        for objective in [Objective::Rate, Objective::MeanRatio] {
            let ci = p.estimate.ci95(objective).unwrap();
            assert!(ci > 0.0);
            assert!(
                (p.goodput(objective) - exact.goodput(objective)).abs() <= 1.5 * ci,
                "{objective:?}: {} ± {ci} vs exact {}",
                p.goodput(objective),
                exact.goodput(objective)
            );
        }
        spec.saa_samples = 1600;
        let big = Evaluator::new(
            &Round::new(spec).unwrap(),
            Expectation::Saa,
            CorrectionPolicy::default(),
        )
        .unwrap()
        .round_plan(
            Scheme::Fixed,
            &p.draft_lengths,
            &p.sends_distributions,
            &p.uplink_share_hz,
            false,
        )
        .unwrap();
        let (a, b) = (
            p.estimate.ci95(Objective::Rate).unwrap(),
            big.estimate.ci95(Objective::Rate).unwrap(),
        );
        assert!(b < 0.75 * a, "{b} vs {a}");
    }
}

#[test]
fn paper_a_exact_drafts_nothing_where_the_round_allows_it_and_that_is_better() {
    // Unified rounds with L ∈ {0..4} on a narrow band (50–500 kHz), where a distribution per token costs more
    // than it brings for some devices: `exact` leaves them idle (L = 0), its printed value is at least that of its
    // plan with L ≥ 1 forced (the same scheme on the round with min_draft_len 1), strictly above it whenever a
    // device is idle, and it is the exact model value of its plan bit for bit; under `distribution` it is the
    // unified planner's proven optimum (the same problem there).
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let planner = PaperPlanner::new(Scheme::Exact, Objective::Rate);
    let mut idle = 0;
    for policy in [PayloadPolicy::Distribution, PayloadPolicy::Choose] {
        for case in 0..8 {
            let mut spec = random_round(&mut rng, 3, 0, 4, policy).spec().clone();
            spec.bandwidth_hz = rng.random_range(5e4..5e5);
            // Paper A's model: no price on the pass's positions.
            spec.verify_per_draft_token_s = 0.0;
            let round = Round::new(spec.clone()).unwrap();
            spec.min_draft_len = 1;
            let forced = Round::new(spec).unwrap();
            let p = planner.plan(&round).unwrap();
            let q = planner.plan(&forced).unwrap();
            assert!(q.draft_lengths.iter().all(|&l| l >= 1));
            assert!(
                p.rate_tokens_per_s >= q.rate_tokens_per_s * (1.0 - 1e-12),
                "{policy:?} {case}: {} ({:?}) below {} ({:?})",
                p.rate_tokens_per_s,
                p.draft_lengths,
                q.rate_tokens_per_s,
                q.draft_lengths
            );
            if p.draft_lengths.contains(&0) {
                idle += 1;
                assert!(p.rate_tokens_per_s > q.rate_tokens_per_s, "{policy:?} {case}");
            }
            // 5^3 = 125 outcomes: the exact model value of the plan.
            let at = Evaluator::new(
                &round,
                Expectation::Exact { limit: 4096 },
                CorrectionPolicy::default(),
            )
            .unwrap()
            .round_plan(
                Scheme::Exact,
                &p.draft_lengths,
                &p.sends_distributions,
                &p.uplink_share_hz,
                false,
            )
            .unwrap();
            assert!(p.estimate.is_exact());
            assert_eq!(p.rate_tokens_per_s.to_bits(), at.rate_tokens_per_s.to_bits());
            assert_eq!(
                p.mean_ratio_tokens_per_s.to_bits(),
                at.mean_ratio_tokens_per_s.to_bits()
            );
            if policy == PayloadPolicy::Distribution {
                let u = unified::plan(&round, &Options::default()).unwrap();
                assert!(p.proven_optimal && u.proven_optimal);
                assert!(
                    (p.rate_tokens_per_s - u.rate_tokens_per_s).abs() <= 1e-9 * u.rate_tokens_per_s,
                    "{case}: {} ({:?}) vs unified {} ({:?})",
                    p.rate_tokens_per_s,
                    p.draft_lengths,
                    u.rate_tokens_per_s,
                    u.draft_lengths
                );
            }
        }
    }
    assert!(idle >= 4, "{idle}");
}
