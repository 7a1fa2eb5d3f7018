//! A bounded loopback load test of the edge server (docs/system.md §"Load"): K tiny-model devices in this process
//! on 127.0.0.1, optionally with a hostile client flooding from 127.0.0.2 in parallel (Hello+close, idle
//! connections, garbage frames), until every device has its tokens. Prints rounds per second, the round's
//! overhead at p50/p99 (its wall time minus the measured verification forward, and on the real clock minus the
//! draft, air and correction waits too; the devices share this process's cores, so on the virtual clock their
//! drafting is in it), the process's peak RSS (server and devices) and what the flood got. `cargo run -p spin-net --example load -- 256 virtual flood` (devices, clock, `flood` or `quiet`).

use spin_net::controller::Scheme;
use spin_net::device::{DeviceConfig, run_device};
use spin_net::proto::{self, DeviceMsg, Identity, MAGIC, PROTOCOL_VERSION};
use spin_net::server::{Clock, Compute, Server, ServerConfig};
use spin_runtime::model;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpSocket;
use tokio::sync::watch;

/// Peak resident set of this process in MiB (Linux `VmHWM`).
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// What the flood did: attempts, and replies that were refusals.
#[derive(Default)]
struct Flood {
    attempts: AtomicU64,
    refused: AtomicU64,
}

async fn flood(addr: SocketAddr, stop: Arc<AtomicBool>, stats: Arc<Flood>, vocab: u32) {
    let hello = proto::encode(&DeviceMsg::Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        identity: Identity {
            vocab,
            tokenizer: 7,
            model: 0,
        },
        resume: None,
        prompt: vec![1, 2],
        distance_m: None,
        token: vec![],
    })
    .unwrap_or_default();
    let mut frame = (hello.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&hello);
    let mut idle = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        stats.attempts.fetch_add(1, Ordering::Relaxed);
        let Ok(s) = TcpSocket::new_v4() else { continue };
        if s.bind(SocketAddr::from(([127, 0, 0, 2], 0))).is_err() {
            continue;
        }
        let Ok(Ok(mut c)) = tokio::time::timeout(Duration::from_millis(200), s.connect(addr)).await else {
            continue;
        };
        match i % 3 {
            // Hello, read the answer, close.
            0 => {
                let _ = c.write_all(&frame).await;
                let mut buf = [0u8; 64];
                if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(200), c.readable())
                    .await
                    .map(|_| c.try_read(&mut buf))
                    && n > 4
                    && matches!(
                        proto::decode::<proto::ServerMsg>(&buf[4..n]),
                        Ok(proto::ServerMsg::Error { .. })
                    )
                {
                    stats.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
            // Garbage.
            1 => {
                let _ = c.write_all(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]).await;
            }
            // Idle, held open (the handshake timeout closes them).
            _ => {
                idle.push(c);
                if idle.len() > 200 {
                    idle.remove(0);
                }
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let k: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(256);
    let clock = match args.get(1).map(String::as_str) {
        Some("real") => Clock::Real,
        _ => Clock::Virtual,
    };
    let hostile = args.get(2).is_some_and(|a| a == "flood");
    let device = spin_runtime::select_device().expect("a compute device");
    let target = Arc::new(model::tiny_random_model(1, 0.3, 2, &device).expect("target"));
    let drafter = Arc::new(model::tiny_random_model(2, 0.3, 1, &device).expect("drafter"));
    let id = Identity {
        vocab: target.config().vocab_size as u32,
        tokenizer: 7,
        model: 0,
    };
    let mut cfg = ServerConfig::new(Scheme::parse_per_round("fixed").expect("scheme"), id);
    cfg.max_new_tokens = 16;
    cfg.max_draft_len = 4;
    cfg.clock = clock;
    cfg.compute = Compute::Measured;
    cfg.min_devices = k;
    cfg.max_devices = k + 16;
    cfg.max_pending = k + 64;
    cfg.max_connections = k + 512;
    cfg.max_rounds = Some(200);
    cfg.handshake_timeout = Duration::from_secs(2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let walls: Arc<Mutex<Vec<(f64, f64)>>> = Default::default();
    let w = walls.clone();
    let w_round = walls.clone();
    let started = Instant::now();
    let (rounds, elapsed, ok, stats) = rt.block_on(async move {
        let (_tx, rx) = watch::channel(false);
        let server = Server::bind("127.0.0.1:0", target.clone(), cfg)
            .await
            .expect("bind");
        let addr = server.local_addr().expect("addr");
        let mut last = None::<Instant>;
        let serving = tokio::spawn(server.run(rx, move |t| {
            let now = Instant::now();
            let prev = last.unwrap_or(started);
            // The time the round spent outside the server's own work: the measured verification forward, and on the
            // real clock also the waits for the drafts and the air (emulated) and the correction exchange.
            let outside = match clock {
                Clock::Virtual => t.verify_s,
                Clock::Real => t.draft_up_s + t.verify_s + t.correction_s,
            };
            w_round
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(((now - prev).as_secs_f64(), outside));
            last = Some(now);
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Flood::default());
        let mut handles = Vec::new();
        for j in 0..k {
            let prompt = vec![1, 1 + (j % 20) as u32, 3];
            let mut dc = DeviceConfig::new(addr.to_string(), prompt, id);
            dc.reconnect_for = Duration::ZERO;
            // Eight devices per host address (127.1.x.y), within the per-address limits' defaults.
            let host = j / 8;
            dc.local_addr = Some(std::net::IpAddr::from([
                127,
                1,
                (host / 250) as u8,
                (host % 250 + 1) as u8,
            ]));
            handles.push(tokio::spawn(run_device(drafter.clone(), dc)));
        }
        // The flood starts with the rounds (its sessions must not stand in for the devices the first round waits for).
        while w.lock().unwrap_or_else(|p| p.into_inner()).is_empty() && !serving.is_finished() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let flooder = hostile.then(|| tokio::spawn(flood(addr, stop.clone(), stats.clone(), id.vocab)));
        let mut ok = 0;
        for h in handles {
            if matches!(h.await, Ok(Ok(r)) if r.generated().len() == 16) {
                ok += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        if let Some(f) = flooder {
            let _ = f.await;
        }
        let summary = serving.await.expect("server task").expect("server");
        (summary.rounds, summary.elapsed_s, ok, stats)
    });
    // The first round's time includes every device joining: left out.
    let walls: Vec<(f64, f64)> = walls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .skip(1)
        .copied()
        .collect();
    let mut overhead: Vec<f64> = walls
        .iter()
        .map(|(wall, verify)| (wall - verify).max(0.0) * 1e3)
        .collect();
    overhead.sort_by(f64::total_cmp);
    let wall_rounds: f64 = walls.iter().map(|(w, _)| w).sum();
    println!(
        "devices {k} clock {clock:?} flood {hostile}: {ok}/{k} devices done, {rounds} rounds, {:.1} rounds/s (wall, \
         after the first), overhead p50 {:.1} ms p99 {:.1} ms, peak RSS {:.0} MiB, flood {} connections ({} refused \
         with a message), run {:.1} s wall ({:.3} s on its clock)",
        walls.len() as f64 / wall_rounds.max(1e-9),
        quantile(&overhead, 0.5),
        quantile(&overhead, 0.99),
        peak_rss_mib(),
        stats.attempts.load(Ordering::Relaxed),
        stats.refused.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64(),
        elapsed,
    );
}
