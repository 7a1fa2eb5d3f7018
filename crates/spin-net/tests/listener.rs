//! The listener under file-descriptor exhaustion (issue 22, case 5), in a test binary of its own because it lowers
//! this process's descriptor limit: `accept` failing with EMFILE is retried after a back-off, no round runs without
//! a device, and a device that comes once descriptors are free again is served.

use spin_net::controller::Scheme;
use spin_net::device::{DeviceConfig, run_device};
use spin_net::proto::Identity;
use spin_net::server::{Server, ServerConfig};
use spin_runtime::model;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::timeout;

const LIMIT: Duration = Duration::from_secs(60);

/// `f`, failing the test past the time limit (the timer is made inside the runtime).
async fn bounded<F: std::future::Future>(f: F) -> Result<F::Output, tokio::time::error::Elapsed> {
    timeout(LIMIT, f).await
}

/// The soft and hard descriptor limits of this process, as `prlimit` reports them.
fn nofile() -> Option<(u64, u64)> {
    let pid = std::process::id().to_string();
    let out = Command::new("prlimit")
        .args([
            "--pid",
            &pid,
            "--nofile",
            "--raw",
            "--noheadings",
            "--output",
            "SOFT,HARD",
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace().map(|v| v.parse::<u64>().ok());
    Some((it.next()??, it.next()??))
}

fn set_soft(soft: u64, hard: u64) -> bool {
    let pid = std::process::id().to_string();
    Command::new("prlimit")
        .args(["--pid", &pid, &format!("--nofile={soft}:{hard}")])
        .status()
        .is_ok_and(|s| s.success())
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

#[test]
fn the_listener_survives_descriptor_exhaustion_and_serves_the_next_device() {
    let Some((soft, hard)) = nofile() else {
        eprintln!("skipped: `prlimit` is not available to lower the descriptor limit");
        return;
    };
    let device = spin_runtime::select_device().unwrap();
    let target = Arc::new(model::tiny_random_model(1, 0.3, 2, &device).unwrap());
    let drafter = Arc::new(model::tiny_random_model(2, 0.3, 1, &device).unwrap());
    let id = Identity {
        vocab: target.config().vocab_size as u32,
        tokenizer: 7,
        model: 0,
    };
    let mut cfg = ServerConfig::new(Scheme::parse_per_round("best").unwrap(), id);
    cfg.max_new_tokens = 8;
    cfg.saa_samples = 16;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let rounds = Arc::new(AtomicU64::new(0));
    let r = rounds.clone();
    let rep = rt.block_on(bounded(async move {
        let (_tx, rx) = watch::channel(false);
        let server = Server::bind("127.0.0.1:0", target.clone(), cfg).await.unwrap();
        let addr = server.local_addr().unwrap().to_string();
        let serving = tokio::spawn(server.run(rx, move |_| {
            r.fetch_add(1, Ordering::Relaxed);
        }));
        // A little headroom above what is open now: the clients below take it, then the server's accept fails.
        assert!(set_soft(open_fds() + 12, hard), "prlimit failed");
        let mut clients = Vec::new();
        for _ in 0..40 {
            match timeout(Duration::from_millis(500), TcpStream::connect(&addr)).await {
                Ok(Ok(c)) => clients.push(c),
                _ => break,
            }
        }
        // Let the listener hit EMFILE a few times (it backs off, it does not exit).
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(clients);
        assert!(set_soft(soft, hard), "prlimit restore failed");
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let rep = run_device(drafter.clone(), DeviceConfig::new(addr, vec![1, 5, 9], id)).await;
        let summary = serving.await.unwrap().unwrap();
        (rep, summary)
    }));
    let _ = set_soft(soft, hard);
    let (rep, summary) = rep.expect("the device was served in time");
    let rep = rep.unwrap();
    assert_eq!(rep.generated().len(), 8);
    // Only rounds with the device ran: as many as the summary counts, and each committed a token or more.
    assert_eq!(rounds.load(Ordering::Relaxed), summary.rounds);
    assert!(summary.rounds <= 8, "{} rounds for 8 tokens", summary.rounds);
}
