//! One round: plan → collect the drafts → verify in one batch → correct (paper B's UL/DL exchange) → account,
//! each a phase over the round's typed state.

use super::*;

/// The drafting time per token the controller assumes for a device before any device's has been measured.
const UNMEASURED_DRAFT_TOKEN_S: f64 = 1e-6;

/// What the plan decided for one device this round, kept here (the trace line is output only, never read back).
pub(super) struct Planned {
    /// L_k.
    draft_len: u32,
    /// B_k, the draft-uplink share in Hz.
    uplink_share_hz: f64,
    /// Whether the draft carries its distributions.
    sends_distributions: bool,
    /// The connection the plan went to: a device that left or resumed since is out of this round.
    conn: Option<u64>,
}

/// A round in flight: what each phase decided or received, read by the phases after it.
pub(super) struct RoundState {
    round: u64,
    /// The devices planned, in index order.
    active: Vec<usize>,
    /// This round's fading draw per device index.
    gains: Vec<f64>,
    predicted_goodput: f64,
    /// Real clock: the wall time of the planning.
    plan_s: Option<f64>,
    planned: BTreeMap<usize, Planned>,
    traces: BTreeMap<usize, DeviceTrace>,
    /// When the plans went out.
    wall0: Instant,
    got: BTreeMap<usize, Got>,
    /// The drafts kept for verification (on time), in index order.
    kept: Vec<usize>,
    /// The slowest kept device's draft + upload, and its drafting alone.
    arrive_max: f64,
    draft_max: f64,
    /// Real clock: when the last kept draft has been on the air for its time.
    real_release: Instant,
    /// Each verified device's committed length before the round.
    before: BTreeMap<usize, usize>,
    verify_s: f64,
    correction_s: f64,
}

impl Engine {
    /// One round: plan → collect → keep (deadlines) → verify → correct → account.
    pub(super) async fn round(&mut self, round: u64, active: &[usize]) -> Result<RoundTrace> {
        let mut st = self.plan_phase(round, active)?;
        self.collect_phase(&mut st).await;
        self.keep_phase(&mut st)?;
        if self.cfg.clock == Clock::Real {
            self.pause_until(st.real_release).await;
        }
        let rejected = self.verify_phase(&mut st)?;
        if !rejected.is_empty() {
            st.correction_s = self
                .correct(st.round, &rejected, &st.gains, &mut st.traces)
                .await?;
        }
        self.account_phase(st)
    }

    /// Plans the round from the online estimates and sends every active device its `Plan`.
    fn plan_phase(&mut self, round: u64, active: &[usize]) -> Result<RoundState> {
        let link = self.cfg.link;
        let means: Vec<f64> = self.sessions.iter().map(|s| s.mean_gain).collect();
        let gains = link.round_gains(self.cfg.seed, round, &means)?;
        // Measured compute: a device that has not drafted yet is planned at the fastest drafting time measured so far,
        // or as if its drafting were free (1 µs a token) before any: a pessimistic guess would have it never asked
        // to draft, and so never measured, now that a pass prices every drafted token.
        let fastest = self
            .sessions
            .iter()
            .filter_map(|s| s.measured_draft)
            .fold(f64::INFINITY, f64::min);
        let unmeasured = if fastest.is_finite() {
            fastest
        } else {
            UNMEASURED_DRAFT_TOKEN_S
        };
        let views: Vec<DeviceView> = active
            .iter()
            .map(|&k| {
                let est = self
                    .verifier
                    .alpha(k)?
                    .ratio_estimate(spin_core::estimate::Z_95)?;
                let (mean, n) = self.sessions[k]
                    .recent_alpha
                    .update(self.cfg.alpha_memory, est.map(|e| (e.value, e.samples)));
                let s = &self.sessions[k];
                let draft_token_s = match self.cfg.compute {
                    Compute::Profile { .. } => s.draft_token_s,
                    Compute::Measured => s.measured_draft.unwrap_or(unmeasured),
                };
                Ok(DeviceView {
                    acceptance: alpha_with_prior_weight(
                        mean,
                        n,
                        self.cfg.alpha_prior,
                        self.cfg.alpha_prior_weight,
                    ),
                    draft_token_s,
                    gain: gains[k],
                    max_draft_len: self.verifier.max_draft_len(k)? as u32,
                })
            })
            .collect::<Result<_>>()?;
        let verify_model = self.verify_model();
        let plan_start = Instant::now();
        let real = self.cfg.clock == Clock::Real;
        let ctl = ControllerConfig {
            scheme: self.cfg.scheme,
            modes: self.cfg.modes,
            max_draft_len: self.cfg.max_draft_len,
            fixed_draft_len: self.cfg.fixed_draft_len,
            // The greedy payload: no distribution goes on the air, so a distribution is priced as the pair that
            // replaces it (paper A's Q_tok per drafted token; paper B's D, which no exchange spends then).
            distribution_bits: if self.greedy_payload {
                self.pair_bits()
            } else {
                self.payload_bits_per_dist()
            },
            pair_bits: self.pair_bits(),
            saa_samples: self.cfg.saa_samples,
            plan_deadline: if real {
                self.cfg.plan_budget.map(|b| plan_start + b)
            } else {
                None
            },
        };
        let mut plan: spin_optimize::round::RoundPlan = plan_round(
            &ctl,
            &link,
            &views,
            &verify_model,
            self.cfg.seed.wrapping_add(round),
        )?;
        let plan_s = real.then(|| plan_start.elapsed().as_secs_f64());
        if self.greedy_payload {
            // Greedy verification needs the drafted tokens only: the verifier decides every rejection itself
            // (`Verifier`'s pair judge under top-1 sampling), so pairs go up whatever the scheme's system sends.
            plan.sends_distributions.iter_mut().for_each(|s| *s = false);
        }
        self.predicted.push(plan.rate_tokens_per_s);
        let mut traces: BTreeMap<usize, DeviceTrace> = BTreeMap::new();
        let mut planned: BTreeMap<usize, Planned> = BTreeMap::new();
        let wall0 = Instant::now();
        for (i, &k) in active.iter().enumerate() {
            let msg = ServerMsg::Plan {
                round,
                draft_len: plan.draft_lengths[i],
                uplink_share_hz: plan.uplink_share_hz[i],
                sends_distributions: plan.sends_distributions[i],
            };
            let down = self.send(k, msg);
            planned.insert(
                k,
                Planned {
                    draft_len: plan.draft_lengths[i],
                    uplink_share_hz: plan.uplink_share_hz[i],
                    sends_distributions: plan.sends_distributions[i],
                    conn: self.conn_id(k),
                },
            );
            traces.insert(
                k,
                DeviceTrace {
                    device: k,
                    draft_len: plan.draft_lengths[i],
                    uplink_share_hz: plan.uplink_share_hz[i],
                    payload: if plan.sends_distributions[i] {
                        UplinkPayload::Distributions
                    } else {
                        UplinkPayload::Pairs
                    },
                    accepted: 0,
                    emitted: 0,
                    mode: RoundOutcome::Lost,
                    bits_up: 0,
                    bits_down: 0,
                    air_up_s: 0.0,
                    air_corr_s: 0.0,
                    draft_s: 0.0,
                    wire_up_bytes: 0,
                    wire_down_bytes: down,
                },
            );
        }
        Ok(RoundState {
            round,
            active: active.to_vec(),
            gains,
            predicted_goodput: plan.rate_tokens_per_s,
            plan_s,
            planned,
            traces,
            wall0,
            got: BTreeMap::new(),
            kept: Vec::new(),
            arrive_max: 0.0,
            draft_max: 0.0,
            real_release: wall0,
            before: BTreeMap::new(),
            verify_s: 0.0,
            correction_s: 0.0,
        })
    }

    /// Whether device `k` is still on the connection it was planned on.
    fn on_planned_conn(&self, st: &RoundState, k: usize) -> bool {
        self.sessions[k].conn.is_some() && self.conn_id(k) == st.planned[&k].conn
    }

    /// Collects the drafts until every planned device answered, left, or the wall deadline passed.
    async fn collect_phase(&mut self, st: &mut RoundState) {
        let round = st.round;
        let wall_deadline = match self.cfg.clock {
            Clock::Real => {
                st.wall0 + Duration::from_secs_f64(self.cfg.round_deadline_s).min(self.cfg.wall_deadline)
            }
            Clock::Virtual => st.wall0 + self.cfg.wall_deadline,
        };
        let mut waiting: Vec<usize> = st.active.clone();
        while !waiting.is_empty() {
            waiting.retain(|&k| self.on_planned_conn(st, k));
            if waiting.is_empty() {
                break;
            }
            let Some(ev) = self.next_event(Some(wall_deadline)).await else {
                break;
            };
            let Some((k, msg, bytes)) = self.triage(ev) else {
                continue;
            };
            let pos = waiting.iter().position(|&w| w == k);
            match (pos, msg) {
                (
                    Some(p),
                    DeviceMsg::Draft {
                        round: r,
                        tokens,
                        probs,
                        dists,
                        draft_s,
                    },
                ) if r == round => {
                    let plan = &st.planned[&k];
                    let (draft_len, sends_distributions) =
                        (plan.draft_len as usize, plan.sends_distributions);
                    match self.check_draft(
                        draft_len,
                        sends_distributions,
                        tokens,
                        probs,
                        dists,
                        draft_s,
                        bytes,
                    ) {
                        Ok(g) => {
                            st.got.insert(k, g);
                            self.sessions[k].drafted = true;
                            self.sessions[k].silent = false;
                        }
                        Err(e) => self.refuse(k, &e),
                    }
                    waiting.remove(p);
                }
                // A straggler's draft of a round already closed: it was told `Dropped`; ignore it.
                (_, DeviceMsg::Draft { round: r, .. }) if r < round => {}
                (_, other) => {
                    let e = NetError::Protocol(format!("unexpected {} in round {round}", kind(&other)));
                    self.refuse(k, &e);
                }
            }
        }
    }

    /// Times every received draft (drafting + air on the run's clock), drops the late ones and the silent devices,
    /// and keeps the rest for verification.
    fn keep_phase(&mut self, st: &mut RoundState) -> Result<()> {
        let link = self.cfg.link;
        let round = st.round;
        for &k in &st.active {
            let Some(g) = st.got.get(&k) else { continue };
            let gamma = g.tokens.len() as f64;
            let draft_s = match self.cfg.compute {
                Compute::Profile { .. } => gamma * self.sessions[k].draft_token_s,
                Compute::Measured => g.draft_s,
            };
            let bits_up: u64 = if g.sends_distributions {
                g.dists.iter().map(|d| d.bits_on_air()).sum()
            } else {
                // Paper B: (token, probability) pairs, ⌈log₂V⌉ + 32 bits each.
                g.tokens.len() as u64 * u64::from(pair_bits(self.vocab as usize, 32))
            };
            let r = link.spectral_efficiency(st.gains[k])?;
            let air = air_time_s(bits_up as f64, st.planned[&k].uplink_share_hz, r);
            let t = st.traces.get_mut(&k).expect("every active device has a trace");
            t.bits_up = bits_up;
            t.air_up_s = air;
            t.draft_s = draft_s;
            t.wire_up_bytes = g.bytes as u64;
            let arrival = match self.cfg.clock {
                Clock::Virtual => draft_s + air,
                Clock::Real => (g.arrived - st.wall0).as_secs_f64() + air,
            };
            if arrival > self.cfg.round_deadline_s {
                t.mode = RoundOutcome::Dropped;
                self.sessions[k].dropped += 1;
                t.wire_down_bytes += self.send(k, ServerMsg::Dropped { round });
                continue;
            }
            if self.cfg.clock == Clock::Real {
                st.real_release = st.real_release.max(g.arrived + Duration::from_secs_f64(air));
            }
            if g.tokens.is_empty() {
                // γ = 0 carries no draft time.
            } else if let Compute::Measured = self.cfg.compute {
                let per = g.draft_s / gamma;
                let s = &mut self.sessions[k];
                s.measured_draft = Some(s.measured_draft.map_or(per, |m| 0.8 * m + 0.2 * per));
            }
            st.arrive_max = st.arrive_max.max(arrival);
            st.draft_max = st.draft_max.max(draft_s);
            st.kept.push(k);
        }
        // Devices still connected but silent past the wall deadline are dropped for this round (`silent`; on the
        // real clock the deadline is the round deadline, so they are late: `dropped`).
        for i in 0..st.active.len() {
            let k = st.active[i];
            if !st.got.contains_key(&k) && self.on_planned_conn(st, k) {
                let t = st.traces.get_mut(&k).expect("trace");
                t.mode = match self.cfg.clock {
                    Clock::Virtual => RoundOutcome::Silent,
                    Clock::Real => RoundOutcome::Dropped,
                };
                self.sessions[k].silent = true;
                self.sessions[k].dropped += 1;
                t.wire_down_bytes += self.send(k, ServerMsg::Dropped { round });
            }
        }
        Ok(())
    }

    /// Verifies every kept draft in one batch and sends the verdicts of the devices the server corrects itself;
    /// returns the rejected paper-B devices with their rejected position.
    fn verify_phase(&mut self, st: &mut RoundState) -> Result<Vec<(usize, usize)>> {
        let round = st.round;
        let subs_data: Vec<(usize, Got)> = st
            .kept
            .iter()
            .map(|&k| (k, st.got.remove(&k).expect("kept drafts were received")))
            .collect();
        let subs: Vec<Submission<'_>> = subs_data
            .iter()
            .map(|(k, g)| Submission {
                device: *k,
                tokens: &g.tokens,
                dists: if g.sends_distributions {
                    DraftDists::Sparse(&g.dists)
                } else {
                    DraftDists::Probs(&g.probs)
                },
            })
            .collect();
        st.before = subs_data
            .iter()
            .map(|(k, _)| Ok((*k, self.verifier.tokens(*k)?.len())))
            .collect::<Result<_>>()?;
        let (decisions, measured_verify) = self.busy(|v| v.verify(&subs))?;
        let drafted: u64 = subs.iter().map(|s| s.tokens.len() as u64).sum();
        st.verify_s = match self.cfg.compute {
            Compute::Profile { .. } => {
                if subs.is_empty() {
                    0.0
                } else {
                    self.verify_model().seconds(subs.len(), drafted)
                }
            }
            Compute::Measured => measured_verify,
        };
        if !subs.is_empty() {
            self.verify_fit.add((subs.len(), drafted, measured_verify));
        }
        // Verdicts; rejected paper-B devices get a correction mode.
        let mut rejected: Vec<(usize, usize)> = Vec::new();
        for ((k, _), d) in subs_data.iter().zip(&decisions) {
            let k = *k;
            self.sessions[k].rounds += 1;
            match *d {
                Decision::Done { accepted, token, .. } => {
                    let done = self.verifier.is_done(k)?;
                    self.sessions[k].done = done;
                    let t = st.traces.get_mut(&k).expect("trace");
                    t.accepted = accepted as u32;
                    t.mode = RoundOutcome::Server;
                    t.wire_down_bytes += self.send(
                        k,
                        ServerMsg::Verdict {
                            round,
                            accepted: accepted as u32,
                            next: Next::Commit { token, done },
                        },
                    );
                }
                Decision::Pending { position } => rejected.push((k, position)),
            }
        }
        Ok(rejected)
    }

    /// Counts what each verified device committed, advances the clock and the totals, and writes the trace line.
    fn account_phase(&mut self, mut st: RoundState) -> Result<RoundTrace> {
        let mut tokens = 0u64;
        for (&k, &len0) in &st.before {
            let now = self.verifier.tokens(k)?.len();
            let t = st.traces.get_mut(&k).expect("trace");
            if t.mode != RoundOutcome::Lost {
                t.emitted = now.saturating_sub(len0) as u32;
                tokens += u64::from(t.emitted);
            }
        }
        let latency_s = match self.cfg.clock {
            Clock::Virtual => st.arrive_max + st.verify_s + st.correction_s,
            Clock::Real => st.wall0.elapsed().as_secs_f64(),
        };
        self.clock_s += latency_s;
        self.sums[0] += st.arrive_max;
        self.sums[1] += st.draft_max;
        self.sums[2] += st.verify_s;
        self.sums[3] += st.correction_s;
        Ok(RoundTrace {
            scheme: self.cfg.scheme.name(),
            round: st.round,
            clock_s: self.elapsed(),
            latency_s,
            draft_up_s: st.arrive_max,
            draft_s: st.draft_max,
            verify_s: st.verify_s,
            correction_s: st.correction_s,
            tokens,
            predicted_goodput: st.predicted_goodput,
            plan_s: st.plan_s,
            devices: st.traces.into_values().collect(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn check_draft(
        &self,
        draft_len: usize,
        sends_distributions: bool,
        tokens: Vec<u32>,
        probs: Vec<f32>,
        dists: Vec<proto::PackedDist>,
        draft_s: f64,
        bytes: usize,
    ) -> Result<Got> {
        if tokens.len() > draft_len {
            return Err(NetError::invalid(
                "draft.tokens",
                format!("{} tokens for a plan of {draft_len}", tokens.len()),
            ));
        }
        if probs.len() != tokens.len() {
            return Err(NetError::invalid(
                "draft.probs",
                format!("{} probabilities for {} tokens", probs.len(), tokens.len()),
            ));
        }
        if let Some(p) = probs.iter().find(|&&p| !(p > 0.0 && p <= 1.0)) {
            return Err(NetError::invalid("draft.probs", format!("{p} is outside (0, 1]")));
        }
        if let Some(t) = tokens.iter().find(|&&t| t >= self.vocab) {
            return Err(NetError::invalid(
                "draft.tokens",
                format!("{t} is outside the vocabulary of {}", self.vocab),
            ));
        }
        if !(draft_s >= 0.0 && draft_s.is_finite()) {
            return Err(NetError::invalid(
                "draft.draft_s",
                format!("{} is not a finite number ≥ 0", crate::error::number(draft_s)),
            ));
        }
        let dists = match sends_distributions {
            true => {
                if dists.len() != tokens.len() {
                    return Err(NetError::invalid(
                        "draft.dists",
                        format!("{} distributions for {} tokens", dists.len(), tokens.len()),
                    ));
                }
                let d = dists
                    .iter()
                    .map(|p| proto::unpack(p, self.vocab))
                    .collect::<Result<Vec<_>>>()?;
                for (j, (s, &t)) in d.iter().zip(&tokens).enumerate() {
                    if !has_mass(s, t) {
                        return Err(NetError::invalid(
                            format!("draft.dists[{j}]"),
                            format!("token {t} has no mass in its own distribution"),
                        ));
                    }
                }
                d
            }
            false => {
                if !dists.is_empty() {
                    return Err(NetError::invalid(
                        "draft.dists",
                        "must be empty when the plan asks for pairs only",
                    ));
                }
                Vec::new()
            }
        };
        Ok(Got {
            sends_distributions,
            tokens,
            probs,
            dists,
            draft_s,
            bytes,
            arrived: Instant::now(),
        })
    }

    /// Paper B's correction phase for `rejected` (device, position): modes by the reactive policy, then the UL
    /// uploads and DL downloads, each on the air for its Shannon-rate time. Returns T_comm.
    pub(super) async fn correct(
        &mut self,
        round: u64,
        rejected: &[(usize, usize)],
        gains: &[f64],
        traces: &mut BTreeMap<usize, DeviceTrace>,
    ) -> Result<f64> {
        let d_bits = self.payload_bits_per_dist();
        let link = self.cfg.link.paper_b_link(d_bits);
        let g: Vec<f64> = rejected.iter().map(|&(k, _)| gains[k]).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(self.cfg.seed ^ 0x6d6f_6465);
        rng.set_stream(round);
        let sol = reactive::solve(&link, &g, self.cfg.modes, &mut rng)?;
        let share = link.share_hz(rejected.len());
        let mut waiting: BTreeMap<usize, (usize, bool)> = BTreeMap::new();
        // The p each DL device was sent: its correction must be a token with mass in it.
        let mut sent_p: BTreeMap<usize, SparseDist> = BTreeMap::new();
        for (i, &(k, pos)) in rejected.iter().enumerate() {
            let ul = sol.modes[i] == reactive::Mode::Uplink;
            let t = traces.get_mut(&k).expect("trace");
            t.accepted = pos as u32;
            if ul {
                t.mode = RoundOutcome::Ul;
                t.wire_down_bytes += self.send(
                    k,
                    ServerMsg::Verdict {
                        round,
                        accepted: pos as u32,
                        next: Next::SendQ,
                    },
                );
            } else {
                let p = self
                    .verifier
                    .downlink_p(k, self.v_eff as usize, u32::from(self.cfg.q_bits))?;
                let bits = p.bits_on_air();
                let t = traces.get_mut(&k).expect("trace");
                t.mode = RoundOutcome::Dl;
                t.bits_down = bits;
                t.air_corr_s = self.cfg.link.paper_b_link(bits as f64).dl_delay_at_power_s(
                    share,
                    sol.dl_power_w[i],
                    g[i],
                );
                let packed = proto::pack(&p)?;
                sent_p.insert(k, p);
                t.wire_down_bytes += self.send(
                    k,
                    ServerMsg::Verdict {
                        round,
                        accepted: pos as u32,
                        next: Next::Residual { p: packed },
                    },
                );
            }
            waiting.insert(k, (i, ul));
        }
        let ids: BTreeMap<usize, Option<u64>> = waiting.keys().map(|&k| (k, self.conn_id(k))).collect();
        let mut replies: BTreeMap<usize, (usize, bool, DeviceMsg, usize)> = BTreeMap::new();
        let deadline = Instant::now() + self.cfg.wall_deadline;
        while !waiting.is_empty() {
            let gone: Vec<usize> = waiting
                .keys()
                .copied()
                .filter(|&k| self.sessions[k].conn.is_none() || self.conn_id(k) != ids[&k])
                .collect();
            for k in gone {
                waiting.remove(&k);
                self.verifier.abandon(k)?;
                traces.get_mut(&k).expect("trace").mode = RoundOutcome::Lost;
            }
            if waiting.is_empty() {
                break;
            }
            let Some(ev) = self.next_event(Some(deadline)).await else {
                break;
            };
            let Some((k, msg, bytes)) = self.triage(ev) else {
                continue;
            };
            if matches!(msg, DeviceMsg::Draft { round: r, .. } if r <= round) {
                // A late draft of this or an earlier round (the device was told `Dropped`).
                continue;
            }
            let Some(&(i, ul)) = waiting.get(&k) else {
                let e = NetError::Protocol(format!("unexpected {} during corrections", kind(&msg)));
                self.refuse(k, &e);
                continue;
            };
            waiting.remove(&k);
            replies.insert(k, (i, ul, msg, bytes));
        }
        // Resolve in device order, whatever order the replies arrived in: the verifier's draws replay from the seed.
        for (k, (i, ul, msg, bytes)) in replies {
            let outcome: Result<u32> = match (ul, msg) {
                (true, DeviceMsg::Upload { round: r, q }) if r == round => (|| {
                    let q = proto::unpack(&q, self.vocab)?;
                    let t = traces.get_mut(&k).expect("trace");
                    t.bits_up += q.bits_on_air();
                    t.wire_up_bytes += bytes as u64;
                    t.air_corr_s = self
                        .cfg
                        .link
                        .paper_b_link(q.bits_on_air() as f64)
                        .ul_delay_s(share, g[i]);
                    Ok(self.verifier.resolve_uplink(k, &q)?)
                })(),
                (false, DeviceMsg::Corrected { round: r, token }) if r == round => {
                    traces.get_mut(&k).expect("trace").wire_up_bytes += bytes as u64;
                    if sent_p.get(&k).is_some_and(|p| has_mass(p, token)) {
                        self.verifier
                            .resolve_token(k, token)
                            .map(|_| token)
                            .map_err(NetError::from)
                    } else {
                        // norm(max(0, p − q)) is zero wherever p is: exact sampling never draws such a token.
                        Err(NetError::Protocol(format!(
                            "corrected.token: {token} has no mass in the p sent for round {round}"
                        )))
                    }
                }
                (_, other) => Err(NetError::Protocol(format!(
                    "unexpected {} during corrections",
                    kind(&other)
                ))),
            };
            match outcome {
                Ok(token) => {
                    let done = self.verifier.is_done(k)?;
                    self.sessions[k].done = done;
                    let accepted = traces[&k].accepted;
                    traces.get_mut(&k).expect("trace").wire_down_bytes += self.send(
                        k,
                        ServerMsg::Verdict {
                            round,
                            accepted,
                            next: Next::Commit { token, done },
                        },
                    );
                }
                Err(e) => {
                    self.verifier.abandon(k)?;
                    traces.get_mut(&k).expect("trace").mode = RoundOutcome::Lost;
                    self.refuse(k, &e);
                }
            }
        }
        for &k in waiting.keys() {
            self.verifier.abandon(k)?;
            traces.get_mut(&k).expect("trace").mode = RoundOutcome::Lost;
        }
        let t_comm = rejected
            .iter()
            .map(|(k, _)| traces[k].air_corr_s)
            .fold(0.0f64, f64::max);
        if self.cfg.clock == Clock::Real {
            // The exchange is held on the air for its emulated time (the commits go out after it).
            self.pause_until(Instant::now() + Duration::from_secs_f64(t_comm))
                .await;
        }
        Ok(t_comm)
    }
}

/// Whether `token` is a kept entry of `d` with a non-zero code (no renormalisation needed to know).
pub fn has_mass(d: &SparseDist, token: u32) -> bool {
    d.indices()
        .iter()
        .zip(d.values())
        .any(|(&i, &v)| i == token && v > 0.0)
}

pub(super) fn kind(m: &DeviceMsg) -> &'static str {
    match m {
        DeviceMsg::Hello { .. } => "Hello",
        DeviceMsg::Draft { .. } => "Draft",
        DeviceMsg::Upload { .. } => "Upload",
        DeviceMsg::Corrected { .. } => "Corrected",
        DeviceMsg::Bye => "Bye",
    }
}
