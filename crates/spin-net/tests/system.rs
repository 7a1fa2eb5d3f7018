//! The networked system end to end on tiny random-weight models over loopback: greedy text per device equals plain
//! greedy decoding (paper A and paper B exchanges), bits on the air equal spin-core's payload sizes, the virtual
//! clock replays byte for byte, and the fault cases (disconnect and resume, stragglers, hostile frames).

use rand::{RngExt, SeedableRng};
use spin_net::NetError;
use spin_net::controller::Scheme;
use spin_net::device::{DeviceConfig, run_device};
use spin_net::proto::{self, DeviceMsg, ErrorCode, Identity, MAGIC, PROTOCOL_VERSION, ServerMsg};
use spin_net::server::{Clock, Compute, RoundTrace, Server, ServerConfig};
use spin_net::sim::{SimDevice, simulate};
use spin_runtime::Model;
use spin_runtime::model;
use spin_runtime::speculative::{generate_plain, sampling};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

fn tiny(seed: u64, std: f64, n_layers: usize) -> Model {
    let device = spin_runtime::select_device().unwrap();
    model::tiny_random_model(seed, std, n_layers, &device).unwrap()
}

fn identity(m: &Model) -> Identity {
    Identity {
        vocab: m.config().vocab_size as u32,
        tokenizer: 7,
        model: 0,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn prompts() -> Vec<Vec<u32>> {
    vec![vec![1, 5, 9], vec![1], vec![1, 7, 7, 7, 3], vec![1, 4]]
}

fn run(
    target: &Arc<Model>,
    drafter: &Arc<Model>,
    cfg: ServerConfig,
    devices: &[SimDevice],
) -> (spin_net::sim::SimOutcome, Vec<RoundTrace>) {
    let rt = runtime();
    let (_tx, rx) = watch::channel(false);
    let mut traces = Vec::new();
    let out = rt
        .block_on(simulate(
            target.clone(),
            drafter.clone(),
            identity(drafter),
            cfg,
            devices,
            rx,
            |t| traces.push(t.clone()),
        ))
        .unwrap();
    (out, traces)
}

fn sim_devices() -> Vec<SimDevice> {
    prompts()
        .into_iter()
        .map(|prompt| SimDevice {
            prompt,
            ..Default::default()
        })
        .collect()
}

#[test]
fn greedy_text_over_the_network_equals_plain_decoding_in_both_exchanges() {
    let target = Arc::new(tiny(1, 0.3, 3));
    let drafter = Arc::new(tiny(2, 0.3, 2));
    let greedy = sampling(0.0).unwrap();
    for scheme in ["exact", "fixed", "best", "greedy"] {
        let mut cfg = ServerConfig::new(Scheme::parse_per_round(scheme).unwrap(), identity(&target));
        cfg.max_new_tokens = 20;
        cfg.max_draft_len = 5;
        cfg.saa_samples = 32;
        let (out, traces) = run(&target, &drafter, cfg, &sim_devices());
        for (k, p) in prompts().iter().enumerate() {
            let want = generate_plain(&target, p, &greedy, 20, None, 0).unwrap();
            assert_eq!(
                out.summary.devices[k].generated, want,
                "{scheme}: device {k} (server)"
            );
            let rep = out.devices[k].as_ref().unwrap();
            assert_eq!(rep.generated(), want.as_slice(), "{scheme}: device {k} (device)");
        }
        assert_eq!(out.summary.tokens, 80);
        assert_eq!(traces.iter().map(|t| t.tokens).sum::<u64>(), 80, "{scheme}");
        // The virtual clock does not charge planning and records no wall time of it.
        assert!(traces.iter().all(|t| t.plan_s.is_none()), "{scheme}");
        assert!(out.summary.elapsed_s > 0.0);
    }
}

/// Prompt lookup on every device, and in Cen-SPIN's server drafting: the drafts change, the greedy text does not.
#[test]
fn greedy_text_with_prompt_lookup_on_the_devices_equals_plain_decoding() {
    let target = Arc::new(tiny(1, 0.3, 3));
    let drafter = Arc::new(tiny(2, 0.3, 2));
    let greedy = sampling(0.0).unwrap();
    let lookup = Some(spin_runtime::drafter::Lookup {
        ngram: 3,
        weight: 0.5,
    });
    let devices: Vec<SimDevice> = prompts()
        .into_iter()
        .map(|prompt| SimDevice {
            prompt,
            lookup,
            ..Default::default()
        })
        .collect();
    let want: Vec<Vec<u32>> = prompts()
        .iter()
        .map(|p| generate_plain(&target, p, &greedy, 20, None, 0).unwrap())
        .collect();
    for scheme in ["fixed", "exact"] {
        let (out, _) = run(&target, &drafter, config(scheme, &target), &devices);
        for (k, w) in want.iter().enumerate() {
            assert_eq!(&out.summary.devices[k].generated, w, "{scheme}: device {k}");
        }
    }
    let prompts = prompts();
    let summary = spin_net::baselines::cen_spin(
        target.clone(),
        drafter.clone(),
        lookup,
        &config("fixed", &target),
        &prompts,
        &|| false,
        |_| (),
    )
    .unwrap();
    for (k, w) in want.iter().enumerate() {
        assert_eq!(&summary.devices[k].generated, w, "cen-spin: device {k}");
    }
}

fn config(scheme: &str, target: &Model) -> ServerConfig {
    let mut cfg = ServerConfig::new(Scheme::parse_per_round(scheme).unwrap(), identity(target));
    cfg.max_new_tokens = 20;
    cfg.max_draft_len = 5;
    cfg.saa_samples = 32;
    cfg
}

#[test]
fn bits_on_the_air_are_spin_cores_payload_sizes() {
    let target = Arc::new(tiny(1, 0.6, 3));
    let drafter = Arc::new(tiny(2, 0.6, 1));
    // V = 24: ⌈log₂V⌉ = 5; V_eff is capped at V, so Q_tok = D = 24·(5 + 16) = 504 bits.
    let q_tok = 24 * (5 + 16);
    let (_, traces) = run(&target, &drafter, config("exact", &target), &sim_devices());
    let mut drafted = 0;
    for t in traces.iter().flat_map(|r| &r.devices) {
        assert_eq!(t.mode, "server");
        assert_eq!(t.bits_up, u64::from(t.draft_len) * q_tok, "{t:?}");
        // The frame carries the packed payload plus a small header.
        assert!(
            t.wire_up_bytes * 8 >= t.bits_up
                && t.wire_up_bytes * 8 <= t.bits_up + 8 * (24 + 8 * u64::from(t.draft_len))
        );
        drafted += t.draft_len;
    }
    assert!(drafted > 0);
    let mut cfg = config("best", &target);
    cfg.modes = spin_optimize::paper_b::ModeScheme::Random;
    let (_, traces) = run(&target, &drafter, cfg, &sim_devices());
    let (mut ul, mut dl) = (0, 0);
    for t in traces.iter().flat_map(|r| &r.devices) {
        let pairs = u64::from(t.draft_len) * (5 + 32);
        match t.mode.name() {
            "ul" => {
                ul += 1;
                assert_eq!((t.bits_up, t.bits_down), (pairs + q_tok, 0), "{t:?}");
                assert!(t.air_corr_s > 0.0);
            }
            "dl" => {
                dl += 1;
                assert_eq!((t.bits_up, t.bits_down), (pairs, q_tok), "{t:?}");
                assert!(t.air_corr_s > 0.0);
            }
            "server" => assert_eq!((t.bits_up, t.bits_down), (pairs, 0), "{t:?}"),
            other => panic!("mode {other}"),
        }
    }
    assert!(
        ul > 0 && dl > 0,
        "random modes use both directions ({ul} UL, {dl} DL)"
    );
}

/// At temperature 0 with `greedy_payload` every scheme's devices send (token, probability) pairs and the server
/// corrects every rejection itself: nothing but the pairs goes on the air, no round spends correction time, and
/// every device still gets plain greedy decoding's text.
#[test]
fn greedy_payload_sends_pairs_and_exchanges_nothing() {
    let target = Arc::new(tiny(1, 0.6, 3));
    let drafter = Arc::new(tiny(2, 0.6, 1));
    let greedy = sampling(0.0).unwrap();
    let (mut drafted, mut rejected) = (0, 0);
    for scheme in ["exact", "fixed", "best", "unified"] {
        let cfg = ServerConfig {
            greedy_payload: true,
            ..config(scheme, &target)
        };
        let (out, traces) = run(&target, &drafter, cfg, &sim_devices());
        for (k, p) in prompts().iter().enumerate() {
            let want = generate_plain(&target, p, &greedy, 20, None, 0).unwrap();
            assert_eq!(out.summary.devices[k].generated, want, "{scheme}: device {k}");
        }
        for r in &traces {
            assert_eq!(r.correction_s, 0.0, "{scheme}: round {}", r.round);
            for t in &r.devices {
                // V = 24: ⌈log₂V⌉ + 32 = 37 bits a pair.
                assert_eq!(t.payload.name(), "pairs", "{scheme}: {t:?}");
                assert_eq!(t.mode.name(), "server", "{scheme}: {t:?}");
                assert_eq!(
                    (t.bits_up, t.bits_down),
                    (u64::from(t.draft_len) * 37, 0),
                    "{scheme}: {t:?}"
                );
                assert_eq!(t.air_corr_s, 0.0);
                drafted += t.draft_len;
                rejected += u32::from(t.accepted < t.draft_len);
            }
        }
    }
    assert!(
        drafted > 0 && rejected > 0,
        "{drafted} drafted, {rejected} rounds with a rejection"
    );
}

#[test]
fn unified_plans_each_devices_payload_and_keeps_the_greedy_text() {
    let target = Arc::new(tiny(1, 0.6, 3));
    let drafter = Arc::new(tiny(2, 0.6, 1));
    let greedy = sampling(0.0).unwrap();
    let q_tok = 24 * (5 + 16);
    let (out, traces) = run(&target, &drafter, config("unified", &target), &sim_devices());
    assert_eq!(out.summary.scheme, "unified");
    for (k, p) in prompts().iter().enumerate() {
        let want = generate_plain(&target, p, &greedy, 20, None, 0).unwrap();
        assert_eq!(out.summary.devices[k].generated, want, "device {k}");
    }
    assert!(
        traces
            .iter()
            .all(|t| t.scheme == "unified" && t.predicted_goodput > 0.0)
    );
    for t in traces.iter().flat_map(|r| &r.devices) {
        let pairs = u64::from(t.draft_len) * (5 + 32);
        match (t.payload.name(), t.mode.name()) {
            // Distributions up: the server corrects on its own, nothing is exchanged afterwards.
            ("distributions", "server") => {
                assert_eq!((t.bits_up, t.bits_down), (u64::from(t.draft_len) * q_tok, 0))
            }
            ("pairs", "server") => assert_eq!((t.bits_up, t.bits_down), (pairs, 0), "{t:?}"),
            ("pairs", "ul") => assert_eq!((t.bits_up, t.bits_down), (pairs + q_tok, 0), "{t:?}"),
            ("pairs", "dl") => assert_eq!((t.bits_up, t.bits_down), (pairs, q_tok), "{t:?}"),
            other => panic!("payload and mode {other:?}: {t:?}"),
        }
        let share_sum: f64 = traces[0].devices.iter().map(|d| d.uplink_share_hz).sum();
        assert!(share_sum <= 10e6 * (1.0 + 1e-9), "the uplink shares fit the band");
    }
}

#[test]
fn virtual_clock_replays_byte_for_byte() {
    let target = Arc::new(tiny(3, 0.6, 2));
    let drafter = Arc::new(tiny(4, 0.6, 1));
    let go = |seed: u64, temperature: f64| {
        let mut cfg = config("greedy", &target);
        cfg.seed = seed;
        cfg.temperature = temperature;
        let (out, traces) = run(&target, &drafter, cfg, &sim_devices());
        (
            serde_json::to_string(&traces).unwrap(),
            serde_json::to_string(&out.summary).unwrap(),
        )
    };
    let a = go(5, 1.0);
    assert_eq!(a, go(5, 1.0));
    assert_ne!(a.0, go(6, 1.0).0);
}

#[test]
fn a_device_that_disconnects_mid_round_resumes_and_ends_with_the_same_text() {
    let target = Arc::new(tiny(1, 0.3, 3));
    let drafter = Arc::new(tiny(2, 0.3, 2));
    let greedy = sampling(0.0).unwrap();
    for scheme in ["exact", "best"] {
        let mut devices = sim_devices();
        devices[2].disconnect_at_round = Some(1);
        devices[0].disconnect_at_round = Some(0);
        let (out, traces) = run(&target, &drafter, config(scheme, &target), &devices);
        for (k, p) in prompts().iter().enumerate() {
            let want = generate_plain(&target, p, &greedy, 20, None, 0).unwrap();
            let rep = out.devices[k].as_ref().unwrap();
            assert_eq!(rep.generated(), want.as_slice(), "{scheme}: device {k}");
        }
        assert_eq!(out.devices[0].as_ref().unwrap().resumes, 1);
        assert_eq!(out.devices[2].as_ref().unwrap().resumes, 1);
        assert_eq!(traces.iter().map(|t| t.tokens).sum::<u64>(), 80, "{scheme}");
    }
}

/// The summary carries the T_ver(K, L) the planner ended with: a profile's as given, and under measured compute the
/// fit over the start-up calibration's and the rounds' timed passes (every term finite and ≥ 0).
#[test]
fn a_run_reports_the_verification_model_it_planned_with() {
    let target = Arc::new(tiny(1, 0.3, 3));
    let drafter = Arc::new(tiny(2, 0.3, 2));
    let cfg = config("exact", &target);
    let profile = cfg.compute.profile_verify().unwrap();
    let (out, _) = run(&target, &drafter, cfg.clone(), &sim_devices());
    assert_eq!(out.summary.verify_model, Some(profile));
    let mut measured = cfg;
    measured.compute = Compute::Measured;
    measured.max_new_tokens = 8;
    let (out, traces) = run(&target, &drafter, measured, &sim_devices());
    let m = out.summary.verify_model.expect("a fitted model");
    for v in [m.fixed_s, m.per_device_s, m.per_draft_token_s] {
        assert!(v.is_finite() && v >= 0.0, "{m:?}");
    }
    assert!(m.seconds(4, 0) > 0.0, "{m:?}");
    assert_eq!(traces.iter().map(|t| t.tokens).sum::<u64>(), 32);
}

#[test]
fn a_straggler_is_dropped_for_the_round_and_stays_in_the_session() {
    let target = Arc::new(tiny(1, 0.3, 3));
    let drafter = Arc::new(tiny(2, 0.3, 2));
    let mut cfg = config("fixed", &target);
    cfg.clock = Clock::Real;
    cfg.compute = Compute::Measured;
    cfg.round_deadline_s = 0.4;
    cfg.max_rounds = Some(3);
    let mut devices = sim_devices();
    devices[1].delay = Some(Duration::from_millis(900));
    let (out, traces) = run(&target, &drafter, cfg, &devices);
    assert_eq!(traces.len(), 3);
    assert_eq!(out.summary.devices[1].dropped, 3, "{:?}", out.summary.devices[1]);
    assert_eq!(out.summary.devices[1].tokens, 0);
    for k in [0, 2, 3] {
        assert_eq!(out.summary.devices[k].dropped, 0);
        assert!(out.summary.devices[k].tokens >= 3, "device {k} advanced");
    }
    for t in &traces {
        assert_eq!(t.devices[1].mode, "dropped");
        // The real clock records the planning's wall time (a tiny round plans in well under the round).
        assert!(
            t.plan_s.is_some_and(|s| (0.0..0.4).contains(&s)),
            "{:?}",
            t.plan_s
        );
    }
    // The run ended at the round limit: every device is told so, the straggler included.
    assert!(
        out.devices[1].as_ref().unwrap_err().contains("shut down"),
        "{:?}",
        out.devices[1]
    );
}

/// On the real clock the run's time starts with its first round: a wait for the last device to join is not
/// charged to the goodput (it was, when the clock started with the server).
#[test]
fn the_real_clock_does_not_count_the_wait_for_devices_to_join() {
    let target = Arc::new(tiny(1, 0.3, 3));
    let drafter = Arc::new(tiny(2, 0.3, 2));
    let mut cfg = config("fixed", &target);
    cfg.clock = Clock::Real;
    cfg.compute = Compute::Measured;
    cfg.min_devices = 2;
    cfg.max_new_tokens = 4;
    let (_tx, rx) = watch::channel(false);
    let rt = runtime();
    let (summary, first_clock) = rt.block_on(async {
        let server = Server::bind("127.0.0.1:0", target.clone(), cfg).await.unwrap();
        let addr = server.local_addr().unwrap().to_string();
        let first = Arc::new(std::sync::Mutex::new(None));
        let seen = first.clone();
        let serving = tokio::spawn(server.run(rx, move |t| {
            seen.lock().unwrap().get_or_insert(t.clock_s);
        }));
        let early = tokio::spawn(run_device(
            drafter.clone(),
            DeviceConfig::new(addr.clone(), prompts()[0].clone(), identity(&drafter)),
        ));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let late = tokio::spawn(run_device(
            drafter.clone(),
            DeviceConfig::new(addr, prompts()[1].clone(), identity(&drafter)),
        ));
        early.await.unwrap().unwrap();
        late.await.unwrap().unwrap();
        let summary = serving.await.unwrap().unwrap();
        let first_clock = first.lock().unwrap().unwrap();
        (summary, first_clock)
    });
    assert_eq!(summary.tokens, 8);
    assert!(first_clock < 1.0, "the first round ended at {first_clock} s");
    assert!(summary.elapsed_s < 1.4, "the run took {} s", summary.elapsed_s);
}

#[test]
fn shutdown_ends_the_run_and_the_trace_is_complete() {
    let target = Arc::new(tiny(1, 0.3, 3));
    let drafter = Arc::new(tiny(2, 0.3, 2));
    let rt = runtime();
    let (tx, rx) = watch::channel(false);
    let mut traces = Vec::new();
    let mut cfg = config("fixed", &target);
    cfg.max_new_tokens = 80;
    let out = rt
        .block_on(simulate(
            target.clone(),
            drafter.clone(),
            identity(&drafter),
            cfg,
            &sim_devices(),
            rx,
            |t| {
                traces.push(t.clone());
                if t.round == 1 {
                    let _ = tx.send(true);
                }
            },
        ))
        .unwrap();
    assert_eq!(out.summary.stopped, "shutdown");
    assert_eq!(traces.len(), 2);
    assert_eq!(out.summary.tokens, traces.iter().map(|t| t.tokens).sum::<u64>());
    for d in &out.devices {
        assert!(d.as_ref().unwrap_err().contains("shut down"), "{d:?}");
    }
}

async fn raw_hello(addr: &str, hello: &DeviceMsg) -> ServerMsg {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut conn = spin_net::wire::framed(stream, proto::MAX_FRAME_BYTES);
    spin_net::wire::send(&mut conn, hello).await.unwrap();
    spin_net::wire::recv::<ServerMsg>(&mut conn, proto::MAX_FRAME_BYTES)
        .await
        .unwrap()
        .0
}

fn hello(vocab: u32, version: u16, resume: Option<proto::Resume>) -> DeviceMsg {
    DeviceMsg::Hello {
        magic: MAGIC,
        version,
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

/// Sends raw bytes and reads what comes back until the server closes (bounded in time).
async fn raw_bytes(addr: &str, bytes: &[u8], close_write: bool) -> Vec<u8> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(bytes).await;
    if close_write {
        let _ = s.shutdown().await;
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    out
}

fn error_code(reply: &[u8]) -> Option<ErrorCode> {
    let len = u32::from_be_bytes(reply.get(..4)?.try_into().ok()?) as usize;
    match proto::decode::<ServerMsg>(reply.get(4..4 + len)?).ok()? {
        ServerMsg::Error { code, .. } => Some(code),
        _ => None,
    }
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

#[test]
fn hostile_peers_are_refused_while_four_devices_generate_their_text() {
    let target = Arc::new(tiny(1, 0.3, 3));
    let drafter = Arc::new(tiny(2, 0.3, 2));
    let greedy = sampling(0.0).unwrap();
    let rt = runtime();
    let mut cfg = config("best", &target);
    cfg.min_devices = 4;
    cfg.max_devices = 64;
    cfg.resume_window = Duration::from_millis(300);
    let (_tx, rx) = watch::channel(false);
    let (summary, reports, refusals) = rt.block_on(async {
        let server = Server::bind("127.0.0.1:0", target.clone(), cfg).await.unwrap();
        let addr = server.local_addr().unwrap().to_string();
        let serving = tokio::spawn(server.run(rx, |_| {}));
        let devices: Vec<_> = prompts()
            .into_iter()
            .map(|p| {
                tokio::spawn(run_device(
                    drafter.clone(),
                    DeviceConfig::new(addr.clone(), p, identity(&drafter)),
                ))
            })
            .collect();
        // Handshake refusals, each answered with its code.
        let mut refusals = Vec::new();
        for (h, want) in [
            (hello(25, PROTOCOL_VERSION, None), ErrorCode::Mismatch),
            (hello(24, PROTOCOL_VERSION + 1, None), ErrorCode::Version),
            (
                hello(
                    24,
                    PROTOCOL_VERSION,
                    Some(proto::Resume {
                        session: 12345,
                        secret: [0; 16],
                    }),
                ),
                ErrorCode::UnknownSession,
            ),
        ] {
            match raw_hello(&addr, &h).await {
                ServerMsg::Error { code, message } => {
                    assert_eq!(code, want, "{message}");
                    refusals.push(message);
                }
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        // Oversized, truncated, malformed and out-of-order frames.
        let too_big = ((proto::MAX_FRAME_BYTES + 1) as u32).to_be_bytes();
        assert_eq!(
            error_code(&raw_bytes(&addr, &too_big, false).await),
            Some(ErrorCode::TooLarge)
        );
        let mut cut = 100u32.to_be_bytes().to_vec();
        cut.extend_from_slice(&[0; 10]);
        assert_eq!(
            error_code(&raw_bytes(&addr, &cut, true).await),
            Some(ErrorCode::Malformed)
        );
        assert_eq!(
            error_code(&raw_bytes(&addr, &frame(&[0xff; 7]), false).await),
            Some(ErrorCode::Malformed)
        );
        let draft = proto::encode(&DeviceMsg::Bye).unwrap();
        assert_eq!(
            error_code(&raw_bytes(&addr, &frame(&draft), false).await),
            Some(ErrorCode::Protocol)
        );
        // Thousands of random and mutated frames.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(99);
        let valid: Vec<Vec<u8>> = vec![
            proto::encode(&hello(24, PROTOCOL_VERSION, None)).unwrap(),
            proto::encode(&DeviceMsg::Draft {
                round: 0,
                tokens: vec![1, 2],
                probs: vec![0.5, 0.5],
                dists: vec![],
                draft_s: 0.0,
            })
            .unwrap(),
        ];
        let mut sent = 0;
        for i in 0..250 {
            let mut bytes = Vec::new();
            for _ in 0..8 {
                let body: Vec<u8> = if i % 2 == 0 {
                    let n = rng.random_range(0..40);
                    (0..n).map(|_| rng.random::<u8>()).collect()
                } else {
                    let mut b = valid[rng.random_range(0..valid.len())].clone();
                    for _ in 0..rng.random_range(1..4) {
                        let at = rng.random_range(0..b.len());
                        b[at] = rng.random();
                    }
                    b
                };
                bytes.extend_from_slice(&frame(&body));
                sent += 1;
            }
            raw_bytes(&addr, &bytes, true).await;
        }
        assert_eq!(sent, 2000);
        let mut reports = Vec::new();
        for d in devices {
            reports.push(d.await.unwrap().unwrap());
        }
        let summary = serving.await.unwrap().unwrap();
        (summary, reports, refusals)
    });
    for (k, p) in prompts().iter().enumerate() {
        let want = generate_plain(&target, p, &greedy, 20, None, 0).unwrap();
        let rep = reports
            .iter()
            .find(|r| r.tokens[..r.prompt_len] == p[..])
            .unwrap();
        assert_eq!(rep.generated(), want.as_slice(), "device {k}");
    }
    assert!(summary.devices.len() >= 4);
    assert!(refusals[0].starts_with("vocab:"), "{}", refusals[0]);
    assert!(refusals[1].starts_with("version:"), "{}", refusals[1]);
}

#[test]
fn a_device_with_another_vocabulary_is_refused_with_a_clear_error() {
    let target = Arc::new(tiny(1, 0.3, 3));
    let rt = runtime();
    let mut cfg = config("fixed", &target);
    cfg.max_rounds = Some(0);
    let (_tx, rx) = watch::channel(false);
    let err = rt.block_on(async {
        let server = Server::bind("127.0.0.1:0", target.clone(), cfg).await.unwrap();
        let addr = server.local_addr().unwrap().to_string();
        let serving = tokio::spawn(server.run(rx, |_| {}));
        let mut id = identity(&target);
        id.tokenizer = 8;
        let e = run_device(target.clone(), DeviceConfig::new(addr, vec![1], id))
            .await
            .unwrap_err();
        serving.abort();
        e
    });
    match err {
        NetError::Refused { code, message } => {
            assert_eq!(code, ErrorCode::Mismatch);
            assert!(message.starts_with("tokenizer:"), "{message}");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn stories260k_eight_devices_produce_the_known_greedy_text() {
    let Some(d) = std::env::var_os("MULTISPIN_SHARED_DATA") else {
        real_model_marker(false);
        return;
    };
    real_model_marker(true);
    let dir = std::path::PathBuf::from(d).join("models/stories260K");
    assert!(
        dir.join("stories260K.bin").is_file() && dir.join("tok512.bin").is_file(),
        "MULTISPIN_SHARED_DATA is set but stories260K.bin or tok512.bin is missing"
    );
    let device = spin_runtime::select_device().unwrap();
    let target = spin_runtime::llama2c::load_checkpoint(&dir.join("stories260K.bin"), &device).unwrap();
    let tok = spin_runtime::llama2c::Llama2cTokenizer::load(&dir.join("tok512.bin"), 512).unwrap();
    let drafter = Arc::new(target.first_layers(2).unwrap());
    let target = Arc::new(target);
    let texts = ["Once upon a time", "The dog", "Lily and Ben", "One day"];
    let devices: Vec<SimDevice> = (0..8)
        .map(|k| SimDevice {
            prompt: tok.encode(texts[k % texts.len()], true),
            ..Default::default()
        })
        .collect();
    let greedy = sampling(0.0).unwrap();
    for scheme in ["exact", "best"] {
        let mut cfg = config(scheme, &target);
        cfg.max_new_tokens = 24;
        let (out, _) = run(&target, &drafter, cfg, &devices);
        for (k, d) in devices.iter().enumerate() {
            let want = generate_plain(&target, &d.prompt, &greedy, 24, None, 0).unwrap();
            assert_eq!(out.summary.devices[k].generated, want, "{scheme}: device {k}");
        }
        let mut all = devices[0].prompt.clone();
        all.extend_from_slice(&out.summary.devices[0].generated);
        let text = tok.decode(&all);
        assert!(
            text.starts_with("Once upon a time, there was a little girl named Lily."),
            "{text:?}"
        );
        println!(
            "{scheme}: {:.1} tokens/s on the virtual clock",
            out.summary.goodput
        );
    }
}

/// Says on the uncaptured stderr whether this real-model test runs or skips, so a plain `cargo test` shows it
/// (`.ci/run` counts these lines).
fn real_model_marker(ran: bool) {
    use std::io::Write as _;
    let name = std::thread::current().name().unwrap_or("?").to_owned();
    let what = if ran {
        "ran"
    } else {
        "skipped (MULTISPIN_SHARED_DATA unset)"
    };
    // One write of the whole line: a line written in pieces interleaves with the harness's own lines.
    let _ = std::io::stderr().write_all(format!("real-model test {name}: {what}\n").as_bytes());
}

/// A draft with a restricted head (a compact vocabulary of its own, distributions over the target's) drafts over the
/// network, its identity being the target's vocabulary, and the texts equal plain greedy decoding; a device that
/// cannot join (here: an identity naming another vocabulary) ends the simulation with its error at once, where the
/// server used to wait for it forever.
#[test]
fn a_restricted_head_draft_joins_and_a_device_that_cannot_join_ends_the_run() {
    use spin_runtime::head_vocab::HeadVocab;
    let target = Arc::new(tiny(1, 0.3, 3));
    let vocab = target.config().vocab_size;
    let head: Vec<u32> = (0..vocab as u32).step_by(2).collect();
    let cfg = spin_runtime::Config {
        vocab_size: head.len() + 1,
        n_layers: 1,
        ..target.config().clone()
    };
    let w = model::random_tensors(&cfg, 0.3, 4, &spin_runtime::select_device().unwrap()).unwrap();
    let drafter = model::model_from_tensors(cfg, w, &spin_runtime::select_device().unwrap())
        .unwrap()
        .with_head_vocab(HeadVocab::new(head, vocab).unwrap())
        .unwrap();
    let drafter = Arc::new(drafter);
    let ident = Identity {
        vocab: vocab as u32,
        tokenizer: 7,
        model: 0,
    };
    let devices = sim_devices();
    let rt = runtime();
    let (_tx, rx) = watch::channel(false);
    let mut scfg = config("exact", &target);
    scfg.max_new_tokens = 6;
    let out = rt
        .block_on(simulate(
            target.clone(),
            drafter.clone(),
            ident,
            scfg.clone(),
            &devices,
            rx,
            |_| (),
        ))
        .unwrap();
    let greedy = sampling(0.0).unwrap();
    for (d, r) in devices.iter().zip(&out.devices) {
        let r = r.as_ref().unwrap();
        let plain = generate_plain(&target, &d.prompt, &greedy, 6, None, 0).unwrap();
        assert_eq!(&r.tokens[r.prompt_len..], plain.as_slice());
    }
    let wrong = Identity {
        vocab: vocab as u32 + 1,
        ..ident
    };
    let (_tx, rx) = watch::channel(false);
    let run = simulate(target, drafter, wrong, scfg, &devices, rx, |_| ());
    let res = rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), run).await });
    let err = res
        .expect("the simulation waited for a device that had failed")
        .unwrap_err()
        .to_string();
    // Every device names the wrong vocabulary; whichever is refused first ends the run (devices[1] came first in
    // one CI run), so the message may name any of them.
    assert!(
        err.contains("devices[") && err.contains("identity.vocab"),
        "{err}"
    );
}

/// A server made from a socket its caller bound beforehand (`serve` binds before the target loads) answers the
/// device that connected before the server existed: the connection waited in the socket's backlog, where a probe
/// that closed and a second bind would have refused it (or let another process take the port meanwhile).
#[test]
fn a_server_on_a_socket_bound_beforehand_answers_a_device_that_came_early() {
    let target = Arc::new(tiny(1, 0.3, 3));
    let drafter = tiny(2, 0.3, 2);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let rt = runtime();
    let (tx, rx) = watch::channel(false);
    let reply = rt.block_on(async {
        let early = tokio::spawn({
            let addr = addr.clone();
            let vocab = drafter.config().vocab_size as u32;
            async move { raw_hello(&addr, &hello(vocab, PROTOCOL_VERSION, None)).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let server = Server::from_std(listener, target.clone(), config("best", &target)).unwrap();
        assert_eq!(server.local_addr().unwrap().to_string(), addr);
        let serving = tokio::spawn(server.run(rx, |_| {}));
        let reply = tokio::time::timeout(Duration::from_secs(10), early)
            .await
            .unwrap()
            .unwrap();
        tx.send(true).unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(10), serving).await;
        reply
    });
    assert!(matches!(reply, ServerMsg::Welcome { .. }), "{reply:?}");
}
