//! The edge server against hostile and broken clients over loopback (issue 22's cases): sessions only their device
//! can resume, ids that no seed predicts, admission limits answered `Full`, handshake timeouts, a silent device
//! that cannot stall the others, a device that resumes through a cut connection, and the protocol's semantics
//! (DL corrections outside p, `Bye` before done, the size of an oversized prefix). Every wait is bounded.

use spin_net::controller::Scheme;
use spin_net::device::{DeviceConfig, run_device};
use spin_net::proto::{
    self, DeviceMsg, ErrorCode, Identity, MAGIC, Next, PROTOCOL_VERSION, Resume, ServerMsg,
};
use spin_net::server::{RoundTrace, Server, ServerConfig, Summary};
use spin_net::wire::{Conn, framed, recv, send};
use spin_runtime::Model;
use spin_runtime::model;
use spin_runtime::speculative::{generate_plain, sampling};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::time::timeout;

const LIMIT: Duration = Duration::from_secs(60);

fn tiny(seed: u64, n_layers: usize) -> Arc<Model> {
    let device = spin_runtime::select_device().unwrap();
    Arc::new(model::tiny_random_model(seed, 0.3, n_layers, &device).unwrap())
}

fn identity(m: &Model) -> Identity {
    Identity {
        vocab: m.config().vocab_size as u32,
        tokenizer: 7,
        model: 0,
    }
}

/// `f`, failing the test past the time limit (the timer is made inside the runtime).
async fn bounded<F: std::future::Future>(f: F) -> Result<F::Output, tokio::time::error::Elapsed> {
    timeout(LIMIT, f).await
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn config(scheme: &str, target: &Model) -> ServerConfig {
    let mut cfg = ServerConfig::new(Scheme::parse_per_round(scheme).unwrap(), identity(target));
    cfg.max_new_tokens = 12;
    cfg.max_draft_len = 4;
    cfg.saa_samples = 16;
    cfg
}

fn hello(vocab: u32, resume: Option<Resume>) -> DeviceMsg {
    DeviceMsg::Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        identity: Identity {
            vocab,
            tokenizer: 7,
            model: 0,
        },
        resume,
        prompt: vec![1, 2],
        distance_m: None,
        token: vec![],
    }
}

/// A connection from a chosen loopback source address (127.0.0.x: per-address limits are per IP).
async fn connect_from(source: [u8; 4], addr: &str) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(SocketAddr::from((source, 0)))?;
    s.connect(addr.parse().unwrap()).await
}

async fn raw(addr: &str, source: [u8; 4]) -> Conn {
    framed(connect_from(source, addr).await.unwrap(), proto::MAX_FRAME_BYTES)
}

/// The next message other than a `KeepAlive`.
async fn next(conn: &mut Conn) -> ServerMsg {
    loop {
        let m = timeout(
            Duration::from_secs(20),
            recv::<ServerMsg>(conn, proto::MAX_FRAME_BYTES),
        )
        .await
        .expect("the server answered in time")
        .expect("a message")
        .0;
        if m != ServerMsg::KeepAlive {
            return m;
        }
    }
}

/// Hello and the Welcome's (session, secret).
async fn join(
    conn: &mut Conn,
    vocab: u32,
    resume: Option<Resume>,
) -> std::result::Result<Resume, (ErrorCode, String)> {
    send(conn, &hello(vocab, resume)).await.unwrap();
    match next(conn).await {
        ServerMsg::Welcome { session, secret, .. } => Ok(Resume { session, secret }),
        ServerMsg::Error { code, message } => Err((code, message)),
        other => panic!("expected Welcome or Error, got {other:?}"),
    }
}

/// Whether the server closes `conn` within `within` (after any messages, which are returned).
async fn closed_within(conn: &mut Conn, within: Duration) -> Option<Vec<ServerMsg>> {
    let mut seen = Vec::new();
    let r = timeout(within, async {
        loop {
            match recv::<ServerMsg>(conn, proto::MAX_FRAME_BYTES).await {
                Ok((m, _)) => seen.push(m),
                Err(_) => return,
            }
        }
    })
    .await;
    r.ok().map(|_| seen)
}

type Serving = tokio::task::JoinHandle<spin_net::Result<Summary>>;

async fn start(
    cfg: ServerConfig,
    target: &Arc<Model>,
    traces: Arc<Mutex<Vec<RoundTrace>>>,
) -> (String, Serving, watch::Sender<bool>) {
    let (tx, rx) = watch::channel(false);
    let server = Server::bind("127.0.0.1:0", target.clone(), cfg).await.unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let serving = tokio::spawn(server.run(rx, move |t| traces.lock().unwrap().push(t.clone())));
    (addr, serving, tx)
}

/// Case 1: a second `Hello{resume}` can neither take nor read a live session: a wrong secret is `UnknownSession`,
/// the right one while the owner is connected is `Busy`, and the owner keeps its connection and its rounds.
#[test]
fn a_live_session_cannot_be_taken_over() {
    let target = tiny(1, 2);
    let vocab = identity(&target).vocab;
    let rt = runtime();
    rt.block_on(bounded(async {
        let mut cfg = config("best", &target);
        cfg.min_devices = 2;
        let (addr, serving, stop) = start(cfg, &target, Default::default()).await;
        let mut owner = raw(&addr, [127, 0, 0, 1]).await;
        let cred = join(&mut owner, vocab, None).await.unwrap();
        assert_ne!(cred.secret, [0; 16]);
        let mut wrong = cred;
        wrong.secret[15] ^= 1;
        let mut thief = raw(&addr, [127, 0, 0, 2]).await;
        let (code, msg) = join(&mut thief, vocab, Some(wrong)).await.unwrap_err();
        assert_eq!(code, ErrorCode::UnknownSession, "{msg}");
        let mut thief = raw(&addr, [127, 0, 0, 2]).await;
        let (code, msg) = join(&mut thief, vocab, Some(cred)).await.unwrap_err();
        assert_eq!(code, ErrorCode::Busy, "{msg}");
        // The owner is still in: a second device starts the rounds and the owner gets its plan.
        let d = tokio::spawn(run_device(
            target.clone(),
            DeviceConfig::new(addr.clone(), vec![1, 3], identity(&target)),
        ));
        assert!(matches!(next(&mut owner).await, ServerMsg::Plan { round: 0, .. }));
        let _ = stop.send(true);
        let _ = d.await;
        serving.await.unwrap().unwrap();
    }))
    .unwrap();
}

/// Case 2: ids and secrets come from the OS, not the seed: two servers with the same seed hand out different ones,
/// while the same-seed runs' traces stay byte-identical (checked in tests/system.rs).
#[test]
fn session_ids_and_secrets_do_not_follow_the_seed() {
    let target = tiny(1, 2);
    let vocab = identity(&target).vocab;
    let rt = runtime();
    let creds: Vec<Resume> = rt.block_on(async {
        let mut out = Vec::new();
        for _ in 0..2 {
            let mut cfg = config("best", &target);
            cfg.min_devices = 2;
            let (addr, serving, stop) = start(cfg, &target, Default::default()).await;
            let mut c = raw(&addr, [127, 0, 0, 1]).await;
            out.push(join(&mut c, vocab, None).await.unwrap());
            let _ = stop.send(true);
            serving.await.unwrap().unwrap();
        }
        out
    });
    assert_ne!(creds[0].session, creds[1].session);
    assert_ne!(creds[0].secret, creds[1].secret);
}

/// Case 4: admission. A flood of `Hello`+close from one address fills only that address's quota of sessions that
/// have not drafted (then `Full`), a real device from another address still gets in and finishes; a full server
/// answers `Full`; an idle or trickling connection is cut at the handshake timeout; one address's connections are
/// capped; an abandoned session is released at the end of its resume window.
#[test]
fn admission_limits_hold_and_answer_full() {
    let target = tiny(1, 2);
    let drafter = tiny(2, 1);
    let vocab = identity(&target).vocab;
    let rt = runtime();
    rt.block_on(bounded(async {
        let mut cfg = config("best", &target);
        cfg.max_pending_per_addr = 8;
        cfg.max_devices = 40;
        cfg.handshake_timeout = Duration::from_millis(400);
        cfg.resume_window = Duration::from_secs(3);
        cfg.stop_when_done = false;
        let (addr, serving, stop) = start(cfg, &target, Default::default()).await;
        let mut refused = Vec::new();
        let mut first = None;
        for i in 0..30 {
            let mut c = raw(&addr, [127, 0, 0, 2]).await;
            match join(&mut c, vocab, None).await {
                Ok(cred) => {
                    first.get_or_insert(cred);
                }
                Err((code, msg)) => refused.push((i, code, msg)),
            }
        }
        assert_eq!(refused.len(), 22, "{refused:?}");
        assert!(
            refused
                .iter()
                .all(|(_, c, m)| *c == ErrorCode::Full && m.contains("per-address")),
            "{refused:?}"
        );
        // A real device from 127.0.0.1 is admitted and generates.
        let d = run_device(
            drafter.clone(),
            DeviceConfig::new(addr.clone(), vec![1, 5, 9], identity(&drafter)),
        );
        let rep = timeout(Duration::from_secs(40), d).await.unwrap().unwrap();
        assert_eq!(rep.generated().len(), 12);
        // The flood's sessions ended with their resume window: a resume with the right secret is refused.
        tokio::time::sleep(Duration::from_millis(3200)).await;
        let mut c = raw(&addr, [127, 0, 0, 2]).await;
        let (code, _) = join(&mut c, vocab, first).await.unwrap_err();
        assert_eq!(code, ErrorCode::UnknownSession);
        // Idle and slowloris connections are cut at the handshake timeout.
        let mut idle = connect_from([127, 0, 0, 3], &addr).await.unwrap();
        let mut slow = connect_from([127, 0, 0, 3], &addr).await.unwrap();
        let body = proto::encode(&hello(vocab, None)).unwrap();
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        let trickle = async {
            for b in &frame {
                if slow.write_all(&[*b]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let mut rest = Vec::new();
            let _ = timeout(Duration::from_secs(5), slow.read_to_end(&mut rest)).await;
            rest
        };
        let mut idle_rest = Vec::new();
        let (slow_rest, idle_read) = tokio::join!(
            trickle,
            timeout(Duration::from_secs(5), idle.read_to_end(&mut idle_rest))
        );
        assert!(idle_read.is_ok(), "the idle connection was closed");
        for reply in [&idle_rest, &slow_rest] {
            let len = u32::from_be_bytes(reply[..4].try_into().unwrap()) as usize;
            match proto::decode::<ServerMsg>(&reply[4..4 + len]).unwrap() {
                ServerMsg::Error { code, message } => {
                    assert_eq!(code, ErrorCode::Protocol);
                    assert!(message.contains("handshake"), "{message}");
                }
                other => panic!("{other:?}"),
            }
        }
        let _ = stop.send(true);
        serving.await.unwrap().unwrap();
        // A full server (max_devices) answers Full, not Protocol.
        let mut cfg = config("best", &target);
        cfg.max_devices = 2;
        cfg.min_devices = 2;
        cfg.max_connections_per_addr = 4;
        let (addr, serving, stop) = start(cfg, &target, Default::default()).await;
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut c = raw(&addr, [127, 0, 0, 1]).await;
            join(&mut c, vocab, None).await.unwrap();
            held.push(c);
        }
        let mut c = raw(&addr, [127, 0, 0, 5]).await;
        let (code, msg) = join(&mut c, vocab, None).await.unwrap_err();
        assert_eq!(code, ErrorCode::Full, "{msg}");
        // Connections per address: the fifth from one address is refused at once.
        let mut open = Vec::new();
        for _ in 0..4 {
            open.push(connect_from([127, 0, 0, 4], &addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut fifth = raw(&addr, [127, 0, 0, 4]).await;
        match next(&mut fifth).await {
            ServerMsg::Error { code, message } => {
                assert_eq!(code, ErrorCode::Full);
                assert!(message.contains("open connections"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        drop(open);
        let _ = stop.send(true);
        serving.await.unwrap().unwrap();
    }))
    .unwrap();
}

/// Case 6: a device that takes its plan and never answers is dropped for the round at the wall deadline
/// (`silent` in the trace) on the virtual clock, and the others finish their text; its owner can then resume on a
/// new connection (a half-open connection does not lock a session).
#[test]
fn a_silent_device_cannot_stall_the_virtual_clock() {
    let target = tiny(1, 2);
    let drafter = tiny(2, 1);
    let vocab = identity(&target).vocab;
    let rt = runtime();
    let traces: Arc<Mutex<Vec<RoundTrace>>> = Default::default();
    let rep = rt
        .block_on(bounded(async {
            let mut cfg = config("best", &target);
            cfg.min_devices = 2;
            cfg.wall_deadline = Duration::from_millis(300);
            let (addr, serving, stop) = start(cfg, &target, traces.clone()).await;
            let mut silent = raw(&addr, [127, 0, 0, 1]).await;
            let cred = join(&mut silent, vocab, None).await.unwrap();
            let rep = run_device(
                drafter.clone(),
                DeviceConfig::new(addr.clone(), vec![1, 5, 9], identity(&drafter)),
            )
            .await
            .unwrap();
            // Its connection went silent (as a half-open one would): the device, with its secret, takes the
            // session back on a new connection instead of being told `Busy`.
            let mut back = raw(&addr, [127, 0, 0, 1]).await;
            join(&mut back, vocab, Some(cred)).await.unwrap();
            let _ = stop.send(true);
            serving.await.unwrap().unwrap();
            drop(silent);
            rep
        }))
        .unwrap();
    let greedy = sampling(0.0).unwrap();
    assert_eq!(
        rep.generated(),
        generate_plain(&target, &[1, 5, 9], &greedy, 12, None, 0)
            .unwrap()
            .as_slice()
    );
    let traces = traces.lock().unwrap();
    assert!(!traces.is_empty());
    // Silent in every round but the one in which it was taken back on the new connection (then `lost`).
    let modes: Vec<&str> = traces.iter().map(|t| t.devices[0].mode.name()).collect();
    assert!(
        modes.iter().all(|m| *m == "silent" || *m == "lost")
            && modes.iter().filter(|m| **m == "lost").count() <= 1
            && modes[0] == "silent",
        "{modes:?}"
    );
}

/// A proxy that forwards to `server` and cuts its first connection once `cut_after` bytes went to the device; later
/// connections pass through. Returns its address.
async fn cutting_proxy(server: String, cut_after: usize) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut dev, _)) = l.accept().await {
            let mut up = TcpStream::connect(&server).await.unwrap();
            let limit = if first { Some(cut_after) } else { None };
            first = false;
            tokio::spawn(async move {
                let (mut dr, mut dw) = dev.split();
                let (mut ur, mut uw) = up.split();
                let upstream = tokio::io::copy(&mut dr, &mut uw);
                let downstream = async {
                    let mut buf = [0u8; 256];
                    let mut sent = 0usize;
                    loop {
                        let n = match ur.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if dw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                        sent += n;
                        if limit.is_some_and(|l| sent >= l) {
                            return;
                        }
                    }
                };
                tokio::select! {
                    _ = upstream => {}
                    _ = downstream => {}
                }
                // Both sockets drop here: the connection is cut in both directions.
            });
        }
    });
    addr
}

/// Case 7: a device whose TCP connection is cut mid-run reconnects, resumes with its id and secret, and ends with
/// the text of the run without the fault.
#[test]
fn a_device_resumes_through_a_cut_connection_with_the_same_text() {
    let target = tiny(1, 2);
    let drafter = tiny(2, 1);
    let rt = runtime();
    let greedy = sampling(0.0).unwrap();
    for scheme in ["exact", "best"] {
        let rep = rt
            .block_on(bounded(async {
                let cfg = config(scheme, &target);
                let (addr, serving, _stop) = start(cfg, &target, Default::default()).await;
                let proxy = cutting_proxy(addr, 70).await;
                let rep = run_device(
                    drafter.clone(),
                    DeviceConfig::new(proxy, vec![1, 5, 9], identity(&drafter)),
                )
                .await
                .unwrap();
                serving.await.unwrap().unwrap();
                rep
            }))
            .unwrap();
        assert!(rep.resumes >= 1, "{scheme}: the connection was cut");
        let want = generate_plain(&target, &[1, 5, 9], &greedy, 12, None, 0).unwrap();
        assert_eq!(rep.generated(), want.as_slice(), "{scheme}");
    }
}

/// Case 8: in DL mode a `Corrected` token with no mass in the p the server sent is a `Protocol` error, never
/// committed.
#[test]
fn a_dl_correction_outside_the_sent_p_is_refused() {
    let target = tiny(1, 2);
    let vocab = identity(&target).vocab;
    let rt = runtime();
    let traces: Arc<Mutex<Vec<RoundTrace>>> = Default::default();
    let summary = rt
        .block_on(bounded(async {
            let mut cfg = config("best", &target);
            cfg.modes = spin_optimize::paper_b::ModeScheme::AllDl;
            // A small V_eff: most tokens have no entry in the p that goes down.
            cfg.v_eff = 2;
            cfg.resume_window = Duration::from_millis(300);
            let (addr, serving, _stop) = start(cfg, &target, traces.clone()).await;
            let mut c = raw(&addr, [127, 0, 0, 1]).await;
            join(&mut c, vocab, None).await.unwrap();
            let mut refusal = None;
            for _ in 0..40 {
                match next(&mut c).await {
                    ServerMsg::Plan { round, draft_len, .. } => {
                        let tokens: Vec<u32> = (0..draft_len.min(1))
                            .map(|j| (round as u32 * 7 + j + 3) % vocab)
                            .collect();
                        let probs = vec![1.0; tokens.len()];
                        send(
                            &mut c,
                            &DeviceMsg::Draft {
                                round,
                                tokens,
                                probs,
                                dists: vec![],
                                draft_s: 0.0,
                            },
                        )
                        .await
                        .unwrap();
                    }
                    ServerMsg::Verdict {
                        round,
                        next: Next::Residual { p },
                        ..
                    } => {
                        let p = proto::unpack(&p, vocab).unwrap();
                        let outside = (0..vocab).find(|t| !spin_net::server::has_mass(&p, *t)).unwrap();
                        send(
                            &mut c,
                            &DeviceMsg::Corrected {
                                round,
                                token: outside,
                            },
                        )
                        .await
                        .unwrap();
                    }
                    ServerMsg::Verdict { .. } | ServerMsg::Dropped { .. } => {}
                    ServerMsg::Error { code, message } => {
                        refusal = Some((code, message));
                        break;
                    }
                    other => panic!("{other:?}"),
                }
            }
            let (code, message) = refusal.expect("the bad correction was refused");
            assert_eq!(code, ErrorCode::Protocol);
            assert!(
                message.contains("corrected.token") && message.contains("no mass"),
                "{message}"
            );
            drop(c);
            serving.await.unwrap().unwrap()
        }))
        .unwrap();
    // Nothing was committed for the refused round.
    let traces = traces.lock().unwrap();
    let last = traces.last().unwrap();
    assert_eq!(last.devices[0].mode, "lost");
    assert_eq!(last.devices[0].emitted, 0);
    assert!(summary.tokens < 12);
}

/// Case 9: `Bye` before done ends the session and closes the connection (a resume is then refused); a length prefix
/// of 0xFFFFFFFF is reported with its real size.
#[test]
fn bye_before_done_closes_and_an_oversized_prefix_is_reported_exactly() {
    let target = tiny(1, 2);
    let vocab = identity(&target).vocab;
    let rt = runtime();
    rt.block_on(bounded(async {
        let mut cfg = config("best", &target);
        cfg.min_devices = 2;
        let (addr, serving, stop) = start(cfg, &target, Default::default()).await;
        let mut c = raw(&addr, [127, 0, 0, 1]).await;
        let cred = join(&mut c, vocab, None).await.unwrap();
        send(&mut c, &DeviceMsg::Bye).await.unwrap();
        assert!(
            closed_within(&mut c, Duration::from_secs(5)).await.is_some(),
            "closed after Bye"
        );
        let mut again = raw(&addr, [127, 0, 0, 1]).await;
        let (code, _) = join(&mut again, vocab, Some(cred)).await.unwrap_err();
        assert_eq!(code, ErrorCode::UnknownSession);
        let mut s = connect_from([127, 0, 0, 1], &addr).await.unwrap();
        s.write_all(&[0xff; 4]).await.unwrap();
        let mut reply = Vec::new();
        let _ = timeout(Duration::from_secs(5), s.read_to_end(&mut reply)).await;
        let len = u32::from_be_bytes(reply[..4].try_into().unwrap()) as usize;
        match proto::decode::<ServerMsg>(&reply[4..4 + len]).unwrap() {
            ServerMsg::Error { code, message } => {
                assert_eq!(code, ErrorCode::TooLarge);
                assert!(message.contains("4294967295 bytes"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let _ = stop.send(true);
        serving.await.unwrap().unwrap();
    }))
    .unwrap();
}

/// The server waiting for `--devices 2` with one joined says so, naming whom it has, periodically.
#[test]
fn a_server_short_of_devices_says_whom_it_waits_for() {
    let target = tiny(1, 2);
    let vocab = identity(&target).vocab;
    let rt = runtime();
    let notices: Arc<Mutex<Vec<String>>> = Default::default();
    rt.block_on(bounded(async {
        let mut cfg = config("best", &target);
        cfg.min_devices = 2;
        cfg.notice_every = Duration::from_millis(100);
        let (tx, rx) = watch::channel(false);
        let n = notices.clone();
        let server = Server::bind("127.0.0.1:0", target.clone(), cfg)
            .await
            .unwrap()
            .with_notices(move |t| n.lock().unwrap().push(t.to_string()));
        let addr = server.local_addr().unwrap().to_string();
        let serving = tokio::spawn(server.run(rx, |_| {}));
        let mut c = raw(&addr, [127, 0, 0, 1]).await;
        join(&mut c, vocab, None).await.unwrap();
        tokio::time::sleep(Duration::from_millis(450)).await;
        let _ = tx.send(true);
        serving.await.unwrap().unwrap();
    }))
    .unwrap();
    let notices = notices.lock().unwrap();
    assert!(notices.len() >= 2, "{notices:?}");
    let last = notices.last().unwrap();
    assert!(
        last.contains("waiting for 1 more device")
            && last.contains("1 of 2")
            && last.contains("device 0 from 127.0.0.1"),
        "{last}"
    );
}

/// Case 3: TLS and admission tokens. A device over TLS with a token gets its text; without the token, or with a
/// wrong one, it is refused `Unauthorized`; a plaintext client gets no session from a TLS server; a device that does
/// not trust the server's certificate refuses it.
#[test]
fn tls_with_admission_tokens_serves_devices_and_refuses_the_rest() {
    use spin_net::tls::{ClientTls, ServerTls, self_signed};
    let target = tiny(1, 2);
    let drafter = tiny(2, 1);
    let vocab = identity(&target).vocab;
    let (cert, key) = self_signed(&["localhost".into(), "127.0.0.1".into()]).unwrap();
    let (other_cert, _) = self_signed(&["localhost".into()]).unwrap();
    let rt = runtime();
    let rep = rt
        .block_on(bounded(async {
            let mut cfg = config("best", &target);
            cfg.tls = Some(ServerTls::from_pem(cert.as_bytes(), key.as_bytes()).unwrap());
            cfg.device_tokens = vec![b"device-token-0123456789".to_vec()];
            cfg.handshake_timeout = Duration::from_millis(500);
            let (addr, serving, _stop) = start(cfg, &target, Default::default()).await;
            let device = |tls: ClientTls, token: &[u8]| {
                let mut dc = DeviceConfig::new(addr.clone(), vec![1, 5, 9], identity(&drafter));
                dc.tls = Some(tls);
                dc.token = token.to_vec();
                dc.reconnect_for = Duration::ZERO;
                run_device(drafter.clone(), dc)
            };
            let trusted = ClientTls::from_pem(cert.as_bytes(), "localhost").unwrap();
            for bad in [&b""[..], b"device-token-0123456788"] {
                match device(trusted.clone(), bad).await {
                    Err(spin_net::NetError::Refused { code, message }) => {
                        assert_eq!(code, ErrorCode::Unauthorized, "{message}")
                    }
                    other => panic!("{other:?}"),
                }
            }
            let untrusted = ClientTls::from_pem(other_cert.as_bytes(), "localhost").unwrap();
            assert!(device(untrusted, b"device-token-0123456789").await.is_err());
            let wrong_name = ClientTls::from_pem(cert.as_bytes(), "example.org").unwrap();
            assert!(device(wrong_name, b"device-token-0123456789").await.is_err());
            // Plaintext to the TLS port: no Welcome, the connection is closed.
            let mut plain = raw(&addr, [127, 0, 0, 1]).await;
            send(&mut plain, &hello(vocab, None)).await.unwrap();
            let seen = closed_within(&mut plain, Duration::from_secs(5))
                .await
                .expect("closed");
            assert!(
                seen.iter().all(|m| !matches!(m, ServerMsg::Welcome { .. })),
                "{seen:?}"
            );
            let rep = device(trusted, b"device-token-0123456789").await.unwrap();
            serving.await.unwrap().unwrap();
            rep
        }))
        .unwrap();
    let greedy = sampling(0.0).unwrap();
    let want = generate_plain(&target, &[1, 5, 9], &greedy, 12, None, 0).unwrap();
    assert_eq!(rep.generated(), want.as_slice());
}

/// A listener on 127.0.0.1 that accepts every connection, reads what comes and never answers; each connection is
/// held until the listener task is dropped.
async fn silent_server() -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = listener.accept().await {
            held.push(tokio::spawn(async move {
                let mut sink = [0u8; 1024];
                while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
                std::future::pending::<()>().await;
            }));
        }
    });
    (addr, task)
}

/// A server that accepts the connection and says nothing cannot hold a device: its handshake times out, naming the
/// address and the step it waited for (the `Welcome`; the TLS handshake over TLS), and a resume gives up too.
#[test]
fn a_device_gives_up_on_a_server_that_accepts_and_says_nothing() {
    use spin_net::tls::{ClientTls, self_signed};
    let drafter = tiny(2, 1);
    let rt = runtime();
    rt.block_on(bounded(async {
        let (addr, server) = silent_server().await;
        let mut cfg = DeviceConfig::new(addr.clone(), vec![1, 5, 9], identity(&drafter));
        cfg.handshake_timeout = Duration::from_millis(200);
        let start = std::time::Instant::now();
        let e = run_device(drafter.clone(), cfg.clone()).await.unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
        assert!(matches!(e, spin_net::NetError::Timeout { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "handshake: the server accepted the connection but sent no Welcome within 0.2 s"
        );
        let (cert, _) = self_signed(&["localhost".into()]).unwrap();
        cfg.tls = Some(ClientTls::from_pem(cert.as_bytes(), "localhost").unwrap());
        let e = run_device(drafter.clone(), cfg.clone()).await.unwrap_err();
        assert!(
            e.to_string().contains("did not complete the TLS handshake"),
            "{e}"
        );
        // A zero timeout, and waits that no clock can hold as a deadline, are refused by name before any
        // connection (they used to panic adding to the clock).
        let mut zero = cfg.clone();
        zero.handshake_timeout = Duration::ZERO;
        let e = run_device(drafter.clone(), zero).await.unwrap_err();
        assert!(e.to_string().starts_with("handshake_timeout:"), "{e}");
        let mut endless = cfg.clone();
        endless.handshake_timeout = Duration::MAX;
        let e = run_device(drafter.clone(), endless).await.unwrap_err();
        assert!(e.to_string().starts_with("handshake_timeout:"), "{e}");
        let mut endless = cfg;
        endless.reconnect_for = Duration::MAX;
        let e = run_device(drafter.clone(), endless).await.unwrap_err();
        assert!(e.to_string().starts_with("reconnect_for:"), "{e}");
        server.abort();
    }))
    .unwrap();
}

/// A server that answers every `Hello` with a `Welcome` the device accepts, then says nothing; returns its address
/// and the count of connections it welcomed.
async fn welcoming_server(
    drafter: &Model,
) -> (
    String,
    Arc<std::sync::atomic::AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    welcoming_server_with(drafter, None).await
}

/// [`welcoming_server`] that, with `keepalive_every`, sends a `KeepAlive` at that interval after the `Welcome`
/// and nothing else.
async fn welcoming_server_with(
    drafter: &Model,
    keepalive_every: Option<Duration>,
) -> (
    String,
    Arc<std::sync::atomic::AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let welcomed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = welcomed.clone();
    let welcome = ServerMsg::Welcome {
        version: PROTOCOL_VERSION,
        session: 7,
        secret: [3; proto::SECRET_BYTES],
        device: 0,
        identity: identity(drafter),
        committed: vec![1, 5, 9],
        prompt_len: 3,
        params: proto::SessionParams {
            temperature: 0.0,
            exchange: proto::Exchange::ProbsOnly,
            v_eff: 16,
            q_bits: 8,
            seed: 0,
            max_new_tokens: 8,
        },
    };
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            let (welcome, count) = (welcome.clone(), count.clone());
            held.push(tokio::spawn(async move {
                let mut conn = framed(s, proto::MAX_FRAME_BYTES);
                let _ = recv::<DeviceMsg>(&mut conn, proto::MAX_FRAME_BYTES).await;
                send(&mut conn, &welcome).await.unwrap();
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                match keepalive_every {
                    Some(every) => loop {
                        tokio::time::sleep(every).await;
                        if send(&mut conn, &ServerMsg::KeepAlive).await.is_err() {
                            break;
                        }
                    },
                    None => std::future::pending::<()>().await,
                }
            }));
        }
    });
    (addr, welcomed, task)
}

/// A server that welcomes the device and then says nothing, not even a `KeepAlive`, cannot hold it: past its
/// silence timeout the device resumes once and, silent again, gives up with `Silent`; without resuming it gives up
/// at the first silence. A zero or endless silence timeout is refused by name.
#[test]
fn a_device_gives_up_on_a_server_that_welcomes_and_then_says_nothing() {
    let drafter = tiny(2, 1);
    let rt = runtime();
    rt.block_on(bounded(async {
        let (addr, welcomed, server) = welcoming_server(&drafter).await;
        let mut cfg = DeviceConfig::new(addr.clone(), vec![1, 5, 9], identity(&drafter));
        cfg.silence_timeout = Duration::from_millis(300);
        cfg.reconnect_for = Duration::ZERO;
        let start = std::time::Instant::now();
        let e = run_device(drafter.clone(), cfg.clone()).await.unwrap_err();
        let took = start.elapsed();
        assert!(matches!(e, spin_net::NetError::Silent { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "silence: the server sent nothing for 0.3 s after the handshake, not even a keepalive"
        );
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(5),
            "{took:?}"
        );
        assert_eq!(welcomed.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Resuming: one resume after the first silence, then the second ends it.
        cfg.reconnect_for = Duration::from_secs(5);
        let start = std::time::Instant::now();
        let e = run_device(drafter.clone(), cfg.clone()).await.unwrap_err();
        let took = start.elapsed();
        assert!(matches!(e, spin_net::NetError::Silent { .. }), "{e:?}");
        assert!(
            took >= Duration::from_millis(600) && took < Duration::from_secs(10),
            "{took:?}"
        );
        assert_eq!(welcomed.load(std::sync::atomic::Ordering::SeqCst), 3);
        for bad in [Duration::ZERO, Duration::MAX] {
            let mut c = cfg.clone();
            c.silence_timeout = bad;
            let e = run_device(drafter.clone(), c).await.unwrap_err();
            assert!(e.to_string().starts_with("silence_timeout:"), "{e}");
        }
        server.abort();
    }))
    .unwrap();
}

/// A server that welcomes the device and then sends only `KeepAlive`s, never a plan, cannot hold it either: the
/// keepalives satisfy the silence timeout, and past the progress timeout the device gives up with `Stalled`,
/// without resuming. A zero or endless progress timeout is refused by name.
#[test]
fn a_device_gives_up_on_a_server_that_only_keeps_it_alive() {
    let drafter = tiny(2, 1);
    let rt = runtime();
    rt.block_on(bounded(async {
        let (addr, welcomed, server) = welcoming_server_with(&drafter, Some(Duration::from_millis(50))).await;
        let mut cfg = DeviceConfig::new(addr.clone(), vec![1, 5, 9], identity(&drafter));
        cfg.silence_timeout = Duration::from_millis(300);
        cfg.progress_timeout = Duration::from_millis(900);
        cfg.reconnect_for = Duration::from_secs(5);
        let start = std::time::Instant::now();
        let e = run_device(drafter.clone(), cfg.clone()).await.unwrap_err();
        let took = start.elapsed();
        assert!(matches!(e, spin_net::NetError::Stalled { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "stalled: the server sent no plan or verdict for 0.9 s, only keepalives"
        );
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(5),
            "{took:?}"
        );
        // Three silence timeouts' worth of keepalives: the device neither resumed nor gave up on silence.
        assert_eq!(welcomed.load(std::sync::atomic::Ordering::SeqCst), 1);
        for bad in [Duration::ZERO, Duration::MAX] {
            let mut c = cfg.clone();
            c.progress_timeout = bad;
            let e = run_device(drafter.clone(), c).await.unwrap_err();
            assert!(e.to_string().starts_with("progress_timeout:"), "{e}");
        }
        server.abort();
    }))
    .unwrap();
}

/// A server waiting for `--devices 2` with one joined keeps that one alive with `KeepAlive`s past the device's
/// silence timeout: when the second joins, both get their texts.
#[test]
fn a_server_waiting_for_devices_keeps_the_first_alive_past_its_silence_timeout() {
    let target = tiny(1, 2);
    let drafter = tiny(2, 1);
    let rt = runtime();
    let reports = rt
        .block_on(bounded(async {
            let mut cfg = config("best", &target);
            cfg.min_devices = 2;
            cfg.keepalive_every = Duration::from_millis(100);
            let (addr, serving, _stop) = start(cfg, &target, Default::default()).await;
            let device = |prompt: Vec<u32>| {
                let mut dc = DeviceConfig::new(addr.clone(), prompt, identity(&drafter));
                dc.silence_timeout = Duration::from_millis(400);
                dc.reconnect_for = Duration::ZERO;
                tokio::spawn(run_device(drafter.clone(), dc))
            };
            let first = device(vec![1, 5, 9]);
            tokio::time::sleep(Duration::from_millis(1500)).await;
            assert!(!first.is_finished(), "{:?}", first.await);
            let second = device(vec![1, 7]);
            let reports = [first.await.unwrap().unwrap(), second.await.unwrap().unwrap()];
            serving.await.unwrap().unwrap();
            reports
        }))
        .unwrap();
    let greedy = sampling(0.0).unwrap();
    for (r, prompt) in reports.iter().zip([vec![1, 5, 9], vec![1, 7]]) {
        assert_eq!(r.resumes, 0);
        let want = generate_plain(&target, &prompt, &greedy, 12, None, 0).unwrap();
        assert_eq!(r.generated(), want.as_slice());
    }
}

/// A server that answers the `Hello` with `reply` (encoded as given), then holds the connection.
async fn answering_server(reply: ServerMsg) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let mut conn = framed(s, proto::MAX_FRAME_BYTES);
        let _ = recv::<DeviceMsg>(&mut conn, proto::MAX_FRAME_BYTES).await;
        send(&mut conn, &reply).await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    addr
}

/// A hostile server's text reaches the device escaped and bounded: no control character (an ANSI sequence, a
/// newline) survives, ordinary Unicode does, 100 kB are cut to `proto::MAX_PEER_TEXT_CHARS`; a message out of
/// place is named by its kind, not printed whole.
#[test]
fn a_hostile_servers_text_reaches_the_device_escaped_and_bounded() {
    let drafter = tiny(2, 1);
    let rt = runtime();
    rt.block_on(bounded(async {
        let hostile = format!(
            "\u{1b}[2J\u{1b}]0;owned\u{7}é ok\nsecond line\r{}",
            "x".repeat(100_000)
        );
        let device = |addr: String| {
            let mut cfg = DeviceConfig::new(addr, vec![1, 5, 9], identity(&drafter));
            cfg.reconnect_for = Duration::ZERO;
            run_device(drafter.clone(), cfg)
        };
        for reply in [
            ServerMsg::Error {
                code: ErrorCode::Protocol,
                message: hostile.clone(),
            },
            ServerMsg::Shutdown {
                reason: hostile.clone(),
            },
        ] {
            let e = device(answering_server(reply).await).await.unwrap_err();
            let text = e.to_string();
            assert!(!text.chars().any(char::is_control), "{text:?}");
            assert!(
                text.contains(r"\u{1b}[2J\u{1b}]0;owned\u{7}é ok\nsecond line\r"),
                "{text:?}"
            );
            assert!(text.contains("more bytes)"), "{text:?}");
            assert!(
                text.chars().count() < proto::MAX_PEER_TEXT_CHARS + 100,
                "{}",
                text.len()
            );
        }
        let plan = ServerMsg::Verdict {
            round: 0,
            accepted: 0,
            next: Next::Residual {
                p: proto::PackedDist {
                    vocab: 7,
                    q_bits: 8,
                    count: 1,
                    bits: vec![0xaa; 500_000],
                },
            },
        };
        let e = device(answering_server(plan).await).await.unwrap_err();
        assert_eq!(e.to_string(), "protocol: expected Welcome, got Verdict");
    }))
    .unwrap();
}

/// Every refused connection is one operator notice naming the peer's address and port and the reason (a wrong
/// token, a frame that does not decode, a handshake timeout, a full server), and never the token.
#[test]
fn refused_connections_are_one_notice_each_naming_the_peer() {
    let target = tiny(1, 2);
    let vocab = identity(&target).vocab;
    let rt = runtime();
    let notices: Arc<Mutex<Vec<String>>> = Default::default();
    let peers = rt
        .block_on(bounded(async {
            let mut cfg = config("best", &target);
            cfg.device_tokens = vec![b"device-token-0123456789".to_vec()];
            cfg.handshake_timeout = Duration::from_millis(300);
            cfg.max_connections_per_addr = 1;
            cfg.stop_when_done = false;
            let (tx, rx) = watch::channel(false);
            let n = notices.clone();
            let server = Server::bind("127.0.0.1:0", target.clone(), cfg)
                .await
                .unwrap()
                .with_notices(move |t| n.lock().unwrap().push(t.to_string()));
            let addr = server.local_addr().unwrap().to_string();
            let serving = tokio::spawn(server.run(rx, |_| {}));
            // A wrong token.
            let s = connect_from([127, 0, 0, 2], &addr).await.unwrap();
            let wrong = s.local_addr().unwrap();
            let mut c = framed(s, proto::MAX_FRAME_BYTES);
            let mut h = hello(vocab, None);
            if let DeviceMsg::Hello { token, .. } = &mut h {
                *token = b"a-wrong-token-0123456789".to_vec();
            }
            send(&mut c, &h).await.unwrap();
            assert!(matches!(next(&mut c).await, ServerMsg::Error { .. }));
            // A frame that does not decode: variant 0 (Hello) cut after its magic.
            let mut g = connect_from([127, 0, 0, 3], &addr).await.unwrap();
            let garbage = g.local_addr().unwrap();
            g.write_all(&[0, 0, 0, 5, 0, b'M', b'S', b'P', b'N'])
                .await
                .unwrap();
            // Silent past the handshake timeout.
            let silent_conn = connect_from([127, 0, 0, 4], &addr).await.unwrap();
            let silent = silent_conn.local_addr().unwrap();
            // One connection more than the per-address limit.
            let held = connect_from([127, 0, 0, 5], &addr).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            let extra = connect_from([127, 0, 0, 5], &addr).await.unwrap();
            let full = extra.local_addr().unwrap();
            let mut sink = Vec::new();
            let _ = timeout(Duration::from_secs(5), g.read_to_end(&mut sink)).await;
            tokio::time::sleep(Duration::from_millis(600)).await;
            drop((c, silent_conn, held, extra));
            let _ = tx.send(true);
            serving.await.unwrap().unwrap();
            [wrong, garbage, silent, full]
        }))
        .unwrap();
    let notices = notices.lock().unwrap();
    let line = |peer: SocketAddr| {
        let at = format!("refused {peer}: ");
        let lines: Vec<&String> = notices.iter().filter(|l| l.starts_with(&at)).collect();
        assert_eq!(lines.len(), 1, "{peer}: {notices:#?}");
        lines[0].clone()
    };
    assert!(line(peers[0]).contains("unauthorized"), "{notices:#?}");
    let g = line(peers[1]);
    assert!(
        g.contains("frame: DeviceMsg::Hello.") && g.contains("(a 5-byte body)"),
        "{g}"
    );
    assert!(
        line(peers[2]).contains("handshake: no Hello within 0.3 s"),
        "{notices:#?}"
    );
    assert!(line(peers[3]).contains("full:"), "{notices:#?}");
    assert!(
        notices.iter().all(|l| !l.contains("token-0123456789")),
        "{notices:#?}"
    );
}

/// The `Full` refusals from 127.0.0.6 the notices account for: listed one by one, or counted.
fn accounted(notices: &[String]) -> usize {
    notices
        .iter()
        .map(|l| {
            if l.starts_with("refused 127.0.0.6:") && l.contains(": full: ") {
                1
            } else {
                l.strip_prefix("refused ")
                    .and_then(|r| r.split_once(" more connection(s), not listed"))
                    .and_then(|(n, _)| n.parse().ok())
                    .unwrap_or(0)
            }
        })
        .sum()
}

/// A flood of refused connections that stops is counted within a second or two of its end: neither another refusal
/// nor the server stopping is needed for the count of the refusals that were not listed.
#[test]
fn a_flood_of_refusals_is_counted_soon_after_it_stops() {
    let target = tiny(1, 2);
    let rt = runtime();
    let notices: Arc<Mutex<Vec<String>>> = Default::default();
    let (counted_after, flood) = rt
        .block_on(bounded(async {
            let mut cfg = config("best", &target);
            cfg.max_connections_per_addr = 1;
            cfg.handshake_timeout = Duration::from_secs(30);
            cfg.stop_when_done = false;
            let (tx, rx) = watch::channel(false);
            let n = notices.clone();
            let server = Server::bind("127.0.0.1:0", target.clone(), cfg)
                .await
                .unwrap()
                .with_notices(move |t| n.lock().unwrap().push(t.to_string()));
            let addr = server.local_addr().unwrap().to_string();
            let serving = tokio::spawn(server.run(rx, |_| {}));
            // One connection holds the address's only slot; the flood beyond it is refused `Full`, one by one.
            let held = connect_from([127, 0, 0, 6], &addr).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            let flood = spin_net::server::REFUSAL_LINES_PER_S as usize + 15;
            for _ in 0..flood {
                let mut c = connect_from([127, 0, 0, 6], &addr).await.unwrap();
                let mut sink = Vec::new();
                let _ = timeout(Duration::from_secs(5), c.read_to_end(&mut sink)).await;
            }
            let ended = std::time::Instant::now();
            // Every refusal is accounted for once it is listed or counted.
            while accounted(&notices.lock().unwrap()) < flood && ended.elapsed() < Duration::from_secs(5) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let after = ended.elapsed();
            drop(held);
            let _ = tx.send(true);
            serving.await.unwrap().unwrap();
            (after, flood)
        }))
        .unwrap();
    let notices = notices.lock().unwrap();
    assert!(
        counted_after < Duration::from_millis(2500),
        "counted {counted_after:?} after the flood: {notices:#?}"
    );
    assert_eq!(accounted(&notices), flood, "{notices:#?}");
}

/// A notice callback that blocks (stderr into a pipe nobody reads) stalls neither the listener nor the rounds: the
/// refused peers are closed at once, a device gets its text, and the run ends without waiting for the callback
/// for long.
#[test]
fn a_notice_callback_that_blocks_stalls_neither_the_listener_nor_the_rounds() {
    let target = tiny(1, 2);
    let drafter = tiny(2, 1);
    let rt = runtime();
    let rep = rt
        .block_on(bounded(async {
            let mut cfg = config("best", &target);
            cfg.min_devices = 1;
            let (tx, rx) = watch::channel(false);
            let server = Server::bind("127.0.0.1:0", target.clone(), cfg)
                .await
                .unwrap()
                .with_notices(|_| std::thread::sleep(Duration::from_secs(30)));
            let addr = server.local_addr().unwrap().to_string();
            let serving = tokio::spawn(server.run(rx, |_| {}));
            // Refusals, each a notice: frames of no known message, from several addresses.
            for i in 0..8 {
                let mut g = connect_from([127, 0, 0, 20 + i], &addr).await.unwrap();
                g.write_all(&[0, 0, 0, 2, 9, 0]).await.unwrap();
                let mut sink = Vec::new();
                timeout(Duration::from_secs(5), g.read_to_end(&mut sink))
                    .await
                    .expect("a refused peer is closed at once")
                    .unwrap();
            }
            let mut dc = DeviceConfig::new(addr.clone(), vec![1, 5, 9], identity(&drafter));
            dc.handshake_timeout = Duration::from_secs(10);
            let rep = timeout(Duration::from_secs(30), run_device(drafter.clone(), dc))
                .await
                .expect("the device is served")
                .unwrap();
            let ended = std::time::Instant::now();
            serving.await.unwrap().unwrap();
            // The run waits for the blocked callback for a bounded while only.
            assert!(ended.elapsed() < Duration::from_secs(10), "{:?}", ended.elapsed());
            drop(tx);
            rep
        }))
        .unwrap();
    let greedy = sampling(0.0).unwrap();
    let want = generate_plain(&target, &[1, 5, 9], &greedy, 12, None, 0).unwrap();
    assert_eq!(rep.generated(), want.as_slice());
}

/// A model of the tiny models' vocabulary (so the same drafters fit) with a long context, whose passes over a long
/// prompt take a while.
fn long_context(seed: u64, n_layers: usize) -> Arc<Model> {
    let cfg = spin_runtime::Config {
        dim: 128,
        hidden_dim: 256,
        n_layers,
        max_seq_len: 4096,
        ..tiny(seed, 1).config().clone()
    };
    let device = spin_runtime::select_device().unwrap();
    let tensors = model::random_tensors(&cfg, 0.3, seed, &device).unwrap();
    Arc::new(model::model_from_tensors(cfg, tensors, &device).unwrap())
}

/// A device that waits while the server runs a long pass (here the prefill of a second device's long prompt, which
/// takes longer than the first device's silence timeout) hears `KeepAlive`s through it: it neither gives up nor
/// resumes, and both devices get their texts. The timeouts scale with how long the pass takes on this machine.
#[test]
fn a_long_pass_keeps_the_waiting_devices_alive() {
    let target = long_context(1, 4);
    let drafter = long_context(2, 1);
    // The shortest prompt (doubling from 256, at most 3,000 tokens) whose prefill takes 600 ms or more.
    let prompt = |n: usize| -> Vec<u32> { (0..n).map(|i| 1 + (i as u32 * 7) % 23).collect() };
    let mut n = 256;
    let took = loop {
        let t = std::time::Instant::now();
        target.forward(&mut target.new_cache(), &prompt(n)).unwrap();
        let took = t.elapsed();
        if took >= Duration::from_millis(600) || n == 3000 {
            break took;
        }
        n = (2 * n).min(3000);
    };
    let long = prompt(n);
    // At least 200 ms, so that a loaded machine's scheduling delays stay well inside it.
    let silence = (took / 3).max(Duration::from_millis(200));
    let rt = runtime();
    let reports = rt
        .block_on(bounded(async {
            let mut cfg = config("best", &target);
            cfg.min_devices = 2;
            cfg.keepalive_every = silence / 5;
            let (addr, serving, _stop) = start(cfg, &target, Default::default()).await;
            let device = |prompt: Vec<u32>| {
                let mut dc = DeviceConfig::new(addr.clone(), prompt, identity(&drafter));
                dc.silence_timeout = silence;
                dc.reconnect_for = Duration::ZERO;
                tokio::spawn(run_device(drafter.clone(), dc))
            };
            let first = device(vec![1, 5, 9]);
            tokio::time::sleep(silence).await;
            let second = device(long.clone());
            let reports = [first.await.unwrap(), second.await.unwrap()];
            serving.await.unwrap().unwrap();
            reports
        }))
        .unwrap();
    let greedy = sampling(0.0).unwrap();
    for (r, prompt) in reports.iter().zip([vec![1, 5, 9], long]) {
        let r = r.as_ref().unwrap_or_else(|e| {
            panic!("a device gave up during a {took:?} pass with a silence timeout of {silence:?}: {e}")
        });
        assert_eq!(
            r.resumes, 0,
            "a pass of {took:?}, a silence timeout of {silence:?}"
        );
        let want = generate_plain(&target, &prompt, &greedy, 12, None, 0).unwrap();
        assert_eq!(r.generated(), want.as_slice());
    }
}
