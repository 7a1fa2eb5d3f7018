//! An edge device: connects to the server, checks the handshake both ways, then drafts whatever the server plans
//! each round with its own [`Drafter`] and applies the verdicts (UL upload or DL residual draw on rejection). It can
//! resume its session after a disconnect and continues from the text the server committed.

use crate::error::{NetError, Result};
use crate::proto::{
    self, DeviceMsg, ErrorCode, Identity, MAGIC, Message, Next, PROTOCOL_VERSION, Resume, ServerMsg,
};
use crate::server::check_wait;
use crate::tls::ClientTls;
use crate::wire::{Conn, Stream, framed_stream, recv, send};
use spin_runtime::Model;
use spin_runtime::drafter::{DistForm, Drafter, Lookup, device_rng};
use spin_runtime::speculative::sampling;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// The default [`DeviceConfig::handshake_timeout`]: generous, as the server answers a `Hello` between the passes of
/// its target (and, measuring compute, only after timing it at start-up), yet bounded, so that a server that
/// accepts the connection and says nothing cannot hold a device for ever.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// The default [`DeviceConfig::silence_timeout`]: twelve of the server's keepalive intervals
/// (`ServerConfig::keepalive_every`, 5 s by default), so that a server that is merely busy (a long verification
/// pass) is waited for, and one that hangs, or a path that is gone, is given up on within a minute.
pub const DEFAULT_SILENCE_TIMEOUT: Duration = Duration::from_secs(60);

/// The default [`DeviceConfig::progress_timeout`]: an hour without a plan or a verdict. Long enough for a server
/// that waits for `--devices` devices to join, or for a slow device's draft, yet bounded, so that a server that
/// answers every silence with a `KeepAlive` and never moves the session on cannot hold a device for ever.
pub const DEFAULT_PROGRESS_TIMEOUT: Duration = Duration::from_secs(3600);

/// Settings of a device.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// The server's address.
    pub addr: String,
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// The drafter's identity (vocabulary, tokenizer fingerprint).
    pub identity: Identity,
    /// Distance to the server in metres (None: the server's drop decides).
    pub distance_m: Option<f64>,
    /// Largest frame body.
    pub max_frame_bytes: usize,
    /// How long one handshake may take, from connecting to the `Welcome` (TLS and `Hello` included); past it the
    /// attempt fails with [`NetError::Timeout`] naming the step it waited for. Must be longer than 0.
    pub handshake_timeout: Duration,
    /// How long a device waits after the handshake for any message of the server (a `Plan`, a `Verdict`, a
    /// `KeepAlive`, which a server sends every few seconds while the device waits); past it the device tries to
    /// resume as after a cut (within `reconnect_for`), and fails with [`NetError::Silent`] when the resumed
    /// connection too stays silent that long before any message. Must be longer than 0, and well above the
    /// server's keepalive interval.
    pub silence_timeout: Duration,
    /// How long a welcomed device waits for the server to move its session on (a `Plan`, a `Verdict` or a
    /// `Dropped`) while it hears nothing else but `KeepAlive`s; resumes do not restart it. Past it the device fails
    /// with [`NetError::Stalled`]. Must be longer than 0.
    pub progress_timeout: Duration,
    /// Test hook: extra wall delay before each draft is sent (a straggler).
    pub delay: Option<Duration>,
    /// Test hook: drop the connection right after sending the draft of this round, then resume.
    pub disconnect_at_round: Option<u64>,
    /// The local address to connect from (None: the system's choice; tests and the load test spread devices over
    /// 127.0.0.0/8 so that per-address limits see them as different hosts).
    pub local_addr: Option<std::net::IpAddr>,
    /// TLS to the server (None: plaintext).
    pub tls: Option<ClientTls>,
    /// The admission token sent in `Hello` (empty: none).
    pub token: Vec<u8>,
    /// How long a device whose connection was cut keeps trying to resume (reconnects back off from 50 ms, doubling
    /// to 2 s); zero: it does not resume.
    pub reconnect_for: Duration,
    /// Drafting is timed holding this lock (when given): devices sharing one machine then draft one at a time, so
    /// each device's measured drafting time is that of a processor of its own (never while another drafts).
    pub draft_lock: Option<Arc<std::sync::Mutex<()>>>,
    /// Prompt lookup while drafting (`spin_runtime::drafter::Lookup`); None: the draft model alone.
    pub lookup: Option<Lookup>,
}

impl DeviceConfig {
    /// A device for `addr` with `prompt` and the drafter's `identity`.
    pub fn new(addr: impl Into<String>, prompt: Vec<u32>, identity: Identity) -> Self {
        DeviceConfig {
            addr: addr.into(),
            prompt,
            identity,
            distance_m: None,
            max_frame_bytes: proto::MAX_FRAME_BYTES,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            silence_timeout: DEFAULT_SILENCE_TIMEOUT,
            progress_timeout: DEFAULT_PROGRESS_TIMEOUT,
            delay: None,
            disconnect_at_round: None,
            reconnect_for: Duration::from_secs(30),
            local_addr: None,
            tls: None,
            token: Vec::new(),
            draft_lock: None,
            lookup: None,
        }
    }
}

/// What a device ends with.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceReport {
    /// Its session id.
    pub session: u64,
    /// Its index in the run.
    pub device: u32,
    /// The committed sequence (prompt and generated tokens).
    pub tokens: Vec<u32>,
    /// Prompt length.
    pub prompt_len: usize,
    /// Rounds it drafted in.
    pub rounds: u64,
    /// Times it resumed after a disconnect.
    pub resumes: u32,
}

impl DeviceReport {
    /// The generated tokens.
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
}

struct Joined {
    conn: Conn,
    session: u64,
    secret: [u8; proto::SECRET_BYTES],
    device: u32,
    drafter: Drafter<Arc<Model>>,
    max_new: usize,
}

/// The TCP connection to the server (from `cfg.local_addr` when given).
async fn connect(cfg: &DeviceConfig) -> Result<TcpStream> {
    Ok(match cfg.local_addr {
        None => TcpStream::connect(&cfg.addr).await?,
        Some(ip) => {
            let peer = tokio::net::lookup_host(&cfg.addr)
                .await?
                .next()
                .ok_or_else(|| NetError::invalid("addr", format!("{} resolves to no address", cfg.addr)))?;
            let socket = if ip.is_ipv4() {
                tokio::net::TcpSocket::new_v4()?
            } else {
                tokio::net::TcpSocket::new_v6()?
            };
            socket.bind(std::net::SocketAddr::new(ip, 0))?;
            socket.connect(peer).await?
        }
    })
}

/// `step` of the handshake, failing with [`NetError::Timeout`] (`waiting`: what did not happen) once `by` passed.
async fn in_time<T>(
    cfg: &DeviceConfig,
    by: tokio::time::Instant,
    waiting: &'static str,
    step: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout_at(by, step)
        .await
        .map_err(|_| NetError::Timeout {
            addr: cfg.addr.clone(),
            waiting,
            after: cfg.handshake_timeout,
        })?
}

async fn join(model: &Arc<Model>, cfg: &DeviceConfig, resume: Option<Resume>) -> Result<Joined> {
    // One deadline for the whole handshake: a server that trickles its answer is cut like a silent one.
    let by = tokio::time::Instant::now() + cfg.handshake_timeout;
    let stream = in_time(cfg, by, "did not accept the TCP connection", connect(cfg)).await?;
    let _ = stream.set_nodelay(true);
    let stream: Box<dyn Stream> = match &cfg.tls {
        None => Box::new(stream),
        Some(tls) => Box::new(
            in_time(cfg, by, "did not complete the TLS handshake", async {
                Ok(tls.connect(stream).await?)
            })
            .await?,
        ),
    };
    let mut conn = framed_stream(stream, cfg.max_frame_bytes);
    let hello = DeviceMsg::Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        identity: cfg.identity,
        resume,
        prompt: cfg.prompt.clone(),
        distance_m: cfg.distance_m,
        token: cfg.token.clone(),
    };
    in_time(cfg, by, "did not take the Hello", send(&mut conn, &hello)).await?;
    let (msg, _) = in_time(
        cfg,
        by,
        "accepted the connection but sent no Welcome",
        recv::<ServerMsg>(&mut conn, cfg.max_frame_bytes),
    )
    .await?;
    let ServerMsg::Welcome {
        version,
        session,
        secret,
        device,
        identity,
        committed,
        prompt_len,
        params,
    } = msg
    else {
        return Err(refused(msg));
    };
    if version != PROTOCOL_VERSION {
        return Err(NetError::Version {
            got: version.to_string(),
            want: PROTOCOL_VERSION.to_string(),
        });
    }
    // The check the server made, made again from this side.
    proto::check_identity(&cfg.identity, "drafter", &identity, "target")?;
    let sp = sampling(params.temperature)?;
    let form = DistForm::Sparse {
        v_eff: params.v_eff as usize,
        q_bits: u32::from(params.q_bits),
    };
    let model = model.clone();
    let mut drafter = tokio::task::block_in_place(|| {
        Drafter::new(
            model,
            &committed,
            prompt_len as usize,
            sp,
            form,
            device_rng(params.seed, device as usize),
        )
    })?;
    drafter.set_lookup(cfg.lookup)?;
    Ok(Joined {
        conn,
        session,
        secret,
        device,
        drafter,
        max_new: params.max_new_tokens as usize,
    })
}

/// Turns a non-welcome reply into the error it carries. The server's text is kept [`proto::printable`] (escaped,
/// bounded): a hostile server must not reach the device's terminal with escape sequences or megabytes of text.
fn refused(msg: ServerMsg) -> NetError {
    match msg {
        ServerMsg::Error { code, message } => NetError::Refused {
            code,
            message: proto::printable(&message),
        },
        ServerMsg::Shutdown { reason } => NetError::Shutdown(proto::printable(&reason)),
        other => NetError::Protocol(format!("expected Welcome, got {}", other.kind())),
    }
}

/// Runs a device until its text is complete (or the server ends the run); resumes once per disconnect.
pub async fn run_device(model: Arc<Model>, cfg: DeviceConfig) -> Result<DeviceReport> {
    run_device_with_ready(model, cfg, None).await
}

/// [`run_device`], signalling `ready` once the handshake is over: `true` when the device was welcomed, `false`
/// (or the sender dropped) when it could not join and the task is about to end with the error.
pub async fn run_device_with_ready(
    model: Arc<Model>,
    cfg: DeviceConfig,
    ready: Option<tokio::sync::oneshot::Sender<bool>>,
) -> Result<DeviceReport> {
    // The vocabulary the drafter's distributions are over: the target's also for a restricted draft head.
    if model.output_vocab() as u32 != cfg.identity.vocab {
        return Err(NetError::invalid(
            "identity.vocab",
            format!(
                "{} differs from the drafter's {}",
                cfg.identity.vocab,
                model.output_vocab()
            ),
        ));
    }
    for (field, d) in [
        ("handshake_timeout", cfg.handshake_timeout),
        ("silence_timeout", cfg.silence_timeout),
        ("progress_timeout", cfg.progress_timeout),
    ] {
        if d.is_zero() {
            return Err(NetError::invalid(field, "must be longer than 0 s"));
        }
        check_wait(field, d)?;
    }
    check_wait("reconnect_for", cfg.reconnect_for)?;
    let joined = join(&model, &cfg, None).await;
    if let Some(r) = ready {
        let _ = r.send(joined.is_ok());
    }
    let mut j = joined?;
    let mut rounds = 0u64;
    let mut resumes = 0u32;
    let mut disconnect_at = cfg.disconnect_at_round;
    // Whether this connection is a resume after a silence and has brought nothing yet: a server that is silent again
    // then is given up on (a hung server welcomes nothing; a server that welcomes and then says nothing would
    // otherwise hold the device for ever, one resume at a time).
    let mut resumed_after_silence = false;
    // When the server last moved the session on; `KeepAlive`s and resumes do not count.
    let mut progressed = Instant::now();
    loop {
        // A server that says nothing for the silence timeout (it sends a `KeepAlive` every few seconds while the
        // device waits) hangs, or the path to it is gone; one that keeps the device waiting past the progress
        // timeout, keepalives or not, is given up on.
        let progress_left = cfg.progress_timeout.saturating_sub(progressed.elapsed());
        let stalled = || NetError::Stalled {
            addr: cfg.addr.clone(),
            after: cfg.progress_timeout,
        };
        if progress_left.is_zero() {
            return Err(stalled());
        }
        let wait = cfg.silence_timeout.min(progress_left);
        let received = tokio::time::timeout(wait, recv::<ServerMsg>(&mut j.conn, cfg.max_frame_bytes))
            .await
            .unwrap_or_else(|_| {
                if wait < cfg.silence_timeout {
                    Err(stalled())
                } else {
                    Err(NetError::Silent {
                        addr: cfg.addr.clone(),
                        after: cfg.silence_timeout,
                    })
                }
            });
        let msg = match received {
            Ok((m, _)) => {
                resumed_after_silence = false;
                if !matches!(m, ServerMsg::KeepAlive) {
                    progressed = Instant::now();
                }
                m
            }
            // A cut connection (reset, closed without `Shutdown`, a frame cut short) is not the end of the run:
            // reconnect and resume with the session's id and secret; so is a first silence (a path that went away
            // without a reset looks like one).
            Err(e @ NetError::Silent { .. }) if !resumed_after_silence => {
                j = rejoin(&model, &cfg, j, e).await?;
                resumes += 1;
                resumed_after_silence = true;
                continue;
            }
            Err(e) if e.is_cut() => {
                j = rejoin(&model, &cfg, j, e).await?;
                resumes += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        let answered = match msg {
            ServerMsg::Plan {
                round,
                draft_len,
                sends_distributions,
                ..
            } => {
                let gamma = (draft_len as usize).min(j.max_new);
                let (d, draft_s) = tokio::task::block_in_place(|| {
                    // A poisoned lock only means another device's drafting failed; the lock guards no data.
                    let _one_at_a_time = cfg
                        .draft_lock
                        .as_ref()
                        .map(|l| l.lock().unwrap_or_else(|p| p.into_inner()));
                    let start = Instant::now();
                    let d = j.drafter.draft(gamma);
                    (d, start.elapsed().as_secs_f64())
                });
                let d = d?;
                if let Some(delay) = cfg.delay {
                    tokio::time::sleep(delay).await;
                }
                // The plan says whether the distributions go up (always in a paper-A session, never in a paper-B
                // one, the planner's choice in a unified one).
                let dists = if sends_distributions {
                    d.dists.iter().map(proto::pack).collect::<Result<Vec<_>>>()?
                } else {
                    Vec::new()
                };
                let sent = send(
                    &mut j.conn,
                    &DeviceMsg::Draft {
                        round,
                        tokens: d.tokens,
                        probs: d.probs,
                        dists,
                        draft_s,
                    },
                )
                .await;
                rounds += 1;
                if sent.is_ok() && disconnect_at == Some(round) {
                    disconnect_at = None;
                    // Vanish mid-round, then come back with the session id and secret.
                    let (session, secret) = (j.session, j.secret);
                    drop(j);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    j = join(&model, &cfg, Some(Resume { session, secret })).await?;
                    resumes += 1;
                }
                sent.map(|_| ())
            }
            ServerMsg::Verdict {
                round,
                accepted,
                next,
            } => match next {
                Next::Commit { token, done } => {
                    j.drafter.commit(accepted as usize, token)?;
                    if done {
                        let _ = send(&mut j.conn, &DeviceMsg::Bye).await;
                        return Ok(DeviceReport {
                            session: j.session,
                            device: j.device,
                            tokens: j.drafter.tokens().to_vec(),
                            prompt_len: j.drafter.prompt_len(),
                            rounds,
                            resumes,
                        });
                    }
                    Ok(())
                }
                Next::SendQ => {
                    let form = j.drafter.form();
                    let (v, q) = match form {
                        DistForm::Sparse { v_eff, q_bits } => (v_eff, q_bits),
                        DistForm::Dense => (j.drafter.vocab(), 16),
                    };
                    let q = j.drafter.uplink_q(accepted as usize, v, q)?;
                    send(
                        &mut j.conn,
                        &DeviceMsg::Upload {
                            round,
                            q: proto::pack(&q)?,
                        },
                    )
                    .await
                    .map(|_| ())
                }
                Next::Residual { p } => {
                    let p = proto::unpack(&p, j.drafter.vocab() as u32)?;
                    let token = j.drafter.correct_downlink(accepted as usize, &p)?;
                    send(&mut j.conn, &DeviceMsg::Corrected { round, token })
                        .await
                        .map(|_| ())
                }
            },
            ServerMsg::Dropped { .. } => {
                j.drafter.discard()?;
                Ok(())
            }
            ServerMsg::KeepAlive => Ok(()),
            m @ (ServerMsg::Shutdown { .. } | ServerMsg::Error { .. }) => return Err(refused(m)),
            ServerMsg::Welcome { .. } => return Err(NetError::Protocol("Welcome sent twice".into())),
        };
        match answered {
            Ok(()) => {}
            Err(e) if e.is_cut() => {
                j = rejoin(&model, &cfg, j, e).await?;
                resumes += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The wait before reconnect attempt `n` (from 0): 50 ms doubling to 2 s.
pub fn reconnect_backoff(n: u32) -> Duration {
    Duration::from_millis(50u64 << n.min(6)).min(Duration::from_secs(2))
}

/// Reconnects after `cut` and resumes `j`'s session, backing off between attempts for up to
/// `cfg.reconnect_for`. A resume the server answers `Busy` (it has not seen the old connection close yet) or a
/// connection that fails again is retried; any other refusal ends the device. The rebuilt drafter continues from
/// the text the server committed (a round in flight when the connection was cut commits nothing). A device that
/// does not resume (`reconnect_for` zero) fails with `cut` itself.
async fn rejoin(model: &Arc<Model>, cfg: &DeviceConfig, j: Joined, cut: NetError) -> Result<Joined> {
    let resume = Resume {
        session: j.session,
        secret: j.secret,
    };
    // The old connection is closed first, so that the server sees it go.
    drop(j);
    if cfg.reconnect_for.is_zero() {
        return Err(cut);
    }
    let give_up = Instant::now() + cfg.reconnect_for;
    let first = cut.to_string();
    let mut last = None;
    let mut attempt = 0u32;
    loop {
        let wait = reconnect_backoff(attempt);
        if Instant::now() + wait > give_up {
            return Err(NetError::Lost(format!(
                "{first}; not resumed within {} s{}",
                cfg.reconnect_for.as_secs_f64(),
                last.map_or(String::new(), |l: NetError| format!(" (last attempt: {l})"))
            )));
        }
        tokio::time::sleep(wait).await;
        attempt += 1;
        match join(model, cfg, Some(resume)).await {
            Ok(joined) => {
                tracing::info!("device: resumed session after {attempt} attempt(s)");
                return Ok(joined);
            }
            Err(NetError::Refused {
                code: ErrorCode::Busy,
                message,
            }) => {
                last = Some(NetError::Refused {
                    code: ErrorCode::Busy,
                    message,
                });
            }
            Err(e) if e.is_cut() => last = Some(e),
            Err(e) => return Err(e),
        }
    }
}
