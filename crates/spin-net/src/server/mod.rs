//! The edge server: accepts devices over TCP, runs the rounds (plan → draft → verdict → correction) with the
//! target model's [`Verifier`], emulates the wireless link on every message and accounts the round on the chosen
//! clock. docs/system.md describes the round; docs/protocol.md the messages.
//!
//! One task (the engine) owns the verifier, the controller state and the trace; one task per connection decodes
//! frames and forwards them as events, so a malformed or hostile peer is refused and closed by its own task while
//! the engine and every other device go on.
//!
//! The layers: [`config`](ServerConfig) (settings and their checks), `conn` (listener, admission limits, the
//! connection task with its TLS and handshake timeout), `notice` (the operator's notices, one line per refused
//! connection among them), `session` (session table, credentials, the `Hello`
//! handshake, resume window), `round` (the round's phases over a typed `RoundState`), `trace` (the JSON trace); this
//! module holds the engine's loop and the helpers the layers share.

mod config;
mod conn;
mod notice;
mod round;
mod session;
mod trace;

pub use config::{
    Clock, Compute, DEFAULT_KEEPALIVE_EVERY, DEFAULT_MAX_DEVICES, MAX_SERVED_DRAFT_LEN, MAX_WAIT,
    ServerConfig, check_wait,
};
pub use conn::accept_backoff;
use conn::*;
use notice::*;
pub use notice::{REFUSAL_FLUSH_EVERY, REFUSAL_LINES_PER_S};
pub use round::has_mass;
use session::*;
pub use trace::{DeviceSummary, DeviceTrace, RoundOutcome, RoundTrace, Summary, UplinkPayload};

use crate::controller::{
    ControllerConfig, DeviceView, Scheme, VerifyFit, VerifyModel, VerifyPoint, alpha_with_prior_weight,
    plan_round,
};
use crate::error::{NetError, Result};
use crate::link::{LinkConfig, air_time_s};
use crate::proto::{
    self, DeviceMsg, ErrorCode, Exchange, Identity, MAGIC, Next, PROTOCOL_VERSION, SECRET_BYTES, ServerMsg,
    SessionParams,
};
use crate::tls::ServerTls;
use crate::wire::{Stream, frame_bytes, frame_error, framed_stream};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use spin_core::SparseDist;
use spin_core::dist::pair_bits;
use spin_optimize::paper_b::{ModeScheme, reactive};
use spin_optimize::round::Family;
use spin_runtime::Model;
use spin_runtime::speculative::sampling;
use spin_runtime::verifier::{Decision, DraftDists, Submission, Verifier, VerifierConfig};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};

/// A callback for the server's operator notices (e.g. whom it is waiting for).
pub type Notice = Box<dyn FnMut(&str) + Send>;

/// A bound, not yet running server.
pub struct Server {
    listener: TcpListener,
    model: Arc<Model>,
    cfg: ServerConfig,
    notice: Option<Notice>,
}

impl Server {
    /// Binds `addr` (e.g. `127.0.0.1:0`) for the target `model`.
    pub async fn bind(addr: &str, model: Arc<Model>, cfg: ServerConfig) -> Result<Self> {
        // Checked before the address is taken.
        Self::check(&model, &cfg)?;
        let listener = TcpListener::bind(addr).await?;
        Ok(Self::with_listener(listener, model, cfg))
    }

    /// A server on `listener`, a socket the caller bound already (e.g. before loading the target, so that an
    /// address in use is said at once and no other process can take it meanwhile). Call within a tokio runtime.
    pub fn from_std(listener: std::net::TcpListener, model: Arc<Model>, cfg: ServerConfig) -> Result<Self> {
        Self::check(&model, &cfg)?;
        listener.set_nonblocking(true)?;
        Ok(Self::with_listener(TcpListener::from_std(listener)?, model, cfg))
    }

    /// The configuration, and its identity against the target.
    fn check(model: &Model, cfg: &ServerConfig) -> Result<()> {
        cfg.validate()?;
        if cfg.identity.vocab as usize != model.config().vocab_size {
            return Err(NetError::invalid(
                "identity.vocab",
                format!(
                    "{} differs from the target's {}",
                    cfg.identity.vocab,
                    model.config().vocab_size
                ),
            ));
        }
        Ok(())
    }

    /// The server on `listener`, for a `model` and `cfg` that passed [`Server::check`].
    fn with_listener(listener: TcpListener, model: Arc<Model>, cfg: ServerConfig) -> Self {
        Server {
            listener,
            model,
            cfg,
            notice: None,
        }
    }

    /// Sends the server's operator notices (whom it waits for before the first round, every
    /// `ServerConfig::notice_every`; one line per refused connection naming the peer and the reason, at most
    /// [`REFUSAL_LINES_PER_S`] a second) to `f` instead of the `tracing` log. `f` runs on a thread of its own
    /// ([`crate::printer::LinePrinter`]), so it may block (write to stderr) without stalling the server: past
    /// [`crate::printer::PRINTER_QUEUE_LINES`] notices waiting for it, notices are dropped and counted. Every notice
    /// said has reached `f` when `run` returns, unless `f` was blocked for seconds.
    pub fn with_notices(mut self, f: impl FnMut(&str) + Send + 'static) -> Self {
        self.notice = Some(Box::new(f));
        self
    }

    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until every device finished (`stop_when_done`), the round limit, or `shutdown` turns true; calls
    /// `on_round` after every round. On shutdown every connected device is told so.
    pub async fn run(
        self,
        shutdown: watch::Receiver<bool>,
        on_round: impl FnMut(&RoundTrace),
    ) -> Result<Summary> {
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let listener = self.listener;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let limits = ConnLimits {
            max_frame: self.cfg.max_frame_bytes,
            handshake_timeout: self.cfg.handshake_timeout,
            max_connections: self.cfg.max_connections,
            max_per_addr: self.cfg.max_connections_per_addr,
            tls: self.cfg.tls.clone(),
        };
        let notices = Notices::new(self.notice)?;
        let acceptor = tokio::spawn(accept_loop(listener, ev_tx, limits, notices.clone(), stop_rx));
        let params = sampling(self.cfg.temperature)?;
        let greedy_payload = params.top_k() == Some(1) && self.cfg.greedy_payload;
        let mut verifier = Verifier::new(
            self.model.clone(),
            VerifierConfig {
                params,
                max_new_tokens: self.cfg.max_new_tokens,
                eos: self.cfg.eos,
                seed: self.cfg.seed,
            },
        );
        verifier.set_pair_exchange(!greedy_payload);
        let vocab = self.model.config().vocab_size as u32;
        let v_eff = self.cfg.v_eff.min(vocab);
        let verify_fit = VerifyFit::of(&match self.cfg.compute {
            Compute::Measured => tokio::task::block_in_place(|| {
                calibrate_verify(&self.model, self.cfg.max_draft_len, self.cfg.max_new_tokens)
            })?,
            Compute::Profile { .. } => Vec::new(),
        });
        if let Some(m) = verify_fit.model() {
            notices.say(&calibration_notice(&m, verify_fit.passes()));
        }
        let mut engine = Engine {
            verifier,
            sessions: Vec::new(),
            by_id: BTreeMap::new(),
            events: ev_rx,
            shutdown,
            stopping: false,
            clock_s: 0.0,
            wall_start: Instant::now(),
            verify_fit,
            vocab,
            v_eff,
            greedy_payload,
            max_seq_len: self.model.config().max_seq_len,
            cfg: self.cfg,
            traces_tokens: 0,
            sums: [0.0; 4],
            predicted: Vec::new(),
            notices,
            expired: 0,
            keepalive_at: Instant::now(),
        };
        let result = engine.run(on_round).await;
        // Closing the engine's side ends every connection's writer once its queue is flushed.
        let notices = engine.notices.clone();
        drop(engine);
        let _ = stop_tx.send(());
        let _ = acceptor.await;
        notices.flush().await;
        result
    }
}

/// A task aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Engine {
    cfg: ServerConfig,
    verifier: Verifier<Arc<Model>>,
    sessions: Vec<Session>,
    by_id: BTreeMap<u64, usize>,
    events: mpsc::UnboundedReceiver<Event>,
    shutdown: watch::Receiver<bool>,
    stopping: bool,
    clock_s: f64,
    wall_start: Instant,
    /// The fit of the timed passes: the start-up calibration's, then every round's.
    verify_fit: VerifyFit,
    vocab: u32,
    v_eff: u32,
    /// Top-1 sampling with `greedy_payload`: pairs from every device, every rejection corrected by the server.
    greedy_payload: bool,
    max_seq_len: usize,
    traces_tokens: u64,
    /// Σ draft+up, Σ draft, Σ verify, Σ correction.
    sums: [f64; 4],
    predicted: Vec<f64>,
    notices: Notices,
    /// Sessions released at the end of their resume window without finishing.
    expired: usize,
    /// When the connected devices are next sent a `KeepAlive` (while the engine waits).
    keepalive_at: Instant,
}

/// A received draft.
struct Got {
    /// Whether the plan asked for the distributions (they are then in `dists`).
    sends_distributions: bool,
    tokens: Vec<u32>,
    probs: Vec<f32>,
    dists: Vec<SparseDist>,
    draft_s: f64,
    bytes: usize,
    arrived: Instant,
}

impl Engine {
    /// Waits for the next event until `until` (wall); None on timeout or shutdown. While it waits, every connected
    /// device is sent a `KeepAlive` each `keepalive_every`.
    async fn next_event(&mut self, until: Option<Instant>) -> Option<Event> {
        loop {
            if self.stopping {
                return None;
            }
            self.keep_alive();
            let wake = until.map_or(self.keepalive_at, |u| u.min(self.keepalive_at));
            // A closed event channel (the listener gone) disables its branch instead of answering None at once: the
            // engine then waits for its deadline or the shutdown, it never spins.
            tokio::select! {
                Some(ev) = self.events.recv() => return Some(ev),
                _ = self.shutdown.wait_for(|s| *s) => { self.stopping = true; return None; }
                _ = tokio::time::sleep_until(wake.into()) => {
                    if until.is_some_and(|u| Instant::now() >= u) {
                        return None;
                    }
                }
            }
        }
    }

    /// Waits until `t` (wall) without taking events, sending `KeepAlive`s as [`Engine::next_event`] does (a real
    /// clock's air time can be long).
    async fn pause_until(&mut self, t: Instant) {
        loop {
            self.keep_alive();
            if Instant::now() >= t {
                return;
            }
            tokio::time::sleep_until(t.min(self.keepalive_at).into()).await;
        }
    }

    /// Runs `pass` (a target pass: seconds on a large model, or a long prompt's prefill) on this worker while a
    /// task of its own sends every connected device a `KeepAlive` each `keepalive_every`, as [`Engine::next_event`]
    /// does while the engine waits: a device must tell a server busy with a long pass from a hung one (its silence
    /// timeout is twelve intervals by default).
    fn busy<T>(&mut self, pass: impl FnOnce(&mut Verifier<Arc<Model>>) -> T) -> T {
        let txs: Vec<_> = self
            .sessions
            .iter()
            .filter_map(|s| s.conn.as_ref().map(|c| c.tx.clone()))
            .collect();
        let every = self.cfg.keepalive_every;
        let mut at = self.keepalive_at;
        let ticker = AbortOnDrop(tokio::spawn(async move {
            loop {
                tokio::time::sleep_until(at.into()).await;
                for tx in &txs {
                    push(tx, &ServerMsg::KeepAlive);
                }
                at = Instant::now() + every;
            }
        }));
        let out = tokio::task::block_in_place(|| pass(&mut self.verifier));
        drop(ticker);
        out
    }

    /// Sends every connected device a `KeepAlive` if one is due.
    fn keep_alive(&mut self) {
        let now = Instant::now();
        if now < self.keepalive_at {
            return;
        }
        self.keepalive_at = now + self.cfg.keepalive_every;
        for s in &self.sessions {
            if let Some(c) = &s.conn {
                push(&c.tx, &ServerMsg::KeepAlive);
            }
        }
    }

    fn conn_id(&self, k: usize) -> Option<u64> {
        self.sessions[k].conn.as_ref().map(|c| c.id)
    }

    /// Sends `msg` to device `k` (encoded once); returns its body's size in bytes, counted even when the device is
    /// gone.
    fn send(&self, k: usize, msg: ServerMsg) -> u64 {
        match &self.sessions[k].conn {
            Some(c) => push(&c.tx, &msg),
            None => proto::encode(&msg).map_or(0, |b| b.len() as u64),
        }
    }

    /// Refuses device `k`'s current connection (protocol violation) and detaches it; the session may resume.
    fn refuse(&mut self, k: usize, e: &NetError) {
        if let Some(c) = self.detach(k) {
            self.notices.refused(c.peer, e);
            push(
                &c.tx,
                &ServerMsg::Error {
                    code: e.code(),
                    message: e.to_string(),
                },
            );
        }
    }

    fn all_done(&self) -> bool {
        self.sessions.iter().all(|s| s.done || s.ended)
    }

    async fn run(&mut self, mut on_round: impl FnMut(&RoundTrace)) -> Result<Summary> {
        // Admission: rounds start once enough devices joined; meanwhile a notice says whom the server waits for.
        let mut notice_at = Instant::now() + self.cfg.notice_every;
        while self.live() < self.cfg.min_devices && !self.stopping {
            let expiry = self.expire()?;
            let until = expiry.map_or(notice_at, |e| e.min(notice_at));
            match self.next_event(Some(until)).await {
                Some(ev) => {
                    self.triage(ev);
                }
                None if self.stopping => break,
                None => {
                    if Instant::now() >= notice_at {
                        let text = self.waiting_notice();
                        self.notify(&text);
                        notice_at = Instant::now() + self.cfg.notice_every;
                    }
                }
            }
        }
        // The run's clock starts with its first round: on the real clock the wait for devices to join is not
        // part of any round, so it is not charged to the goodput (the virtual clock starts at 0 there too).
        self.wall_start = Instant::now();
        let mut round = 0u64;
        let stopped = loop {
            if *self.shutdown.borrow() {
                self.stopping = true;
            }
            if self.stopping {
                break "shutdown".to_string();
            }
            if self.cfg.max_rounds.is_some_and(|m| round >= m) {
                break "round limit".to_string();
            }
            let expiry = self.expire()?;
            let active: Vec<usize> = (0..self.sessions.len())
                .filter(|&k| {
                    let s = &self.sessions[k];
                    !s.done && !s.ended && s.conn.is_some()
                })
                .collect();
            if active.is_empty() {
                // No round runs without a device that can progress.
                if self.all_done() && self.cfg.stop_when_done && !self.sessions.is_empty() {
                    break if self.expired > 0 {
                        "devices left without resuming".to_string()
                    } else {
                        "all devices finished".to_string()
                    };
                }
                // Wait for a resume or a new device (until the next resume window ends, when one runs).
                match self.next_event(expiry).await {
                    Some(ev) => {
                        self.triage(ev);
                        continue;
                    }
                    None if self.stopping => break "shutdown".to_string(),
                    None => continue,
                }
            }
            let trace = self.round(round, &active).await?;
            self.traces_tokens += trace.tokens;
            on_round(&trace);
            round += 1;
        };
        // Tell every connected device why the run ends.
        let reason = if stopped == "shutdown" {
            "the server was shut down"
        } else {
            "the run ended"
        };
        for k in 0..self.sessions.len() {
            if let Some(c) = self.detach(k) {
                push(
                    &c.tx,
                    &ServerMsg::Shutdown {
                        reason: reason.into(),
                    },
                );
            }
        }
        let elapsed_s = self.elapsed();
        let devices = (0..self.sessions.len())
            .map(|k| {
                let s = &self.sessions[k];
                DeviceSummary::from_verifier(&self.verifier, k, elapsed_s, s.rounds, s.dropped, s.done)
            })
            .collect::<Result<Vec<_>>>()?;
        let tokens: u64 = devices.iter().map(|d| d.tokens as u64).sum();
        Ok(Summary {
            verify_model: Some(self.verify_model()),
            scheme: self.cfg.scheme.name(),
            clock: self.cfg.clock,
            rounds: round,
            tokens,
            elapsed_s,
            goodput: if elapsed_s > 0.0 {
                tokens as f64 / elapsed_s
            } else {
                0.0
            },
            predicted_goodput: if self.predicted.is_empty() {
                0.0
            } else {
                self.predicted.iter().sum::<f64>() / self.predicted.len() as f64
            },
            draft_up_s: self.sums[0],
            draft_s: self.sums[1],
            verify_s: self.sums[2],
            correction_s: self.sums[3],
            devices,
            stopped,
        })
    }

    fn elapsed(&self) -> f64 {
        match self.cfg.clock {
            Clock::Virtual => self.clock_s,
            Clock::Real => self.wall_start.elapsed().as_secs_f64(),
        }
    }

    /// The verification-time model the planner uses: the profile, or the fit of what was measured.
    /// T_ver(K, L) the controller plans with: the profile's, or the fit over the timed passes (a guess of 10 ms
    /// plus 1 ms per device before the first).
    fn verify_model(&self) -> VerifyModel {
        self.cfg.compute.planning_verify(&self.verify_fit)
    }

    fn payload_bits_per_dist(&self) -> f64 {
        proto::packed_bits(self.vocab, self.cfg.q_bits, self.v_eff) as f64
    }

    /// Bits of one (token, probability) pair on the uplink: ⌈log₂V⌉ + 32.
    fn pair_bits(&self) -> f64 {
        f64::from(pair_bits(self.vocab as usize, 32))
    }
}

/// Times the target's verification passes before the first round, so that the T_ver(K, L) fit can tell the
/// devices of a pass from the tokens they drafted from the start: 1 and 4 sequences after a prefix as deep as a
/// sequence is halfway through its `max_new_tokens` (32 + max_new_tokens/2 tokens, less where the model's context
/// is shorter: attention's share of a pass grows with the depth), drafting 0 and L_max tokens each, 3 timed passes
/// of each after one untimed (`spin_runtime::measure::verify_latency_samples`). A model too short for a draft of
/// L_max is timed without drafts only.
pub(crate) fn calibrate_verify(
    model: &Model,
    max_draft_len: u32,
    max_new_tokens: usize,
) -> Result<Vec<VerifyPoint>> {
    const KS: [usize; 2] = [1, 4];
    let depth = 32 + max_new_tokens / 2;
    let max_seq = model.config().max_seq_len;
    let mut points = Vec::new();
    for draft_len in [0, max_draft_len as usize] {
        if draft_len + 2 > max_seq || (draft_len == 0 && !points.is_empty()) {
            continue;
        }
        let prefix = depth.min(max_seq - draft_len - 1);
        let samples =
            spin_runtime::measure::verify_latency_samples(model, &KS, prefix, draft_len, 3, &mut || {})?;
        for (&k, times) in KS.iter().zip(&samples) {
            points.extend(times.iter().map(|&t| (k, (k * draft_len) as u64, t)));
        }
    }
    Ok(points)
}

/// The operator's line after the calibration: the fit it gives.
fn calibration_notice(m: &VerifyModel, passes: usize) -> String {
    format!(
        "verification timed over {passes} passes: T_ver = {:.3} ms + {:.3} ms per device + {:.3} ms per drafted \
         token (refitted every round)",
        m.fixed_s * 1e3,
        m.per_device_s * 1e3,
        m.per_draft_token_s * 1e3
    )
}

/// The refusal a peer gets for `e` (used by tests and the device side).
pub fn refusal(e: &NetError) -> (ErrorCode, String) {
    (e.code(), e.to_string())
}
