//! `multispin serve`: the edge server as its own process; devices (`multispin device`) connect over TCP.

use crate::failure::Failure;
use crate::simulate::{Embedded, ServerArgs, identity, load, scheme_table, seconds, tokenizer_for};
use clap::Args;
use spin_net::blocking::serve_blocking;
use spin_net::proto::Identity;
use spin_net::tls::ServerTls;
use std::io::Write;
use std::net::ToSocketAddrs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Arguments of `multispin serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub threads: crate::threads::ThreadArgs,
    /// Address to listen on (port 0 picks a free port; the address is printed on stderr).
    #[arg(long, default_value = "127.0.0.1:7878")]
    pub listen: String,
    #[command(flatten)]
    pub server: ServerArgs,
    /// Rounds start once this many devices joined.
    #[arg(long, default_value_t = 1)]
    pub devices: usize,
    /// Keep serving after every device finished (until ctrl-c).
    #[arg(long)]
    pub keep_serving: bool,
    /// Write the per-round trace (JSON lines) here.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Seconds a disconnected device has to resume; then its session is released and cannot be resumed.
    #[arg(long, default_value_t = 10.0)]
    pub resume_window_s: f64,
    /// Seconds a new connection has to send its Hello before it is closed.
    #[arg(long, default_value_t = 5.0)]
    pub handshake_timeout_s: f64,
    /// Open connections at most (one more is answered Full).
    #[arg(long, default_value_t = 2048)]
    pub max_connections: usize,
    /// Open connections at most from one IP address.
    #[arg(long, default_value_t = 64)]
    pub max_connections_per_addr: usize,
    /// Sessions at most that have not drafted yet (a flood of Hellos fills this, not the device slots); at least
    /// --devices is used, as no device drafts before that many joined.
    #[arg(long, default_value_t = 256)]
    pub max_pending: usize,
    /// Of those, at most this many from one IP address (at least --devices is used: they may all run on one host).
    #[arg(long, default_value_t = 32)]
    pub max_pending_per_addr: usize,
    /// TLS certificate chain (PEM, leaf first); with --tls-key, every connection is TLS (`multispin gen-cert`
    /// writes a self-signed pair for a demo).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Admission tokens, one per line (blank lines and lines starting with # are skipped): a device must send one.
    #[arg(long)]
    pub tokens: Option<PathBuf>,
    /// Allow a non-loopback --listen without TLS or without tokens (anyone on the path can then read the text and
    /// anyone who can connect is admitted).
    #[arg(long)]
    pub insecure: bool,
}

/// The largest `serve --tokens` or `device --token-file` read: 1 MiB (some 30,000 tokens), checked before and while
/// reading.
pub const MAX_TOKEN_FILE_BYTES: u64 = 1 << 20;

/// The admission tokens of a `--tokens` file: one per line, blank lines and `#` comments skipped, each at least 16
/// bytes (a short token is guessable).
pub fn read_tokens(path: &Path) -> Result<Vec<Vec<u8>>, Failure> {
    let text = crate::scenario::read_text_limited(path, "tokens", MAX_TOKEN_FILE_BYTES)?;
    let mut tokens = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if t.len() < 16 {
            return Err(Failure::Input(format!(
                "tokens: line {} of {} is {} bytes; a token needs at least 16",
                i + 1,
                path.display(),
                t.len()
            )));
        }
        tokens.push(t.as_bytes().to_vec());
    }
    if tokens.is_empty() {
        return Err(Failure::Input(format!(
            "tokens: {} holds no token",
            path.display()
        )));
    }
    Ok(tokens)
}

/// Whether every address `listen` resolves to is a loopback address.
fn loopback_only(listen: &str) -> Result<bool, Failure> {
    let addrs: Vec<std::net::SocketAddr> = listen
        .to_socket_addrs()
        .map_err(|e| Failure::Input(format!("listen: {listen}: {e}")))?
        .collect();
    Ok(!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()))
}

/// Runs `multispin serve`.
pub fn run(args: &ServeArgs) -> Result<(), Failure> {
    // SAFETY: called only by `main`, after argument parsing and before any thread is started.
    #[allow(unsafe_code)]
    unsafe {
        args.threads.set_up()?;
    }
    if args.devices == 0 {
        return Err(Failure::Input("devices: must be at least 1".into()));
    }
    // Every flag, then the small files, before the target loads: a bad one is refused at once. The target's
    // identity is filled in once it loaded.
    let mut cfg = args.server.config(Identity {
        vocab: 0,
        tokenizer: 0,
        model: 0,
    })?;
    cfg.min_devices = args.devices;
    cfg.stop_when_done = !args.keep_serving;
    cfg.resume_window = seconds("resume_window_s", args.resume_window_s)?;
    cfg.handshake_timeout = seconds("handshake_timeout_s", args.handshake_timeout_s)?;
    cfg.max_connections = args.max_connections;
    cfg.max_connections_per_addr = args.max_connections_per_addr;
    // `--devices N` started from one host must all get in before any of them drafts.
    cfg.max_pending = args.max_pending.max(args.devices);
    cfg.max_pending_per_addr = args.max_pending_per_addr.max(args.devices);
    cfg.tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(ServerTls::from_files(cert, key).map_err(Failure::input)?),
        _ => None,
    };
    cfg.device_tokens = match &args.tokens {
        Some(t) => read_tokens(t)?,
        None => Vec::new(),
    };
    if !args.insecure && !loopback_only(&args.listen)? {
        let missing: Vec<&str> = [
            (cfg.tls.is_none(), "--tls-cert/--tls-key"),
            (cfg.device_tokens.is_empty(), "--tokens"),
        ]
        .into_iter()
        .filter_map(|(m, f)| m.then_some(f))
        .collect();
        if !missing.is_empty() {
            return Err(Failure::Input(format!(
                "listen: {} is not a loopback address; give {} (or --insecure to serve it unprotected)",
                args.listen,
                missing.join(" and ")
            )));
        }
    }
    cfg.validate().map_err(Failure::input)?;
    // The trace file and the address are taken before the target loads, so a bad path or a port in use is said
    // at once; the bound socket is the one the server then accepts on (nothing can take the port meanwhile, and
    // devices that connect while the target loads wait in its backlog).
    let mut trace = match &args.trace {
        Some(p) => Some(std::io::BufWriter::new(std::fs::File::create(p).map_err(
            |e| Failure::Input(format!("--trace: cannot create {}: {e}", p.display())),
        )?)),
        None => None,
    };
    let listener = std::net::TcpListener::bind(&args.listen)
        .map_err(|e| Failure::Input(format!("--listen: cannot listen on {}: {e}", args.listen)))?;
    let target = load(args.server.target.as_deref(), Embedded::Target)?;
    let tok = tokenizer_for(
        args.server.tokenizer.as_deref(),
        &target,
        "--target",
        args.server.target.as_deref(),
    )?;
    cfg.identity = identity(&target, &tok);
    // A device's prompt holds one token at least (BOS): a budget that fills the context would refuse every device
    // when it joins.
    let context = target.config().max_seq_len;
    if cfg.max_new_tokens >= context {
        return Err(Failure::Input(format!(
            "--max-tokens: {} leaves no room for a prompt in the target's context of {context} tokens",
            cfg.max_new_tokens
        )));
    }
    let target = Arc::new(target);
    let mut rounds = Vec::new();
    let summary = serve_blocking(
        listener,
        target,
        cfg,
        // Through the stderr printer: a stderr nobody reads must not stall the server (crate::logging).
        |addr| crate::logging::line(&format!("listening on {addr}")),
        crate::logging::line,
        |t| {
            if let Some(w) = trace.as_mut() {
                // Flushed per round: ctrl-c never leaves a cut line.
                let _ =
                    writeln!(w, "{}", serde_json::to_string(t).unwrap_or_default()).and_then(|_| w.flush());
            }
            rounds.push(t.clone());
        },
    );
    crate::logging::flush(std::time::Duration::from_secs(2));
    let summary = summary.map_err(|e| crate::failure::net(&format!("--listen {}", args.listen), e, true))?;
    println!("{}", scheme_table(&[(summary.clone(), rounds)]));
    eprintln!("stopped: {}", summary.stopped);
    Ok(())
}
