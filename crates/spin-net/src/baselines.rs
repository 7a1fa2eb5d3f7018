//! Paper A's protocol baselines run on real models beside the networked Multi-SPIN system (paper A §VI-A4, Fig. 6):
//! Cen-SPIN (the server drafts for every device with its own copy of the draft model and verifies), plain batched
//! decoding at the server (no drafting), and P2P-SPIN (one device at a time owns the whole band).
//!
//! Cen-SPIN and plain decoding run in this process, with no device on a socket: a device only uploads its prompt
//! and downloads its tokens, so all that its link contributes is their air time, which comes from the same link
//! model, drop and per-round fading draws as the networked run ([`LinkConfig`]). P2P-SPIN is the networked run
//! itself with one device at a time ([`crate::sim::simulate`] per device, at its own drop distance), the system's
//! goodput that of the devices taking turns. docs/system.md §"Paper A's baselines" gives each time formula.

use crate::controller::{VerifyFit, alpha_with_prior};
use crate::error::{NetError, Result};
use crate::link::LinkConfig;
use crate::server::{
    Clock, Compute, DeviceSummary, DeviceTrace, RoundOutcome, RoundTrace, ServerConfig, Summary,
    UplinkPayload, calibrate_verify,
};
use spin_runtime::Model;
use spin_runtime::drafter::{DistForm, Drafter, Lookup, device_rng, draft_many};
use spin_runtime::probs::sampling;
use spin_runtime::verifier::{Decision, DraftDists, Submission, Verifier, VerifierConfig};
use std::sync::Arc;
use std::time::Instant;

/// A baseline of paper A that `--compare` accepts beside the planners' schemes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// Cen-SPIN: the server drafts for every prompt (batched) and verifies; devices send prompts, get tokens.
    CenSpin,
    /// P2P-SPIN: one device at a time holds the whole band, planned and verified alone.
    P2pSpin,
    /// Plain batched decoding at the server: one target pass per token for every unfinished prompt.
    Plain,
}

impl Baseline {
    /// Every baseline, in the order the comparison lists them.
    pub const ALL: [Baseline; 3] = [Baseline::CenSpin, Baseline::P2pSpin, Baseline::Plain];

    /// The name on the command line and in every output.
    pub fn name(self) -> &'static str {
        match self {
            Baseline::CenSpin => "cen-spin",
            Baseline::P2pSpin => "p2p-spin",
            Baseline::Plain => "plain",
        }
    }

    /// The baseline called `name`, if any.
    pub fn parse(name: &str) -> Option<Baseline> {
        Baseline::ALL.into_iter().find(|b| b.name() == name)
    }
}

/// Cen-SPIN on the server's copy of `drafter` and `target`, for one device per prompt; `on_round` sees each round,
/// and the run ends after the round in which `stop` turns true (the summary says "shutdown").
///
/// Each round the common draft length L maximises Σ_k E[N_k | L] / (L·t_step + T_ver) over 1..=`max_draft_len`
/// (paper A's Cen-SPIN search, `spin_optimize::paper_a::baselines::cen`) with the online α estimates, t_step the
/// server's batched drafting step and T_ver its verification pass of K drafts of L tokens (profile: t_step = K·T̄,
/// unbatched as scenarios/paper-a.toml assumes, and T_fix + K·T_lin + T_tok·K·L; measured: the running mean of
/// the timed drafting steps, and the fit of T_ver(K, L) over the timed passes, a start-up calibration's first, as
/// the server's own). That maximum is the round's predicted goodput. `lookup` turns prompt lookup on for the server's drafting, as
/// `DeviceConfig::lookup` does for a device's.
pub fn cen_spin(
    target: Arc<Model>,
    drafter: Arc<Model>,
    lookup: Option<Lookup>,
    cfg: &ServerConfig,
    prompts: &[Vec<u32>],
    stop: &dyn Fn() -> bool,
    on_round: impl FnMut(&RoundTrace),
) -> Result<Summary> {
    central(target, Some((drafter, lookup)), cfg, prompts, stop, on_round)
}

/// Plain batched decoding at the server for one device per prompt: every round one target pass over every
/// unfinished prompt (a draft of length 0 each), its token sent down. No planner, so no prediction (NaN). `stop`
/// as for [`cen_spin`].
pub fn plain(
    target: Arc<Model>,
    cfg: &ServerConfig,
    prompts: &[Vec<u32>],
    stop: &dyn Fn() -> bool,
    on_round: impl FnMut(&RoundTrace),
) -> Result<Summary> {
    central(target, None, cfg, prompts, stop, on_round)
}

/// Running mean of measured seconds, with a starting guess until the first measurement.
struct Mean {
    sum: f64,
    n: u32,
    guess: f64,
}

impl Mean {
    fn new(guess: f64) -> Self {
        Mean {
            sum: 0.0,
            n: 0,
            guess,
        }
    }
    fn get(&self) -> f64 {
        if self.n == 0 {
            self.guess
        } else {
            self.sum / f64::from(self.n)
        }
    }
    fn add(&mut self, s: f64) {
        self.sum += s;
        self.n += 1;
    }
}

/// E[N | L] of a device whose tokens are accepted with probability α each: (1 − α^(L+1)) / (1 − α).
fn expected_tokens(alpha: f64, len: u32) -> f64 {
    (1.0 - alpha.powi(len as i32 + 1)) / (1.0 - alpha)
}

/// The server-only loop of Cen-SPIN (`drafter` given) and plain decoding (none).
fn central(
    target: Arc<Model>,
    drafter: Option<(Arc<Model>, Option<Lookup>)>,
    cfg: &ServerConfig,
    prompts: &[Vec<u32>],
    stop: &dyn Fn() -> bool,
    mut on_round: impl FnMut(&RoundTrace),
) -> Result<Summary> {
    if prompts.is_empty() {
        return Err(NetError::invalid("devices", "at least one device is needed"));
    }
    if cfg.clock == Clock::Real {
        return Err(NetError::invalid(
            "clock",
            "the server-side baselines (cen-spin, plain) run on the virtual clock only",
        ));
    }
    let scheme = if drafter.is_some() {
        Baseline::CenSpin.name()
    } else {
        Baseline::Plain.name()
    };
    let params = sampling(cfg.temperature)?;
    let vocab = target.config().vocab_size;
    // Cen-SPIN plans L from T_ver(K, L), so under measured compute its passes are calibrated as the server's are, and
    // every pass it times after is added to the fit.
    let mut verify_fit = if drafter.is_some() && cfg.compute == Compute::Measured {
        VerifyFit::of(&calibrate_verify(&target, cfg.max_draft_len, cfg.max_new_tokens)?)
    } else {
        VerifyFit::default()
    };
    let mut verifier = Verifier::new(
        target,
        VerifierConfig {
            params,
            max_new_tokens: cfg.max_new_tokens,
            eos: cfg.eos,
            seed: cfg.seed,
        },
    );
    verifier.add_devices(prompts)?;
    let mut drafters: Vec<Drafter<Arc<Model>>> = match &drafter {
        Some((m, lookup)) => prompts
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let mut d = Drafter::new(
                    m.clone(),
                    p,
                    p.len(),
                    params,
                    DistForm::Dense,
                    device_rng(cfg.seed, k),
                )?;
                d.set_lookup(*lookup)?;
                Ok(d)
            })
            .collect::<Result<_>>()?,
        None => Vec::new(),
    };
    let link: LinkConfig = cfg.link;
    let means: Vec<f64> = (0..prompts.len())
        .map(|k| link.mean_gain(link.drop_distance(cfg.seed, k)))
        .collect::<Result<_>>()?;
    let token_bits = f64::from(spin_core::dist::pair_bits(vocab, 0));
    // The running mean of the measured drafting step (read only under measured compute, as `verify_fit` above; the
    // guess of 5 ms a token stands until the first measurement, as the server's own does).
    let mut step = Mean::new(0.005);
    let k_all = prompts.len();
    let mut rounds_of = vec![0u64; k_all];
    let (mut clock_s, mut predicted_sum) = (0.0f64, 0.0f64);
    let mut sums = [0.0f64; 4];
    let mut round = 0u64;
    let stopped = loop {
        let active: Vec<usize> = (0..k_all)
            .map(|k| Ok((k, verifier.is_done(k)?)))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .filter(|&(_, done)| !done)
            .map(|(k, _)| k)
            .collect();
        if active.is_empty() {
            break "all devices finished";
        }
        if cfg.max_rounds.is_some_and(|m| round >= m) {
            break "round limit";
        }
        if stop() {
            break "shutdown";
        }
        let n = active.len() as f64;
        let gains = link.round_gains(cfg.seed, round, &means)?;
        let t_step = match cfg.compute {
            Compute::Profile { draft_token_s, .. } => n * draft_token_s,
            Compute::Measured => step.get(),
        };
        let verify_model = cfg.compute.planning_verify(&verify_fit);
        let t_ver = |l: u32| verify_model.seconds(active.len(), active.len() as u64 * u64::from(l));
        // The common L of Cen-SPIN (0 for plain decoding) and the goodput it predicts.
        let alphas: Vec<f64> = active
            .iter()
            .map(|&k| {
                let est = verifier.alpha(k)?.ratio_estimate(spin_core::estimate::Z_95)?;
                let (mean, samples) = est.map_or((0.0, 0), |e| (e.value, e.samples));
                Ok(alpha_with_prior(
                    mean,
                    samples,
                    cfg.alpha_prior,
                    cfg.alpha_prior_weight,
                ))
            })
            .collect::<Result<_>>()?;
        let (len, predicted) = if drafter.is_some() {
            (1..=cfg.max_draft_len.max(1))
                .map(|l| {
                    let tokens: f64 = alphas.iter().map(|&a| expected_tokens(a, l)).sum();
                    (l, tokens / (f64::from(l) * t_step + t_ver(l)))
                })
                .fold((1, f64::NEG_INFINITY), |b, c| if c.1 > b.1 { c } else { b })
        } else {
            (0, f64::NAN)
        };
        let lens: Vec<usize> = active
            .iter()
            .map(|&k| Ok((len as usize).min(verifier.max_draft_len(k)?)))
            .collect::<Result<_>>()?;
        // The server drafts for every active device in one batch per step.
        let started = Instant::now();
        let outs = if drafters.is_empty() {
            active
                .iter()
                .map(|_| spin_runtime::drafter::DraftOut {
                    tokens: Vec::new(),
                    probs: Vec::new(),
                    dists: Vec::new(),
                })
                .collect()
        } else {
            let mut picked: Vec<&mut Drafter<Arc<Model>>> = drafters
                .iter_mut()
                .enumerate()
                .filter(|(k, _)| active.contains(k))
                .map(|(_, d)| d)
                .collect();
            draft_many(&mut picked, &lens)?
        };
        let draft_wall = started.elapsed().as_secs_f64();
        let steps = lens.iter().copied().max().unwrap_or(0);
        let draft_s = match cfg.compute {
            Compute::Profile { .. } => steps as f64 * t_step,
            Compute::Measured => draft_wall,
        };
        if steps > 0 {
            step.add(draft_wall / steps as f64);
        }
        let dists: Vec<&[Vec<f32>]> = active
            .iter()
            .map(|&k| drafters.get(k).map_or(&[][..], |d| d.last_dists()))
            .collect();
        let subs: Vec<Submission<'_>> = active
            .iter()
            .zip(&outs)
            .zip(&dists)
            .map(
                |((&k, o), d): ((&usize, &spin_runtime::drafter::DraftOut), _)| Submission {
                    device: k,
                    tokens: &o.tokens,
                    dists: DraftDists::Dense(d),
                },
            )
            .collect();
        let before: Vec<usize> = active
            .iter()
            .map(|&k| Ok(verifier.tokens(k)?.len()))
            .collect::<Result<_>>()?;
        let (decisions, verify_wall) = verifier.verify(&subs)?;
        let drafted: u64 = outs.iter().map(|o| o.tokens.len() as u64).sum();
        verify_fit.add((subs.len(), drafted, verify_wall));
        let verify_s = match cfg.compute {
            Compute::Profile { .. } => verify_model.seconds(subs.len(), drafted),
            Compute::Measured => verify_wall,
        };
        // Air: the prompts go up once (round 0, the band split evenly), each round's tokens come down (the band and
        // the downlink budget split evenly over the active devices).
        let share = link.bandwidth_hz / n;
        let mut up_s = 0.0f64;
        let mut down_s = 0.0f64;
        let mut traces = Vec::with_capacity(active.len());
        let mut tokens = 0u64;
        for (i, &k) in active.iter().enumerate() {
            let accepted = match decisions[i] {
                Decision::Done { accepted, token, .. } => {
                    if let Some(d) = drafters.get_mut(k) {
                        d.commit(accepted, token)?;
                    }
                    accepted
                }
                Decision::Pending { .. } => {
                    return Err(NetError::Protocol(
                        "a dense draft left a correction pending".into(),
                    ));
                }
            };
            let emitted = verifier.tokens(k)?.len() - before[i];
            tokens += emitted as u64;
            rounds_of[k] += 1;
            let bits_up = if round == 0 {
                prompts[k].len() as f64 * token_bits
            } else {
                0.0
            };
            let air_up = if bits_up > 0.0 {
                link.paper_b_link(bits_up).ul_delay_s(share, gains[k])
            } else {
                0.0
            };
            let bits_down = emitted as f64 * token_bits;
            let air_down =
                link.paper_b_link(bits_down)
                    .dl_delay_at_power_s(share, link.dl_power_w / n, gains[k]);
            up_s = up_s.max(air_up);
            down_s = down_s.max(air_down);
            traces.push(DeviceTrace {
                device: k,
                draft_len: lens[i] as u32,
                uplink_share_hz: share,
                payload: UplinkPayload::Pairs,
                accepted: accepted as u32,
                emitted: emitted as u32,
                mode: RoundOutcome::Server,
                bits_up: bits_up as u64,
                bits_down: bits_down as u64,
                air_up_s: air_up,
                air_corr_s: air_down,
                draft_s,
                wire_up_bytes: 0,
                wire_down_bytes: 0,
            });
        }
        let latency_s = up_s + draft_s + verify_s + down_s;
        clock_s += latency_s;
        sums[0] += up_s + draft_s;
        sums[1] += draft_s;
        sums[2] += verify_s;
        sums[3] += down_s;
        predicted_sum += predicted;
        on_round(&RoundTrace {
            scheme,
            round,
            clock_s,
            latency_s,
            draft_up_s: up_s + draft_s,
            draft_s,
            verify_s,
            correction_s: down_s,
            tokens,
            predicted_goodput: predicted,
            plan_s: None,
            devices: traces,
        });
        round += 1;
    };
    let devices = (0..k_all)
        .map(|k| {
            let mut d =
                DeviceSummary::from_verifier(&verifier, k, clock_s, rounds_of[k], 0, verifier.is_done(k)?)?;
            // Plain decoding drafts nothing: no acceptance to report.
            if drafter.is_none() {
                d.acceptance = None;
            }
            Ok(d)
        })
        .collect::<Result<Vec<_>>>()?;
    let total: u64 = devices.iter().map(|d| d.tokens as u64).sum();
    let verify_model = drafter
        .is_some()
        .then(|| cfg.compute.planning_verify(&verify_fit));
    Ok(Summary {
        verify_model,
        scheme,
        clock: cfg.clock,
        rounds: round,
        tokens: total,
        elapsed_s: clock_s,
        goodput: if clock_s > 0.0 {
            total as f64 / clock_s
        } else {
            0.0
        },
        predicted_goodput: if round > 0 {
            predicted_sum / round as f64
        } else {
            f64::NAN
        },
        draft_up_s: sums[0],
        draft_s: sums[1],
        verify_s: sums[2],
        correction_s: sums[3],
        devices,
        stopped: stopped.to_owned(),
    })
}

/// P2P-SPIN from one networked run per device alone with the whole band (`runs[k]`: device k's summary and
/// rounds, each planned by the run's scheme with K = 1): the devices take turns, so the system's goodput is
/// Σ tokens / Σ elapsed, its prediction Σ tokens / Σ (tokens_k / predicted_k). The rounds are concatenated in turn
/// order on one clock.
pub fn p2p_spin(runs: Vec<(Summary, Vec<RoundTrace>)>) -> (Summary, Vec<RoundTrace>) {
    let scheme = Baseline::P2pSpin.name();
    let mut rounds: Vec<RoundTrace> = Vec::new();
    let mut devices = Vec::with_capacity(runs.len());
    let (mut clock, mut tokens, mut predicted_time) = (0.0f64, 0u64, 0.0f64);
    let mut sums = [0.0f64; 4];
    let mut stopped = "all devices finished".to_owned();
    let run_clock = runs.first().map_or(Clock::Virtual, |(s, _)| s.clock);
    for (k, (s, rs)) in runs.into_iter().enumerate() {
        for mut r in rs {
            r.scheme = scheme;
            r.round = rounds.len() as u64;
            r.clock_s += clock;
            for d in &mut r.devices {
                d.device = k;
            }
            rounds.push(r);
        }
        clock += s.elapsed_s;
        tokens += s.tokens;
        predicted_time += if s.predicted_goodput > 0.0 {
            s.tokens as f64 / s.predicted_goodput
        } else {
            f64::INFINITY
        };
        sums[0] += s.draft_up_s;
        sums[1] += s.draft_s;
        sums[2] += s.verify_s;
        sums[3] += s.correction_s;
        if s.stopped != "all devices finished" {
            stopped = s.stopped.clone();
        }
        for mut d in s.devices {
            d.device = k;
            devices.push(d);
        }
    }
    for d in &mut devices {
        d.goodput = if clock > 0.0 { d.tokens as f64 / clock } else { 0.0 };
    }
    let summary = Summary {
        scheme,
        clock: run_clock,
        rounds: rounds.len() as u64,
        tokens,
        elapsed_s: clock,
        goodput: if clock > 0.0 { tokens as f64 / clock } else { 0.0 },
        predicted_goodput: tokens as f64 / predicted_time,
        draft_up_s: sums[0],
        draft_s: sums[1],
        verify_s: sums[2],
        correction_s: sums[3],
        devices,
        stopped,
        verify_model: None,
    };
    (summary, rounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_expected_tokens() {
        for b in Baseline::ALL {
            assert_eq!(Baseline::parse(b.name()), Some(b));
        }
        assert_eq!(Baseline::parse("cen"), None);
        assert!((expected_tokens(0.5, 1) - 1.5).abs() < 1e-12);
        assert!((expected_tokens(0.5, 0) - 1.0).abs() < 1e-12);
    }
}
