//! The session table: sessions and their credentials (id and resume secret from the OS CSPRNG), the handshake
//! (`Hello` → `Welcome` or a typed refusal: version, token, identity, resume, admission limits), detaching, the
//! resume window and the release of abandoned sessions.

use super::*;

pub(super) struct Session {
    pub(super) id: u64,
    /// The resume secret handed out in `Welcome` (compared in constant time).
    pub(super) secret: [u8; SECRET_BYTES],
    /// The address the session was opened from (its pending-session quota).
    pub(super) addr: IpAddr,
    pub(super) conn: Option<ConnHandle>,
    /// When its connection went (the resume window runs from here).
    pub(super) left_at: Option<Instant>,
    /// Whether one of its drafts was accepted (before that it counts against the pending-session limits).
    pub(super) drafted: bool,
    /// Whether its connection let the last round's wall deadline pass without an answer (it may be half-open: a
    /// resume with the right secret then replaces it instead of being `Busy`).
    pub(super) silent: bool,
    /// Ended without finishing: `Bye`, or the resume window passed. Its memory is released; it cannot resume.
    pub(super) ended: bool,
    pub(super) mean_gain: f64,
    pub(super) draft_token_s: f64,
    pub(super) measured_draft: Option<f64>,
    /// The planners' acceptance evidence ([`RecentAlpha`]).
    pub(super) recent_alpha: RecentAlpha,
    pub(super) done: bool,
    pub(super) rounds: u64,
    pub(super) dropped: u64,
}

/// The acceptance evidence the controller plans a device with: the verifier's recorded acceptance probabilities,
/// each round's weighted `ServerConfig::alpha_memory` times the round before's. The text a device writes changes what its
/// draft gets right, and a device planned with L = 0 adds no evidence: forgetting lets its estimate return to the
/// prior, so it is asked to draft again instead of being judged for ever on the rounds that stopped it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct RecentAlpha {
    /// The verifier's sample count and sum when last read.
    seen: (u64, f64),
    /// Weighted count and sum.
    weight: f64,
    sum: f64,
}

impl RecentAlpha {
    /// Ages the evidence by one round (`memory`: the weight of the evidence so far) and adds what the verifier
    /// recorded since the last read (`estimate`: its ratio estimate now, None before two samples); returns the
    /// weighted mean and weight.
    pub(super) fn update(&mut self, memory: f64, estimate: Option<(f64, u64)>) -> (f64, f64) {
        let (mean, n) = estimate.unwrap_or((0.0, 0));
        let sum = mean * n as f64;
        let (n0, sum0) = self.seen;
        self.weight = memory * self.weight + n.saturating_sub(n0) as f64;
        self.sum = memory * self.sum + (sum - sum0).max(0.0);
        self.seen = (n, sum);
        if self.weight > 0.0 {
            ((self.sum / self.weight).clamp(0.0, 1.0), self.weight)
        } else {
            (0.0, 0.0)
        }
    }
}

/// A fresh session id and resume secret from the operating system's CSPRNG (never from the run's seed: ids must
/// not be predictable, and a run's reproducibility must not depend on them).
pub(super) fn fresh_credentials() -> Result<(u64, [u8; SECRET_BYTES])> {
    let os = |e: getrandom::Error| NetError::Io(std::io::Error::other(format!("the OS random source: {e}")));
    let mut secret = [0u8; SECRET_BYTES];
    getrandom::fill(&mut secret).map_err(os)?;
    Ok((getrandom::u64().map_err(os)?, secret))
}

impl Engine {
    /// Detaches device `k`'s connection (gone, refused or silent); its resume window starts now.
    pub(super) fn detach(&mut self, k: usize) -> Option<ConnHandle> {
        let c = self.sessions[k].conn.take();
        if c.is_some() {
            self.sessions[k].left_at = Some(Instant::now());
        }
        c
    }

    /// Ends device `k`'s session before it finished (`Bye`, or its resume window passed): its cache is released and
    /// its id forgotten, so it can never be resumed; the run no longer waits for it.
    pub(super) fn end_session(&mut self, k: usize) -> Result<()> {
        let s = &mut self.sessions[k];
        if s.ended {
            return Ok(());
        }
        s.ended = true;
        s.conn = None;
        self.by_id.remove(&s.id);
        self.verifier.release(k)?;
        Ok(())
    }

    /// Ends every disconnected, unfinished session whose resume window has passed; returns when the next one will.
    pub(super) fn expire(&mut self) -> Result<Option<Instant>> {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for k in 0..self.sessions.len() {
            let s = &self.sessions[k];
            if s.ended || s.done || s.conn.is_some() {
                continue;
            }
            let Some(left) = s.left_at else { continue };
            let end = left + self.cfg.resume_window;
            if end <= now {
                self.end_session(k)?;
                self.expired += 1;
            } else {
                next = Some(next.map_or(end, |n| n.min(end)));
            }
        }
        Ok(next)
    }

    /// Sessions that still count (not ended).
    pub(super) fn live(&self) -> usize {
        self.sessions.iter().filter(|s| !s.ended).count()
    }

    /// Sessions that have not drafted yet, in all and from `addr`.
    pub(super) fn pending(&self, addr: IpAddr) -> (usize, usize) {
        self.sessions
            .iter()
            .filter(|s| !s.ended && !s.done && !s.drafted)
            .fold((0, 0), |(all, here), s| {
                (all + 1, here + usize::from(s.addr == addr))
            })
    }

    /// An operator notice: to the callback when one was given, else to the log.
    pub(super) fn notify(&mut self, text: &str) {
        self.notices.say(text);
    }

    /// Whom the server waits for before its first round.
    pub(super) fn waiting_notice(&self) -> String {
        let joined: Vec<String> = self
            .sessions
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.ended)
            .map(|(k, s)| {
                let state = if s.conn.is_some() {
                    "connected"
                } else {
                    "disconnected"
                };
                format!("device {k} from {} ({state})", s.addr)
            })
            .collect();
        let have = joined.len();
        let want = self.cfg.min_devices;
        format!(
            "waiting for {} more device{} before the first round: {have} of {want} joined{}",
            want - have.min(want),
            if want - have.min(want) == 1 { "" } else { "s" },
            if joined.is_empty() {
                String::new()
            } else {
                format!(": {}", joined.join(", "))
            }
        )
    }

    pub(super) fn session_params(&self) -> SessionParams {
        SessionParams {
            temperature: self.cfg.temperature,
            exchange: self.cfg.exchange(),
            v_eff: self.v_eff,
            q_bits: self.cfg.q_bits,
            seed: self.cfg.seed,
            max_new_tokens: self.cfg.max_new_tokens as u32,
        }
    }

    pub(super) fn welcome(&self, k: usize) -> Result<ServerMsg> {
        let s = &self.sessions[k];
        Ok(ServerMsg::Welcome {
            version: PROTOCOL_VERSION,
            session: s.id,
            secret: s.secret,
            device: k as u32,
            identity: self.cfg.identity,
            committed: self.verifier.tokens(k)?.to_vec(),
            prompt_len: self.verifier.prompt_len(k)? as u32,
            params: self.session_params(),
        })
    }

    pub(super) fn on_hello(&mut self, conn: ConnHandle, hello: DeviceMsg) -> Result<u64> {
        self.expire()?;
        let DeviceMsg::Hello {
            magic,
            version,
            identity,
            resume,
            prompt,
            distance_m,
            token,
        } = hello
        else {
            return Err(NetError::Protocol("expected Hello".into()));
        };
        if magic != MAGIC {
            return Err(NetError::Version {
                got: format!("magic {magic:?}"),
                want: format!("magic {MAGIC:?}"),
            });
        }
        if version != PROTOCOL_VERSION {
            return Err(NetError::Version {
                got: version.to_string(),
                want: PROTOCOL_VERSION.to_string(),
            });
        }
        if !self.cfg.device_tokens.is_empty() && !proto::token_admitted(&self.cfg.device_tokens, &token) {
            return Err(NetError::Unauthorized(if token.is_empty() {
                "this server admits devices with a token (Hello.token is empty)".into()
            } else {
                "Hello.token is not one of this server's tokens".into()
            }));
        }
        // The target's identity (its vocabulary is the model's, checked at bind).
        proto::check_identity(&self.cfg.identity, "target", &identity, "drafter")?;
        let k = if let Some(r) = resume {
            // An unknown id and a wrong secret get the same answer (no oracle for valid ids); the secret is compared
            // in constant time. Only the session's own device, which knows the secret, learns that it is connected.
            let k = self
                .by_id
                .get(&r.session)
                .copied()
                .filter(|&k| proto::secrets_equal(&self.sessions[k].secret, &r.secret))
                .ok_or(NetError::UnknownSession(r.session))?;
            if self.sessions[k].conn.is_some() {
                if !self.sessions[k].silent {
                    // A live owner is never superseded; a device whose old connection the server has not seen close
                    // yet retries after a back-off.
                    return Err(NetError::Busy(r.session));
                }
                // The connection on record went silent past a wall deadline (half-open: a cut the server never
                // saw); the device proved the secret, so it takes the session back.
                if let Some(old) = self.detach(k) {
                    push(
                        &old.tx,
                        &ServerMsg::Error {
                            code: ErrorCode::Protocol,
                            message: "session: resumed on a new connection after this one went silent".into(),
                        },
                    );
                }
            }
            // A resumed device waits for the next round; anything pending from the round it left is dropped.
            if self.verifier.is_pending(k)? {
                self.verifier.abandon(k)?;
            }
            self.sessions[k].conn = Some(conn);
            self.sessions[k].left_at = None;
            self.sessions[k].silent = false;
            k
        } else {
            if self.live() >= self.cfg.max_devices {
                return Err(NetError::Full(format!(
                    "{} devices (the server's limit)",
                    self.cfg.max_devices
                )));
            }
            let (pending, here) = self.pending(conn.addr);
            if pending >= self.cfg.max_pending {
                return Err(NetError::Full(format!(
                    "{pending} sessions have not drafted yet (the server's limit)"
                )));
            }
            if here >= self.cfg.max_pending_per_addr {
                return Err(NetError::Full(format!(
                    "{here} sessions from {} have not drafted yet (the per-address limit)",
                    conn.addr
                )));
            }
            if prompt.is_empty() {
                return Err(NetError::invalid("prompt", "is empty"));
            }
            if prompt.len() + self.cfg.max_new_tokens > self.max_seq_len {
                return Err(NetError::invalid(
                    "prompt",
                    format!(
                        "{} tokens plus {} to generate exceed the context of {}",
                        prompt.len(),
                        self.cfg.max_new_tokens,
                        self.max_seq_len
                    ),
                ));
            }
            if let Some(d) = distance_m
                && !(d > 0.0 && d.is_finite())
            {
                return Err(NetError::invalid(
                    "distance_m",
                    format!("{} is not a finite number > 0", crate::error::number(d)),
                ));
            }
            let k = self.busy(|v| v.add_devices(&[prompt]))?;
            let distance = distance_m.unwrap_or_else(|| self.cfg.link.drop_distance(self.cfg.seed, k));
            let mean_gain = self.cfg.link.mean_gain(distance)?;
            let draft_token_s = match self.cfg.compute {
                Compute::Profile {
                    draft_token_s,
                    draft_spread,
                    ..
                } => {
                    let mut rng = ChaCha8Rng::seed_from_u64(self.cfg.seed ^ 0x6466_7473);
                    rng.set_stream(k as u64);
                    let u: f64 = rng.random();
                    draft_token_s * (1.0 + draft_spread * u)
                }
                Compute::Measured => 0.0,
            };
            let (mut id, secret) = fresh_credentials()?;
            while id == 0 || self.by_id.contains_key(&id) {
                id = fresh_credentials()?.0;
            }
            self.by_id.insert(id, k);
            let addr = conn.addr;
            self.sessions.push(Session {
                id,
                secret,
                addr,
                conn: Some(conn),
                left_at: None,
                drafted: false,
                silent: false,
                ended: false,
                mean_gain,
                draft_token_s,
                measured_draft: None,
                recent_alpha: RecentAlpha::default(),
                done: self.verifier.is_done(k)?,
                rounds: 0,
                dropped: 0,
            });
            k
        };
        let w = self.welcome(k)?;
        self.send(k, w);
        Ok(self.sessions[k].id)
    }

    /// Handles an event outside the message it waits for: handshakes, closes; returns a message for the caller.
    pub(super) fn triage(&mut self, ev: Event) -> Option<(usize, DeviceMsg, usize)> {
        match ev {
            Event::Hello { conn, hello, reply } => {
                let r = self.on_hello(conn, hello);
                let _ = reply.send(r);
                None
            }
            Event::Closed { session, conn_id } => {
                if let Some(&k) = self.by_id.get(&session)
                    && self.sessions[k].conn.as_ref().is_some_and(|c| c.id == conn_id)
                {
                    self.detach(k);
                }
                None
            }
            Event::Msg {
                session,
                conn_id,
                msg,
                bytes,
            } => {
                let &k = self.by_id.get(&session)?;
                if self.sessions[k].conn.as_ref().is_none_or(|c| c.id != conn_id) {
                    return None;
                }
                if matches!(msg, DeviceMsg::Bye) {
                    // `Bye` ends the session, finished or not (docs/protocol.md): its connection task has stopped
                    // reading and closes once its queue is written.
                    if !self.sessions[k].done {
                        self.verifier.abandon(k).ok();
                        self.end_session(k).ok();
                    } else {
                        self.detach(k);
                    }
                    return None;
                }
                Some((k, msg, bytes))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acceptance_evidence_ages_and_an_idle_device_keeps_its_estimate_with_less_weight() {
        const M: f64 = 0.97;
        let mut a = RecentAlpha::default();
        assert_eq!(a.update(M, None), (0.0, 0.0));
        // 10 tokens at mean 0.2, then 10 more at 0.8 (the verifier's running mean reaches 0.5).
        let (m, w) = a.update(M, Some((0.2, 10)));
        assert!((m - 0.2).abs() < 1e-12 && (w - 10.0).abs() < 1e-12);
        let (m, w) = a.update(M, Some((0.5, 20)));
        let want = (M * 2.0 + 8.0) / (M * 10.0 + 10.0);
        assert!((m - want).abs() < 1e-12, "{m} vs {want}");
        assert!(m > 0.5, "the recent tokens count more");
        // Rounds without drafts: the mean stays, the weight decays, so the prior takes over.
        let mut weight = w;
        for _ in 0..50 {
            let (m2, w2) = a.update(M, Some((0.5, 20)));
            assert!((m2 - m).abs() < 1e-12 && w2 < weight);
            weight = w2;
        }
        assert!(weight < 0.25 * w);
        // Memory 1 never forgets: the verifier's own running mean.
        let mut all = RecentAlpha::default();
        all.update(1.0, Some((0.2, 10)));
        let (m, w) = all.update(1.0, Some((0.5, 20)));
        assert!((m - 0.5).abs() < 1e-12 && (w - 20.0).abs() < 1e-12);
        assert_eq!(all.update(1.0, Some((0.5, 20))), (m, w));
    }
}
