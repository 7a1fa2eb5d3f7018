//! The prediction check of `multispin simulate`: the planner's predicted goodput beside the measured one for every
//! scheme of a run, and the test of the assumption behind every prediction, that each drafted token is accepted
//! independently with a per-device probability α_k (docs/unified.md, "Prediction against measurement").

use spin_net::server::{RoundTrace, Summary};

/// What one scheme's run says about its own prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct PredictionCheck {
    /// Scheme name.
    pub scheme: String,
    /// Measured goodput: all tokens over the run's duration (tokens/s).
    pub measured: f64,
    /// The planner's predicted goodput, averaged over rounds (tokens/s).
    pub predicted: f64,
    /// The measured goodput averaged the way the prediction is: the mean over rounds of tokens_r / latency_r.
    pub measured_round_mean: f64,
    /// Device-rounds with a kept draft of at least one token.
    pub drafts: u64,
    /// The pooled acceptance estimate Σ accepted / Σ (accepted + rejections) (the i.i.d. maximum likelihood).
    pub alpha: f64,
    /// Drafts accepted in full, counted.
    pub full_observed: u64,
    /// Drafts accepted in full expected if acceptance were i.i.d.: Σ α̂_k^γ with each device's own estimate.
    pub full_expected: f64,
    /// Drafts whose first token was rejected, counted.
    pub first_rejected_observed: u64,
    /// The same expected under i.i.d. acceptance: Σ (1 − α̂_k).
    pub first_rejected_expected: f64,
}

impl PredictionCheck {
    /// (predicted − measured) / measured in percent.
    pub fn error_pct(&self) -> f64 {
        100.0 * (self.predicted - self.measured) / self.measured
    }
}

/// The check of one run from its summary and trace. Dropped and lost drafts and rounds with γ = 0 carry no
/// acceptance information and are left out.
pub fn check(summary: &Summary, rounds: &[RoundTrace]) -> PredictionCheck {
    let kept = || {
        rounds
            .iter()
            .flat_map(|r| &r.devices)
            .filter(|d| d.draft_len > 0 && d.mode.verified())
    };
    // Per device: accepted tokens and rejections, whose ratio is the i.i.d. maximum-likelihood α̂_k.
    let n = kept().map(|d| d.device + 1).max().unwrap_or(0);
    let mut accepted = vec![0u64; n];
    let mut rejections = vec![0u64; n];
    for d in kept() {
        accepted[d.device] += u64::from(d.accepted);
        rejections[d.device] += u64::from(d.accepted < d.draft_len);
    }
    let alpha_of = |k: usize| {
        let total = accepted[k] + rejections[k];
        if total == 0 {
            0.0
        } else {
            accepted[k] as f64 / total as f64
        }
    };
    let (a, r): (u64, u64) = (accepted.iter().sum(), rejections.iter().sum());
    let mut c = PredictionCheck {
        scheme: summary.scheme.to_string(),
        measured: summary.goodput,
        predicted: summary.predicted_goodput,
        measured_round_mean: 0.0,
        drafts: 0,
        alpha: if a + r == 0 {
            0.0
        } else {
            a as f64 / (a + r) as f64
        },
        full_observed: 0,
        full_expected: 0.0,
        first_rejected_observed: 0,
        first_rejected_expected: 0.0,
    };
    for d in kept() {
        let alpha = alpha_of(d.device);
        c.drafts += 1;
        c.full_observed += u64::from(d.accepted == d.draft_len);
        c.full_expected += alpha.powi(d.draft_len as i32);
        c.first_rejected_observed += u64::from(d.accepted == 0);
        c.first_rejected_expected += 1.0 - alpha;
    }
    let rates: Vec<f64> = rounds
        .iter()
        .filter(|r| r.latency_s > 0.0)
        .map(|r| r.tokens as f64 / r.latency_s)
        .collect();
    if !rates.is_empty() {
        c.measured_round_mean = rates.iter().sum::<f64>() / rates.len() as f64;
    }
    c
}

/// The checks as a table, one line per scheme, with the rank of each scheme by measured and by predicted goodput.
pub fn table(checks: &[PredictionCheck]) -> String {
    let rank = |key: fn(&PredictionCheck) -> f64| -> Vec<usize> {
        let mut order: Vec<usize> = (0..checks.len()).collect();
        order.sort_by(|&i, &j| key(&checks[j]).total_cmp(&key(&checks[i])));
        let mut rank = vec![0; checks.len()];
        for (r, i) in order.into_iter().enumerate() {
            rank[i] = r + 1;
        }
        rank
    };
    let by_measured = rank(|c| c.measured);
    let by_predicted = rank(|c| c.predicted);
    let mut s = format!(
        "{:<11} {:>9} {:>9} {:>7} {:>9} {:>5} {:>5} {:>6} {:>6} {:>6} {:>6} {:>6}\n",
        "scheme",
        "measured",
        "predicted",
        "error%",
        "per-round",
        "rank",
        "rank^",
        "alpha",
        "full",
        "full^",
        "rej1",
        "rej1^"
    );
    for (i, c) in checks.iter().enumerate() {
        s.push_str(&format!(
            "{:<11} {:>9.1} {:>9.1} {:>7.1} {:>9.1} {:>5} {:>5} {:>6.3} {:>6} {:>6.1} {:>6} {:>6.1}\n",
            c.scheme,
            c.measured,
            c.predicted,
            c.error_pct(),
            c.measured_round_mean,
            by_measured[i],
            by_predicted[i],
            c.alpha,
            c.full_observed,
            c.full_expected,
            c.first_rejected_observed,
            c.first_rejected_expected
        ));
    }
    s.push_str(
        "(per-round: mean of tokens/latency over rounds, the average the prediction takes; rank by measured, rank^ \
         by predicted; full/rej1: drafts accepted in full / rejected at the first token, counted, and ^ expected if \
         every token were accepted independently with the device's own estimate)",
    );
    s
}

/// The checks as CSV (`prediction.csv`).
pub fn csv(checks: &[PredictionCheck]) -> String {
    let mut s = String::from(
        "scheme,measured_goodput,predicted_goodput,error_pct,measured_round_mean,drafts,alpha,full_observed,\
         full_expected,first_rejected_observed,first_rejected_expected\n",
    );
    for c in checks {
        s.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{}\n",
            c.scheme,
            c.measured,
            c.predicted,
            c.error_pct(),
            c.measured_round_mean,
            c.drafts,
            c.alpha,
            c.full_observed,
            c.full_expected,
            c.first_rejected_observed,
            c.first_rejected_expected
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use spin_net::server::{Clock, DeviceTrace, RoundOutcome, UplinkPayload};

    fn device(k: usize, draft_len: u32, accepted: u32, mode: RoundOutcome) -> DeviceTrace {
        DeviceTrace {
            device: k,
            draft_len,
            uplink_share_hz: 1.0,
            payload: UplinkPayload::Pairs,
            accepted,
            emitted: accepted + 1,
            mode,
            bits_up: 0,
            bits_down: 0,
            air_up_s: 0.0,
            air_corr_s: 0.0,
            draft_s: 0.0,
            wire_up_bytes: 0,
            wire_down_bytes: 0,
        }
    }

    fn round(r: u64, devices: Vec<DeviceTrace>, latency_s: f64) -> RoundTrace {
        RoundTrace {
            scheme: "best",
            round: r,
            clock_s: 0.0,
            latency_s,
            draft_up_s: 0.0,
            draft_s: 0.0,
            verify_s: 0.0,
            correction_s: 0.0,
            tokens: devices.iter().map(|d| u64::from(d.emitted)).sum(),
            predicted_goodput: 0.0,
            plan_s: None,
            devices,
        }
    }

    fn summary() -> Summary {
        Summary {
            scheme: "best",
            clock: Clock::Virtual,
            rounds: 0,
            tokens: 0,
            elapsed_s: 1.0,
            goodput: 50.0,
            predicted_goodput: 60.0,
            draft_up_s: 0.0,
            draft_s: 0.0,
            verify_s: 0.0,
            correction_s: 0.0,
            devices: Vec::new(),
            stopped: String::new(),
            verify_model: None,
        }
    }

    /// Drafts of two devices with i.i.d. acceptance (α = 0.3 and 0.8, γ = 1..6): the counts match their
    /// expectations within a few standard deviations; bursty acceptance (a whole draft accepted or rejected at
    /// once, same α) shows more full acceptances and far more first rejections than i.i.d. acceptance predicts.
    #[test]
    fn iid_acceptance_matches_its_expectation_and_bursty_acceptance_does_not() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let (mut iid, mut bursty) = (Vec::new(), Vec::new());
        for r in 0..4000u64 {
            let gamma = 1 + (r % 6) as u32;
            let mut a = Vec::new();
            let mut b = Vec::new();
            for (k, alpha) in [0.3f64, 0.8].into_iter().enumerate() {
                let n = (0..gamma).take_while(|_| rng.random::<f64>() < alpha).count() as u32;
                a.push(device(k, gamma, n, RoundOutcome::Server));
                let all = rng.random::<f64>() < alpha;
                b.push(device(
                    k,
                    gamma,
                    if all { gamma } else { 0 },
                    RoundOutcome::Server,
                ));
            }
            iid.push(round(r, a, 0.5));
            bursty.push(round(r, b, 0.5));
        }
        // A dropped draft and a γ = 0 round carry no acceptance information.
        iid.push(round(
            4000,
            vec![
                device(0, 5, 0, RoundOutcome::Dropped),
                device(1, 0, 0, RoundOutcome::Server),
            ],
            0.5,
        ));
        let c = check(&summary(), &iid);
        assert_eq!(c.drafts, 8000);
        let close = |obs: u64, exp: f64| (obs as f64 - exp).abs() < 4.0 * exp.sqrt() + 1.0;
        assert!(close(c.full_observed, c.full_expected), "{c:?}");
        assert!(
            close(c.first_rejected_observed, c.first_rejected_expected),
            "{c:?}"
        );
        assert!((c.error_pct() - 20.0).abs() < 1e-12);
        let b = check(&summary(), &bursty);
        // All-or-nothing drafts inflate α̂ (a full draft counts γ acceptances), so the surplus shows most in the
        // first-token rejections; the full acceptances are still well above their expectation.
        assert!(
            !close(b.full_observed, b.full_expected) && b.full_observed as f64 > b.full_expected,
            "{b:?}"
        );
        assert!(
            b.first_rejected_observed as f64 > 1.5 * b.first_rejected_expected,
            "{b:?}"
        );
        // Every round here takes 0.5 s: the per-round mean is the mean of tokens / 0.5.
        let mean: f64 = iid.iter().map(|r| r.tokens as f64 / 0.5).sum::<f64>() / iid.len() as f64;
        assert!((c.measured_round_mean - mean).abs() < 1e-9);
    }

    #[test]
    fn ranks_follow_measured_and_predicted_goodput() {
        let mut a = check(&summary(), &[]);
        a.scheme = "a".into();
        let mut b = a.clone();
        b.scheme = "b".into();
        b.measured = 70.0;
        b.predicted = 40.0;
        let t = table(&[a, b]);
        let line = |name: &str| -> Vec<String> {
            let l = t.lines().find(|l| l.starts_with(name)).unwrap_or_default();
            l.split_whitespace().map(str::to_owned).collect()
        };
        // a: measured 50 (rank 2), predicted 60 (rank 1); b: measured 70 (rank 1), predicted 40 (rank 2).
        assert_eq!(&line("a ")[5..7], ["2", "1"]);
        assert_eq!(&line("b ")[5..7], ["1", "2"]);
    }
}
