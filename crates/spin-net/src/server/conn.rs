//! The network side: the listener (admission limits, accept errors retried with back-off), and one task per
//! connection that runs the TLS and protocol handshake under a timeout, decodes frames into the engine's events and
//! writes what the engine queues.

use super::*;

pub(super) enum Event {
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
pub(super) struct ConnHandle {
    pub(super) id: u64,
    /// The peer's address (admission limits are per IP address).
    pub(super) addr: IpAddr,
    /// The peer's address and port (named when its connection is refused).
    pub(super) peer: SocketAddr,
    pub(super) tx: mpsc::UnboundedSender<Outgoing>,
}

/// A message encoded once, by whoever sends it (the engine counts its bytes from the same body the writer sends).
pub(super) struct Outgoing {
    pub(super) body: Bytes,
    /// `Error` and `Shutdown`: the connection closes after it.
    pub(super) last: bool,
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
pub(super) fn push(tx: &mpsc::UnboundedSender<Outgoing>, msg: &ServerMsg) -> u64 {
    match Outgoing::new(msg) {
        Some(o) => {
            let n = o.body.len() as u64;
            let _ = tx.send(o);
            n
        }
        None => 0,
    }
}

/// The listener's settings for each connection.
#[derive(Debug, Clone)]
pub(super) struct ConnLimits {
    pub(super) max_frame: usize,
    pub(super) handshake_timeout: Duration,
    pub(super) max_connections: usize,
    pub(super) max_per_addr: usize,
    pub(super) tls: Option<ServerTls>,
}

/// Open connections, in all and per address (shared by the acceptor and the connection tasks).
#[derive(Default)]
pub(super) struct OpenConns {
    pub(super) total: usize,
    pub(super) per_addr: HashMap<IpAddr, usize>,
}

/// One admitted connection: counted while it lives, uncounted when dropped.
pub(super) struct ConnSlot {
    pub(super) open: Arc<Mutex<OpenConns>>,
    pub(super) addr: IpAddr,
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
pub(super) fn accept_error_kind(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(23 | 24) => "file descriptors exhausted (ENFILE/EMFILE)",
        Some(12 | 105) => "memory or buffers exhausted (ENOMEM/ENOBUFS)",
        Some(103) => "connection aborted before accept (ECONNABORTED)",
        _ => "accept failed",
    }
}

/// Accepts connections until `stop`; an accept error never ends it (logged, then retried after a back-off).
pub(super) async fn accept_loop(
    listener: TcpListener,
    ev_tx: mpsc::UnboundedSender<Event>,
    limits: ConnLimits,
    notices: Notices,
    mut stop: oneshot::Receiver<()>,
) {
    let mut next_id = 0u64;
    let mut conns = tokio::task::JoinSet::new();
    let open = Arc::new(Mutex::new(OpenConns::default()));
    let mut errors = 0u32;
    let mut flush = tokio::time::interval(REFUSAL_FLUSH_EVERY);
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = flush.tick() => notices.flush_due_refusals(),
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    errors = 0;
                    match ConnSlot::take(&open, peer.ip(), &limits) {
                        Ok(slot) => {
                            next_id += 1;
                            conns.spawn(connection(
                                stream,
                                peer,
                                next_id,
                                ev_tx.clone(),
                                limits.clone(),
                                notices.clone(),
                                slot,
                            ));
                        }
                        Err(why) => {
                            // One non-blocking write of the refusal, then close: a flood costs no task. Over TLS
                            // the connection is closed unanswered (an answer would need a handshake).
                            let e = NetError::Full(why);
                            notices.refused(peer, &e);
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
    notices.flush_refusals();
}

/// One connection: decode frames into events; refuse and close on anything malformed, on a handshake that does not
/// complete within the timeout, and after `Bye`. Every refusal is one operator notice naming `peer`.
pub(super) async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    conn_id: u64,
    events: mpsc::UnboundedSender<Event>,
    limits: ConnLimits,
    notices: Notices,
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
                notices.refused(peer, &format!("tls: handshake failed: {e}"));
                return;
            }
            Err(_) => {
                notices.refused(
                    peer,
                    &format!(
                        "handshake: no TLS handshake within {} s",
                        limits.handshake_timeout.as_secs_f64()
                    ),
                );
                return;
            }
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
        notices.refused(peer, e);
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
                    addr: peer.ip(),
                    peer,
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
