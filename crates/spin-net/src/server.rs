//! The edge server: accepts devices over TCP, runs the rounds (plan → draft → verdict → correction) with the
//! target model's [`Verifier`], emulates the wireless link on every message and accounts the round on the chosen
//! clock. docs/system.md describes the round; docs/protocol.md the messages.
//!
//! One task (the engine) owns the verifier, the controller state and the trace; one task per connection decodes
//! frames and forwards them as events, so a malformed or hostile peer is refused and closed by its own task while
//! the engine and every other device go on.

use crate::controller::{
    ControllerConfig, DeviceView, RoundPlan, Scheme, alpha_with_prior, fit_verify, plan_round,
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

/// Which clock a round is accounted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    /// Simulated time: drafting, air and verification times are added up; nothing waits. Deterministic with a
    /// compute profile.
    Virtual,
    /// Wall time: messages are held for their air time; compute is what this machine takes.
    Real,
}

/// Where compute times come from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Compute {
    /// Measured on this machine (devices report their drafting time; the server times its forward pass).
    Measured,
    /// A compute profile: per-token drafting time T̄·U[1, 1 + spread] per device (seeded), T_ver = T_fix + K·T_lin.
    Profile {
        /// T̄ in seconds per token.
        draft_token_s: f64,
        /// Spread of the per-device factor.
        draft_spread: f64,
        /// T_fix in seconds.
        verify_fixed_s: f64,
        /// T_lin in seconds per device.
        verify_per_device_s: f64,
    },
}

/// Settings of a server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The planning scheme (its paper fixes the exchange).
    pub scheme: Scheme,
    /// Paper B's reactive mode policy.
    pub modes: ModeScheme,
    /// L_max / γ_max.
    pub max_draft_len: u32,
    /// Fixed BW&L's length.
    pub fixed_len: u32,
    /// V_eff of every distribution on the air (capped at V).
    pub v_eff: u32,
    /// Q of every distribution on the air.
    pub q_bits: u8,
    /// Sampling temperature (0 = greedy).
    pub temperature: f64,
    /// Tokens each device generates.
    pub max_new_tokens: usize,
    /// End of sequence.
    pub eos: Option<u32>,
    /// Seed of every draw (sampling, drop, fading, planners).
    pub seed: u64,
    /// The clock.
    pub clock: Clock,
    /// Compute times.
    pub compute: Compute,
    /// The radio.
    pub link: LinkConfig,
    /// A draft that arrives later than this after the plan (on the run's clock) is dropped for the round.
    pub round_deadline_s: f64,
    /// Wall-clock limit on waiting for a device's answer in a round (its draft, its correction), on either clock:
    /// a device silent past it is dropped for the round (`silent` in the trace) and the others go on.
    pub wall_deadline: Duration,
    /// A connection that has not sent a complete `Hello` within this is closed (slow or idle peers).
    pub handshake_timeout: Duration,
    /// Open connections at most (handshakes included); one more is answered `Full` and closed.
    pub max_connections: usize,
    /// Open connections at most from one IP address.
    pub max_connections_per_addr: usize,
    /// Sessions at most that have not drafted yet (connected or waiting to resume); a new one beyond is `Full`.
    pub max_pending: usize,
    /// Of those, at most this many opened from one IP address.
    pub max_pending_per_addr: usize,
    /// While fewer than `min_devices` joined, a notice says whom the server waits for this often.
    pub notice_every: Duration,
    /// TLS on every connection (None: plaintext, for loopback and simulations).
    pub tls: Option<ServerTls>,
    /// The pre-shared admission tokens a `Hello` must carry one of (empty: any device is admitted).
    pub device_tokens: Vec<Vec<u8>>,
    /// Rounds start once this many devices joined.
    pub min_devices: usize,
    /// Devices admitted at most.
    pub max_devices: usize,
    /// Stop after this many rounds.
    pub max_rounds: Option<u64>,
    /// Stop once every device has finished (else wait for new devices until shut down).
    pub stop_when_done: bool,
    /// How long a disconnected session waits for its device to resume; at its end the session is released (its
    /// memory freed, a resume refused) and a run whose other devices finished ends.
    pub resume_window: Duration,
    /// The target model's identity.
    pub identity: Identity,
    /// Largest frame body.
    pub max_frame_bytes: usize,
    /// Prior α₀ of the acceptance estimate.
    pub alpha_prior: f64,
    /// Weight n₀ of the prior in tokens.
    pub alpha_prior_weight: f64,
    /// SAA samples for paper B's planners.
    pub saa_samples: u32,
}

impl ServerConfig {
    /// Defaults for `scheme` (paper B's link, V_eff = 1024, Q = 16, γ_max = 8, a compute profile on the virtual
    /// clock) and the target's `identity`.
    pub fn new(scheme: Scheme, identity: Identity) -> Self {
        ServerConfig {
            scheme,
            modes: ModeScheme::Optimal,
            max_draft_len: 8,
            fixed_len: 4,
            v_eff: 1024,
            q_bits: 16,
            temperature: 0.0,
            max_new_tokens: 32,
            eos: None,
            seed: 0,
            clock: Clock::Virtual,
            compute: Compute::Profile {
                draft_token_s: 0.015,
                draft_spread: 0.15,
                verify_fixed_s: 0.04,
                verify_per_device_s: 0.008,
            },
            link: LinkConfig::paper_b(),
            round_deadline_s: 10.0,
            wall_deadline: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(5),
            max_connections: 2048,
            max_connections_per_addr: 64,
            max_pending: 256,
            max_pending_per_addr: 32,
            notice_every: Duration::from_secs(5),
            tls: None,
            device_tokens: Vec::new(),
            min_devices: 1,
            max_devices: 1024,
            max_rounds: None,
            stop_when_done: true,
            resume_window: Duration::from_secs(10),
            identity,
            max_frame_bytes: proto::MAX_FRAME_BYTES,
            alpha_prior: 0.7,
            alpha_prior_weight: 8.0,
            saa_samples: 200,
        }
    }

    fn exchange(&self) -> Exchange {
        match self.scheme.family() {
            Family::PaperA => Exchange::DistsWithDraft,
            Family::PaperB => Exchange::ProbsOnly,
            Family::Unified => Exchange::Planned,
        }
    }

    /// Checks the settings; every error names its field.
    pub fn validate(&self) -> Result<()> {
        self.link.validate()?;
        if !(1..=24).contains(&self.q_bits) {
            return Err(NetError::invalid(
                "q_bits",
                format!("{} is outside [1, 24]", self.q_bits),
            ));
        }
        if self.v_eff == 0 {
            return Err(NetError::invalid("v_eff", "must be at least 1"));
        }
        if self.max_draft_len == 0 || self.max_draft_len > 64 {
            return Err(NetError::invalid(
                "max_draft_len",
                format!("{} is outside [1, 64]", self.max_draft_len),
            ));
        }
        if self.round_deadline_s.is_nan() || self.round_deadline_s <= 0.0 {
            return Err(NetError::invalid(
                "round_deadline_s",
                format!("{} is not a number > 0", self.round_deadline_s),
            ));
        }
        for (field, d) in [
            ("wall_deadline", self.wall_deadline),
            ("handshake_timeout", self.handshake_timeout),
            ("notice_every", self.notice_every),
        ] {
            if d.is_zero() {
                return Err(NetError::invalid(field, "must be longer than 0 s"));
            }
        }
        for (field, n) in [
            ("max_connections", self.max_connections),
            ("max_connections_per_addr", self.max_connections_per_addr),
            ("max_pending", self.max_pending),
            ("max_pending_per_addr", self.max_pending_per_addr),
        ] {
            if n == 0 {
                return Err(NetError::invalid(field, "must be at least 1"));
            }
        }
        if !(self.alpha_prior > 0.0 && self.alpha_prior < 1.0) {
            return Err(NetError::invalid(
                "alpha_prior",
                format!("{} is outside (0, 1)", self.alpha_prior),
            ));
        }
        if !(self.alpha_prior_weight >= 0.0 && self.alpha_prior_weight.is_finite()) {
            return Err(NetError::invalid(
                "alpha_prior_weight",
                format!("{} is not a finite number ≥ 0", self.alpha_prior_weight),
            ));
        }
        if self.min_devices == 0 || self.min_devices > self.max_devices {
            return Err(NetError::invalid(
                "min_devices",
                format!(
                    "{} is outside [1, max_devices = {}]",
                    self.min_devices, self.max_devices
                ),
            ));
        }
        if let Compute::Profile {
            draft_token_s,
            draft_spread,
            verify_fixed_s,
            verify_per_device_s,
        } = self.compute
        {
            for (f, v, pos) in [
                ("draft_token_s", draft_token_s, true),
                ("draft_spread", draft_spread, false),
                ("verify_fixed_s", verify_fixed_s, false),
                ("verify_per_device_s", verify_per_device_s, false),
            ] {
                if !(v.is_finite() && (v > 0.0 || (!pos && v == 0.0))) {
                    return Err(NetError::invalid(
                        f,
                        format!("{v} is not a finite number {}", if pos { "> 0" } else { "≥ 0" }),
                    ));
                }
            }
            if verify_fixed_s + verify_per_device_s <= 0.0 {
                return Err(NetError::invalid(
                    "verify_fixed_s",
                    "T_fix + T_lin must be positive",
                ));
            }
            if self.clock == Clock::Real {
                return Err(NetError::invalid(
                    "compute",
                    "a compute profile needs the virtual clock (the real clock measures compute)",
                ));
            }
        }
        sampling(self.temperature).map_err(|e| NetError::invalid("temperature", e.to_string()))?;
        Ok(())
    }
}

/// One device in one round of the trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceTrace {
    /// Device index.
    pub device: usize,
    /// γ_k planned.
    pub gamma: u32,
    /// b_k in Hz.
    pub bandwidth_hz: f64,
    /// What each drafted token carried up: `dists` (its distribution, paper A) or `pairs` (token and probability,
    /// paper B); the unified planner picks per device and round.
    pub payload: &'static str,
    /// Drafted tokens accepted.
    pub accepted: u32,
    /// Tokens committed this round.
    pub emitted: u32,
    /// `server` (corrected or bonus at the server), `ul`, `dl`, `dropped` (late), `silent` (no answer within the wall
    /// deadline on the virtual clock), `lost` (disconnected).
    pub mode: &'static str,
    /// Payload bits put on the uplink air.
    pub bits_up: u64,
    /// Payload bits put on the downlink air.
    pub bits_down: u64,
    /// Uplink air time of the draft in seconds.
    pub air_up_s: f64,
    /// Air time of the correction exchange in seconds (UL or DL).
    pub air_corr_s: f64,
    /// Drafting time in seconds.
    pub draft_s: f64,
    /// Frame bytes received from the device.
    pub wire_up_bytes: u64,
    /// Frame bytes sent to the device.
    pub wire_down_bytes: u64,
}

/// One round of the trace (one JSON line).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoundTrace {
    /// The planning scheme.
    pub scheme: &'static str,
    /// Round number (from 0).
    pub round: u64,
    /// The clock at the end of the round in seconds.
    pub clock_s: f64,
    /// The round's latency.
    pub latency_s: f64,
    /// Drafting and draft upload (the slowest kept device's draft + air).
    pub draft_up_s: f64,
    /// Of which the slowest kept device's drafting alone.
    pub draft_s: f64,
    /// Verification.
    pub verify_s: f64,
    /// Correction exchange (paper B).
    pub correction_s: f64,
    /// Tokens committed this round over all devices.
    pub tokens: u64,
    /// The planner's predicted goodput in tokens/s.
    pub predicted_goodput: f64,
    /// Per device.
    pub devices: Vec<DeviceTrace>,
}

/// Per-device totals of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceSummary {
    /// Device index.
    pub device: usize,
    /// Generated tokens.
    pub tokens: usize,
    /// Tokens per second of the run's clock.
    pub goodput: f64,
    /// The server's ratio estimate of α (None below two drafted tokens).
    pub acceptance: Option<f64>,
    /// Rounds in which the device took part.
    pub rounds: u64,
    /// Rounds its draft was dropped as late.
    pub dropped: u64,
    /// Whether it finished.
    pub done: bool,
    /// The generated token ids.
    pub generated: Vec<u32>,
}

/// Totals of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Scheme name.
    pub scheme: &'static str,
    /// The clock.
    pub clock: Clock,
    /// Rounds run.
    pub rounds: u64,
    /// Tokens generated over all devices.
    pub tokens: u64,
    /// The run's duration on its clock in seconds.
    pub elapsed_s: f64,
    /// tokens / elapsed_s.
    pub goodput: f64,
    /// Mean of the planner's predicted goodput over rounds.
    pub predicted_goodput: f64,
    /// Σ drafting + upload phase seconds.
    pub draft_up_s: f64,
    /// Σ of which drafting.
    pub draft_s: f64,
    /// Σ verification seconds.
    pub verify_s: f64,
    /// Σ correction seconds.
    pub correction_s: f64,
    /// Per device.
    pub devices: Vec<DeviceSummary>,
    /// How the run ended.
    pub stopped: String,
}

enum Event {
    Hello {
        conn: ConnHandle,
        hello: DeviceMsg,
        reply: oneshot::Sender<std::result::Result<u64, NetError>>,
    },
    Msg {
        session: u64,
        conn_id: u64,
        msg: DeviceMsg,
        bytes: usize,
    },
    Closed {
        session: u64,
        conn_id: u64,
    },
}

#[derive(Clone)]
struct ConnHandle {
    id: u64,
    /// The peer's address (admission limits are per IP address).
    addr: IpAddr,
    tx: mpsc::UnboundedSender<Outgoing>,
}

/// A message encoded once, by whoever sends it (the engine counts its bytes from the same body the writer sends).
struct Outgoing {
    body: Bytes,
    /// `Error` and `Shutdown`: the connection closes after it.
    last: bool,
}

impl Outgoing {
    fn new(msg: &ServerMsg) -> Option<Outgoing> {
        let body = proto::encode(msg).ok()?;
        Some(Outgoing {
            body: Bytes::from(body),
            last: matches!(msg, ServerMsg::Error { .. } | ServerMsg::Shutdown { .. }),
        })
    }
}

/// Queues `msg` on `tx`; returns its body's size in bytes (0 if it could not be encoded).
fn push(tx: &mpsc::UnboundedSender<Outgoing>, msg: &ServerMsg) -> u64 {
    match Outgoing::new(msg) {
        Some(o) => {
            let n = o.body.len() as u64;
            let _ = tx.send(o);
            n
        }
        None => 0,
    }
}

struct Session {
    id: u64,
    /// The resume secret handed out in `Welcome` (compared in constant time).
    secret: [u8; SECRET_BYTES],
    /// The address the session was opened from (its pending-session quota).
    addr: IpAddr,
    conn: Option<ConnHandle>,
    /// When its connection went (the resume window runs from here).
    left_at: Option<Instant>,
    /// Whether one of its drafts was accepted (before that it counts against the pending-session limits).
    drafted: bool,
    /// Ended without finishing: `Bye`, or the resume window passed. Its memory is released; it cannot resume.
    ended: bool,
    mean_gain: f64,
    draft_token_s: f64,
    measured_draft: Option<f64>,
    done: bool,
    rounds: u64,
    dropped: u64,
}

/// A fresh session id and resume secret from the operating system's CSPRNG (never from the run's seed: ids must
/// not be predictable, and a run's reproducibility must not depend on them).
fn fresh_credentials() -> Result<(u64, [u8; SECRET_BYTES])> {
    let os = |e: getrandom::Error| NetError::Io(std::io::Error::other(format!("the OS random source: {e}")));
    let mut secret = [0u8; SECRET_BYTES];
    getrandom::fill(&mut secret).map_err(os)?;
    Ok((getrandom::u64().map_err(os)?, secret))
}

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
        let listener = TcpListener::bind(addr).await?;
        Ok(Server {
            listener,
            model,
            cfg,
            notice: None,
        })
    }

    /// Sends the server's operator notices (whom it waits for before the first round, every
    /// `ServerConfig::notice_every`) to `f` instead of the `tracing` log.
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
        let acceptor = tokio::spawn(accept_loop(listener, ev_tx, limits, stop_rx));
        let params = sampling(self.cfg.temperature)?;
        let verifier = Verifier::new(
            self.model.clone(),
            VerifierConfig {
                params,
                max_new_tokens: self.cfg.max_new_tokens,
                eos: self.cfg.eos,
                seed: self.cfg.seed,
            },
        );
        let vocab = self.model.config().vocab_size as u32;
        let v_eff = self.cfg.v_eff.min(vocab);
        let mut engine = Engine {
            verifier,
            sessions: Vec::new(),
            by_id: BTreeMap::new(),
            events: ev_rx,
            shutdown,
            stopping: false,
            clock_s: 0.0,
            wall_start: Instant::now(),
            verify_points: Vec::new(),
            vocab,
            v_eff,
            max_seq_len: self.model.config().max_seq_len,
            cfg: self.cfg,
            traces_tokens: 0,
            sums: [0.0; 4],
            predicted: Vec::new(),
            notice: self.notice,
            expired: 0,
        };
        let result = engine.run(on_round).await;
        // Closing the engine's side ends every connection's writer once its queue is flushed.
        drop(engine);
        let _ = stop_tx.send(());
        let _ = acceptor.await;
        result
    }
}

/// The listener's settings for each connection.
#[derive(Debug, Clone)]
struct ConnLimits {
    max_frame: usize,
    handshake_timeout: Duration,
    max_connections: usize,
    max_per_addr: usize,
    tls: Option<ServerTls>,
}

/// Open connections, in all and per address (shared by the acceptor and the connection tasks).
#[derive(Default)]
struct OpenConns {
    total: usize,
    per_addr: HashMap<IpAddr, usize>,
}

/// One admitted connection: counted while it lives, uncounted when dropped.
struct ConnSlot {
    open: Arc<Mutex<OpenConns>>,
    addr: IpAddr,
}

impl ConnSlot {
    /// A slot for a connection from `addr`, or None (with the limit that was hit) when one is full.
    fn take(
        open: &Arc<Mutex<OpenConns>>,
        addr: IpAddr,
        l: &ConnLimits,
    ) -> std::result::Result<ConnSlot, String> {
        let mut o = open.lock().unwrap_or_else(|p| p.into_inner());
        if o.total >= l.max_connections {
            return Err(format!("{} open connections (the server's limit)", o.total));
        }
        let n = o.per_addr.get(&addr).copied().unwrap_or(0);
        if n >= l.max_per_addr {
            return Err(format!(
                "{n} open connections from {addr} (the per-address limit)"
            ));
        }
        o.total += 1;
        *o.per_addr.entry(addr).or_insert(0) += 1;
        Ok(ConnSlot {
            open: open.clone(),
            addr,
        })
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut o = self.open.lock().unwrap_or_else(|p| p.into_inner());
        o.total = o.total.saturating_sub(1);
        if let Some(n) = o.per_addr.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                o.per_addr.remove(&self.addr);
            }
        }
    }
}

/// The wait after the `n`-th accept error in a row: 5 ms doubling to 1 s (a full descriptor table frees up when a
/// connection closes; retrying at once would spin).
pub fn accept_backoff(n: u32) -> Duration {
    Duration::from_millis(5u64 << n.min(8)).min(Duration::from_secs(1))
}

/// Whether an accept error is the system running short (descriptors, memory, buffers) or one connection failing
/// before it was accepted; either way the listener goes on after a back-off. Only the kind is logged differently.
fn accept_error_kind(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(23 | 24) => "file descriptors exhausted (ENFILE/EMFILE)",
        Some(12 | 105) => "memory or buffers exhausted (ENOMEM/ENOBUFS)",
        Some(103) => "connection aborted before accept (ECONNABORTED)",
        _ => "accept failed",
    }
}

/// Accepts connections until `stop`; an accept error never ends it (logged, then retried after a back-off).
async fn accept_loop(
    listener: TcpListener,
    ev_tx: mpsc::UnboundedSender<Event>,
    limits: ConnLimits,
    mut stop: oneshot::Receiver<()>,
) {
    let mut next_id = 0u64;
    let mut conns = tokio::task::JoinSet::new();
    let open = Arc::new(Mutex::new(OpenConns::default()));
    let mut errors = 0u32;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    errors = 0;
                    match ConnSlot::take(&open, peer.ip(), &limits) {
                        Ok(slot) => {
                            next_id += 1;
                            conns.spawn(connection(stream, peer.ip(), next_id, ev_tx.clone(), limits.clone(), slot));
                        }
                        Err(why) => {
                            // One non-blocking write of the refusal, then close: a flood costs no task. Over TLS
                            // the connection is closed unanswered (an answer would need a handshake).
                            let e = NetError::Full(why);
                            if limits.tls.is_none()
                                && let Ok(body) = proto::encode(&ServerMsg::Error { code: e.code(), message: e.to_string() })
                            {
                                let _ = stream.try_write(&frame_bytes(&body));
                            }
                        }
                    }
                    // Reap finished connections so the set does not grow with every peer ever seen.
                    while conns.try_join_next().is_some() {}
                }
                Err(e) => {
                    let wait = accept_backoff(errors);
                    tracing::warn!("listener: {} ({e}); retrying in {} ms", accept_error_kind(&e), wait.as_millis());
                    errors = errors.saturating_add(1);
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = &mut stop => break,
                    }
                }
            },
            _ = &mut stop => break,
        }
    }
    // Let every connection write what the engine queued (final verdicts, `Shutdown`) before the process may
    // exit; a peer that does not close within the grace period is cut.
    drop(ev_tx);
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
}

/// One connection: decode frames into events; refuse and close on anything malformed, on a handshake that does not
/// complete within the timeout, and after `Bye`.
async fn connection(
    stream: tokio::net::TcpStream,
    addr: IpAddr,
    conn_id: u64,
    events: mpsc::UnboundedSender<Event>,
    limits: ConnLimits,
    slot: ConnSlot,
) {
    let max_frame = limits.max_frame;
    let handshake_by = Instant::now() + limits.handshake_timeout;
    let _ = stream.set_nodelay(true);
    let stream: Box<dyn Stream> = match &limits.tls {
        None => Box::new(stream),
        // The TLS handshake counts against the handshake timeout too.
        Some(tls) => match tokio::time::timeout_at(handshake_by.into(), tls.accept(stream)).await {
            Ok(Ok(s)) => Box::new(s),
            Ok(Err(e)) => {
                tracing::debug!("tls: handshake with {addr} failed: {e}");
                return;
            }
            Err(_) => return,
        },
    };
    let (mut sink, mut frames) = framed_stream(stream, max_frame).split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Outgoing>();
    let writer = tokio::spawn(async move {
        while let Some(o) = rx.recv().await {
            if sink.send(o.body).await.is_err() || o.last {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let refuse = |tx: &mpsc::UnboundedSender<Outgoing>, e: &NetError| {
        push(
            tx,
            &ServerMsg::Error {
                code: e.code(),
                message: e.to_string(),
            },
        );
    };
    let mut session: Option<u64> = None;
    loop {
        let next = match session {
            // The whole first frame must arrive in time: a peer trickling bytes is cut like an idle one.
            None => match tokio::time::timeout_at(handshake_by.into(), frames.next()).await {
                Ok(n) => n,
                Err(_) => {
                    refuse(
                        &tx,
                        &NetError::Protocol(format!(
                            "handshake: no Hello within {} s",
                            limits.handshake_timeout.as_secs_f64()
                        )),
                    );
                    break;
                }
            },
            Some(_) => frames.next().await,
        };
        let body = match next {
            None => break,
            Some(Err(e)) => {
                refuse(&tx, &frame_error(e, max_frame));
                break;
            }
            Some(Ok(b)) => b,
        };
        let msg = match proto::decode::<DeviceMsg>(&body) {
            Ok(m) => m,
            Err(e) => {
                refuse(&tx, &e);
                break;
            }
        };
        match (session, msg) {
            (None, hello @ DeviceMsg::Hello { .. }) => {
                let (rtx, rrx) = oneshot::channel();
                let conn = ConnHandle {
                    id: conn_id,
                    addr,
                    tx: tx.clone(),
                };
                if events
                    .send(Event::Hello {
                        conn,
                        hello,
                        reply: rtx,
                    })
                    .is_err()
                {
                    break;
                }
                match rrx.await {
                    Ok(Ok(s)) => session = Some(s),
                    Ok(Err(e)) => {
                        refuse(&tx, &e);
                        break;
                    }
                    Err(_) => break,
                }
            }
            (None, _) => {
                refuse(&tx, &NetError::Protocol("the first message must be Hello".into()));
                break;
            }
            (Some(_), DeviceMsg::Hello { .. }) => {
                refuse(&tx, &NetError::Protocol("Hello sent twice".into()));
                break;
            }
            (Some(s), msg) => {
                let bye = matches!(msg, DeviceMsg::Bye);
                let bytes = body.len();
                if events
                    .send(Event::Msg {
                        session: s,
                        conn_id,
                        msg,
                        bytes,
                    })
                    .is_err()
                    || bye
                {
                    // After `Bye` nothing more is read: the session is over and the connection closes.
                    break;
                }
            }
        }
    }
    if let Some(s) = session {
        let _ = events.send(Event::Closed { session: s, conn_id });
    }
    drop(tx);
    let _ = writer.await;
    drop(slot);
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
    verify_points: Vec<(usize, f64)>,
    vocab: u32,
    v_eff: u32,
    max_seq_len: usize,
    traces_tokens: u64,
    /// Σ draft+up, Σ draft, Σ verify, Σ correction.
    sums: [f64; 4],
    predicted: Vec<f64>,
    notice: Option<Notice>,
    /// Sessions released at the end of their resume window without finishing.
    expired: usize,
}

/// A received draft.
struct Got {
    /// Whether the plan asked for the distributions (they are then in `dists`).
    with_dists: bool,
    tokens: Vec<u32>,
    probs: Vec<f32>,
    dists: Vec<SparseDist>,
    draft_s: f64,
    bytes: usize,
    arrived: Instant,
}

impl Engine {
    /// Waits for the next event until `until` (wall); None on timeout or shutdown.
    async fn next_event(&mut self, until: Option<Instant>) -> Option<Event> {
        if self.stopping {
            return None;
        }
        let sleep = async {
            match until {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        // A closed event channel (the listener gone) disables its branch instead of answering None at once: the
        // engine then waits for its deadline or the shutdown, it never spins.
        tokio::select! {
            Some(ev) = self.events.recv() => Some(ev),
            _ = self.shutdown.wait_for(|s| *s) => { self.stopping = true; None }
            _ = sleep => None,
        }
    }

    /// Detaches device `k`'s connection (gone, refused or silent); its resume window starts now.
    fn detach(&mut self, k: usize) -> Option<ConnHandle> {
        let c = self.sessions[k].conn.take();
        if c.is_some() {
            self.sessions[k].left_at = Some(Instant::now());
        }
        c
    }

    /// Ends device `k`'s session before it finished (`Bye`, or its resume window passed): its cache is released and
    /// its id forgotten, so it can never be resumed; the run no longer waits for it.
    fn end_session(&mut self, k: usize) -> Result<()> {
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
    fn expire(&mut self) -> Result<Option<Instant>> {
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
    fn live(&self) -> usize {
        self.sessions.iter().filter(|s| !s.ended).count()
    }

    /// Sessions that have not drafted yet, in all and from `addr`.
    fn pending(&self, addr: IpAddr) -> (usize, usize) {
        self.sessions
            .iter()
            .filter(|s| !s.ended && !s.done && !s.drafted)
            .fold((0, 0), |(all, here), s| {
                (all + 1, here + usize::from(s.addr == addr))
            })
    }

    /// An operator notice: to the callback when one was given, else to the log.
    fn notify(&mut self, text: &str) {
        match self.notice.as_mut() {
            Some(f) => f(text),
            None => tracing::info!("{text}"),
        }
    }

    /// Whom the server waits for before its first round.
    fn waiting_notice(&self) -> String {
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
            push(
                &c.tx,
                &ServerMsg::Error {
                    code: e.code(),
                    message: e.to_string(),
                },
            );
        }
    }

    fn session_params(&self) -> SessionParams {
        SessionParams {
            temperature: self.cfg.temperature,
            exchange: self.cfg.exchange(),
            v_eff: self.v_eff,
            q_bits: self.cfg.q_bits,
            seed: self.cfg.seed,
            max_new_tokens: self.cfg.max_new_tokens as u32,
        }
    }

    fn welcome(&self, k: usize) -> Result<ServerMsg> {
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

    fn on_hello(&mut self, conn: ConnHandle, hello: DeviceMsg) -> Result<u64> {
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
        if identity.vocab != self.vocab {
            return Err(NetError::Mismatch {
                field: "vocab",
                reason: format!(
                    "the drafter has {} tokens, the target {}",
                    identity.vocab, self.vocab
                ),
            });
        }
        if identity.tokenizer != 0
            && self.cfg.identity.tokenizer != 0
            && identity.tokenizer != self.cfg.identity.tokenizer
        {
            return Err(NetError::Mismatch {
                field: "tokenizer",
                reason: format!(
                    "the drafter's tokenizer {:016x} differs from the target's {:016x}",
                    identity.tokenizer, self.cfg.identity.tokenizer
                ),
            });
        }
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
                // Never superseded: the owner keeps its connection; a device whose old connection is half-open
                // retries once the server has seen it close (or the wall deadline detached it).
                return Err(NetError::Busy(r.session));
            }
            // A resumed device waits for the next round; anything pending from the round it left is dropped.
            if self.verifier.is_pending(k)? {
                self.verifier.abandon(k)?;
            }
            self.sessions[k].conn = Some(conn);
            self.sessions[k].left_at = None;
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
                    format!("{d} is not a finite number > 0"),
                ));
            }
            let k = tokio::task::block_in_place(|| self.verifier.add_devices(&[prompt]))?;
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
                ended: false,
                mean_gain,
                draft_token_s,
                measured_draft: None,
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
    fn triage(&mut self, ev: Event) -> Option<(usize, DeviceMsg, usize)> {
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
                let generated = self.verifier.generated(k)?.to_vec();
                let acceptance = self
                    .verifier
                    .alpha(k)?
                    .ratio_estimate(spin_core::estimate::Z_95)?
                    .map(|e| e.value);
                Ok(DeviceSummary {
                    device: k,
                    tokens: generated.len(),
                    goodput: if elapsed_s > 0.0 {
                        generated.len() as f64 / elapsed_s
                    } else {
                        0.0
                    },
                    acceptance,
                    rounds: self.sessions[k].rounds,
                    dropped: self.sessions[k].dropped,
                    done: self.sessions[k].done,
                    generated,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let tokens: u64 = devices.iter().map(|d| d.tokens as u64).sum();
        Ok(Summary {
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
    fn verify_model(&self) -> (f64, f64) {
        match self.cfg.compute {
            Compute::Profile {
                verify_fixed_s,
                verify_per_device_s,
                ..
            } => (verify_fixed_s, verify_per_device_s),
            Compute::Measured => fit_verify(&self.verify_points).unwrap_or((0.01, 0.001)),
        }
    }

    fn payload_bits_per_dist(&self) -> f64 {
        proto::packed_bits(self.vocab, self.cfg.q_bits, self.v_eff) as f64
    }

    /// Bits of one (token, probability) pair on the uplink: ⌈log₂V⌉ + 32.
    fn pair_bits(&self) -> f64 {
        f64::from(pair_bits(self.vocab as usize, 32))
    }

    async fn round(&mut self, round: u64, active: &[usize]) -> Result<RoundTrace> {
        let link = self.cfg.link;
        let means: Vec<f64> = self.sessions.iter().map(|s| s.mean_gain).collect();
        let gains = link.round_gains(self.cfg.seed, round, &means)?;
        // Plan from the online estimates.
        let views: Vec<DeviceView> = active
            .iter()
            .map(|&k| {
                let s = &self.sessions[k];
                let est = self
                    .verifier
                    .alpha(k)?
                    .ratio_estimate(spin_core::estimate::Z_95)?;
                let (mean, n) = est.map_or((0.0, 0), |e| (e.value, e.samples));
                let draft_token_s = match self.cfg.compute {
                    Compute::Profile { .. } => s.draft_token_s,
                    Compute::Measured => s.measured_draft.unwrap_or(0.005),
                };
                Ok(DeviceView {
                    alpha: alpha_with_prior(mean, n, self.cfg.alpha_prior, self.cfg.alpha_prior_weight),
                    draft_token_s,
                    gain: gains[k],
                    max_len: self.verifier.max_draft_len(k)? as u32,
                })
            })
            .collect::<Result<_>>()?;
        let (t_fix, t_lin) = self.verify_model();
        let ctl = ControllerConfig {
            scheme: self.cfg.scheme,
            modes: self.cfg.modes,
            max_draft_len: self.cfg.max_draft_len,
            fixed_len: self.cfg.fixed_len,
            payload_bits: self.payload_bits_per_dist(),
            pair_bits: self.pair_bits(),
            saa_samples: self.cfg.saa_samples,
        };
        let plan: RoundPlan = plan_round(
            &ctl,
            &link,
            &views,
            t_fix,
            t_lin,
            self.cfg.seed.wrapping_add(round),
        )?;
        self.predicted.push(plan.predicted_goodput);
        let mut traces: BTreeMap<usize, DeviceTrace> = BTreeMap::new();
        let wall0 = Instant::now();
        for (i, &k) in active.iter().enumerate() {
            let msg = ServerMsg::Plan {
                round,
                draft_len: plan.draft_len[i],
                bandwidth_hz: plan.bandwidth_hz[i],
                send_dists: plan.send_dists[i],
            };
            let down = self.send(k, msg);
            traces.insert(
                k,
                DeviceTrace {
                    device: k,
                    gamma: plan.draft_len[i],
                    bandwidth_hz: plan.bandwidth_hz[i],
                    payload: if plan.send_dists[i] { "dists" } else { "pairs" },
                    accepted: 0,
                    emitted: 0,
                    mode: "lost",
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
        // The connection each device was planned on: a device that left or resumed since is out of this round.
        let plan_conn: BTreeMap<usize, Option<u64>> = active.iter().map(|&k| (k, self.conn_id(k))).collect();
        // Collect the drafts.
        let wall_deadline = match self.cfg.clock {
            Clock::Real => {
                wall0 + Duration::from_secs_f64(self.cfg.round_deadline_s).min(self.cfg.wall_deadline)
            }
            Clock::Virtual => wall0 + self.cfg.wall_deadline,
        };
        let mut got: BTreeMap<usize, Got> = BTreeMap::new();
        let mut waiting: Vec<usize> = active.to_vec();
        while !waiting.is_empty() {
            waiting.retain(|&k| self.sessions[k].conn.is_some() && self.conn_id(k) == plan_conn[&k]);
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
                    let gamma = traces[&k].gamma as usize;
                    let with_dists = traces[&k].payload == "dists";
                    match self.check_draft(gamma, with_dists, tokens, probs, dists, draft_s, bytes) {
                        Ok(g) => {
                            got.insert(k, g);
                            self.sessions[k].drafted = true;
                            waiting.remove(p);
                        }
                        Err(e) => {
                            self.refuse(k, &e);
                            waiting.remove(p);
                        }
                    }
                }
                // A straggler's draft of a round already closed: it was told `Dropped`; ignore it.
                (_, DeviceMsg::Draft { round: r, .. }) if r < round => {}
                (_, other) => {
                    let e = NetError::Protocol(format!("unexpected {} in round {round}", kind(&other)));
                    self.refuse(k, &e);
                }
            }
        }
        // Timing of the draft phase; late drafts are dropped.
        let mut kept: Vec<usize> = Vec::new();
        let mut arrive_max = 0.0f64;
        let mut draft_max = 0.0f64;
        let mut real_release = wall0;
        for (i, &k) in active.iter().enumerate() {
            let Some(g) = got.get(&k) else { continue };
            let gamma = g.tokens.len() as f64;
            let draft_s = match self.cfg.compute {
                Compute::Profile { .. } => gamma * self.sessions[k].draft_token_s,
                Compute::Measured => g.draft_s,
            };
            let bits_up: u64 = if g.with_dists {
                g.dists.iter().map(|d| d.bits_on_air()).sum()
            } else {
                // Paper B: (token, probability) pairs, ⌈log₂V⌉ + 32 bits each.
                g.tokens.len() as u64 * u64::from(pair_bits(self.vocab as usize, 32))
            };
            let r = link.spectral_efficiency(gains[k])?;
            let air = air_time_s(bits_up as f64, plan.bandwidth_hz[i], r);
            let t = traces.get_mut(&k).expect("every active device has a trace");
            t.bits_up = bits_up;
            t.air_up_s = air;
            t.draft_s = draft_s;
            t.wire_up_bytes = g.bytes as u64;
            let arrival = match self.cfg.clock {
                Clock::Virtual => draft_s + air,
                Clock::Real => (g.arrived - wall0).as_secs_f64() + air,
            };
            if arrival > self.cfg.round_deadline_s {
                t.mode = "dropped";
                self.sessions[k].dropped += 1;
                t.wire_down_bytes += self.send(k, ServerMsg::Dropped { round });
                continue;
            }
            if self.cfg.clock == Clock::Real {
                real_release = real_release.max(g.arrived + Duration::from_secs_f64(air));
            }
            if g.tokens.is_empty() {
                // γ = 0 carries no draft time.
            } else if let Compute::Measured = self.cfg.compute {
                let per = g.draft_s / gamma;
                let s = &mut self.sessions[k];
                s.measured_draft = Some(s.measured_draft.map_or(per, |m| 0.8 * m + 0.2 * per));
            }
            arrive_max = arrive_max.max(arrival);
            draft_max = draft_max.max(draft_s);
            kept.push(k);
        }
        // Devices still connected but silent past the wall deadline are dropped for this round (`silent`; on the
        // real clock the deadline is the round deadline, so they are late: `dropped`).
        for &k in active {
            if !got.contains_key(&k) && self.sessions[k].conn.is_some() && self.conn_id(k) == plan_conn[&k] {
                let t = traces.get_mut(&k).expect("trace");
                t.mode = match self.cfg.clock {
                    Clock::Virtual => "silent",
                    Clock::Real => "dropped",
                };
                self.sessions[k].dropped += 1;
                t.wire_down_bytes += self.send(k, ServerMsg::Dropped { round });
            }
        }
        if self.cfg.clock == Clock::Real {
            tokio::time::sleep_until(real_release.into()).await;
        }
        // Verify every kept draft in one batch.
        let subs_data: Vec<(usize, Got)> = kept
            .iter()
            .map(|&k| (k, got.remove(&k).expect("kept drafts were received")))
            .collect();
        let subs: Vec<Submission<'_>> = subs_data
            .iter()
            .map(|(k, g)| Submission {
                device: *k,
                tokens: &g.tokens,
                dists: if g.with_dists {
                    DraftDists::Sparse(&g.dists)
                } else {
                    DraftDists::Probs(&g.probs)
                },
            })
            .collect();
        let before: BTreeMap<usize, usize> = subs_data
            .iter()
            .map(|(k, _)| Ok((*k, self.verifier.tokens(*k)?.len())))
            .collect::<Result<_>>()?;
        let (decisions, measured_verify) = tokio::task::block_in_place(|| self.verifier.verify(&subs))?;
        let verify_s = match self.cfg.compute {
            Compute::Profile {
                verify_fixed_s,
                verify_per_device_s,
                ..
            } => {
                if subs.is_empty() {
                    0.0
                } else {
                    verify_fixed_s + subs.len() as f64 * verify_per_device_s
                }
            }
            Compute::Measured => measured_verify,
        };
        if !subs.is_empty() {
            self.verify_points.push((subs.len(), measured_verify));
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
                    let t = traces.get_mut(&k).expect("trace");
                    t.accepted = accepted as u32;
                    t.mode = "server";
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
        let mut correction_s = 0.0;
        if !rejected.is_empty() {
            correction_s = self.correct(round, &rejected, &gains, &mut traces).await?;
        }
        // Emitted tokens: what each kept device's committed text grew by.
        let mut tokens = 0u64;
        for (&k, &len0) in &before {
            let now = self.verifier.tokens(k)?.len();
            let t = traces.get_mut(&k).expect("trace");
            if t.mode != "lost" {
                t.emitted = now.saturating_sub(len0) as u32;
                tokens += u64::from(t.emitted);
            }
        }
        let latency_s = match self.cfg.clock {
            Clock::Virtual => arrive_max + verify_s + correction_s,
            Clock::Real => wall0.elapsed().as_secs_f64(),
        };
        self.clock_s += latency_s;
        self.sums[0] += arrive_max;
        self.sums[1] += draft_max;
        self.sums[2] += verify_s;
        self.sums[3] += correction_s;
        Ok(RoundTrace {
            scheme: self.cfg.scheme.name(),
            round,
            clock_s: self.elapsed(),
            latency_s,
            draft_up_s: arrive_max,
            draft_s: draft_max,
            verify_s,
            correction_s,
            tokens,
            predicted_goodput: plan.predicted_goodput,
            devices: traces.into_values().collect(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn check_draft(
        &self,
        gamma: usize,
        with_dists: bool,
        tokens: Vec<u32>,
        probs: Vec<f32>,
        dists: Vec<proto::PackedDist>,
        draft_s: f64,
        bytes: usize,
    ) -> Result<Got> {
        if tokens.len() > gamma {
            return Err(NetError::invalid(
                "draft.tokens",
                format!("{} tokens for a plan of {gamma}", tokens.len()),
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
                format!("{draft_s} is not a finite number ≥ 0"),
            ));
        }
        let dists = match with_dists {
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
            with_dists,
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
    async fn correct(
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
                t.mode = "ul";
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
                t.mode = "dl";
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
                traces.get_mut(&k).expect("trace").mode = "lost";
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
                    traces.get_mut(&k).expect("trace").mode = "lost";
                    self.refuse(k, &e);
                }
            }
        }
        for &k in waiting.keys() {
            self.verifier.abandon(k)?;
            traces.get_mut(&k).expect("trace").mode = "lost";
        }
        let t_comm = rejected
            .iter()
            .map(|(k, _)| traces[k].air_corr_s)
            .fold(0.0f64, f64::max);
        if self.cfg.clock == Clock::Real {
            // The exchange is held on the air for its emulated time (the commits go out after it).
            tokio::time::sleep(Duration::from_secs_f64(t_comm)).await;
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

fn kind(m: &DeviceMsg) -> &'static str {
    match m {
        DeviceMsg::Hello { .. } => "Hello",
        DeviceMsg::Draft { .. } => "Draft",
        DeviceMsg::Upload { .. } => "Upload",
        DeviceMsg::Corrected { .. } => "Corrected",
        DeviceMsg::Bye => "Bye",
    }
}

/// The refusal a peer gets for `e` (used by tests and the device side).
pub fn refusal(e: &NetError) -> (ErrorCode, String) {
    (e.code(), e.to_string())
}
