//! `multispin device`: one edge device as its own process, drafting for a `multispin serve` server.

use crate::failure::Failure;
use crate::serve::MAX_TOKEN_FILE_BYTES;
use crate::simulate::{Embedded, encode, identity, load, seconds, tokenizer_for};
use clap::Args;
use spin_net::NetError;
use spin_net::blocking::device_blocking;
use spin_net::device::DeviceConfig;
use spin_net::tls::ClientTls;
use std::path::PathBuf;
use std::sync::Arc;

/// Arguments of `multispin device`.
#[derive(Debug, Args)]
pub struct DeviceArgs {
    #[command(flatten)]
    pub threads: crate::threads::ThreadArgs,
    /// The server's address.
    #[arg(long)]
    pub connect: String,
    /// Draft model (same vocabulary and tokenizer as the server's target; default: the embedded 2-layer, width-32
    /// draft distilled from stories260K, models/draft-2x32.bin).
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// How the draft model's dense matrices are held, as `generate --draft-format` says: `auto`, `as-stored`,
    /// or `q8_0` / `q4_0` / `q4_1` (quantised at load onto the quantised host route).
    #[arg(long, value_enum, default_value_t = crate::draft_format::DraftFormat::Auto)]
    pub draft_format: crate::draft_format::DraftFormat,
    #[command(flatten)]
    pub lookup: crate::lookup::LookupArgs,
    /// Tokenizer (llama2.c `.bin`, `tokenizer.json`, or a GGUF file's, e.g. the target's for a restricted-head
    /// draft folder, which carries none); GGUF files and HF folders with `tokenizer.json` carry their own (default
    /// for a llama2.c model of 512 tokens: the embedded tok512, models/tok512.bin).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Prompt text (BOS is prepended when the tokenizer has one).
    #[arg(long, default_value = "")]
    pub prompt: String,
    /// Distance to the server in metres (default: the server's seeded drop).
    #[arg(long)]
    pub distance_m: Option<f64>,
    /// Trust this CA certificate (PEM; for a `gen-cert` demo, the server's certificate itself) and speak TLS.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// The name the server's certificate must carry (default: the host of --connect).
    #[arg(long, requires = "tls_ca")]
    pub server_name: Option<String>,
    /// A file whose first line is this device's admission token.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Seconds a device whose connection was cut keeps reconnecting to resume its session (0: it does not).
    #[arg(long, default_value_t = 30.0)]
    pub reconnect_s: f64,
    /// Seconds one handshake may take, from connecting to the server's Welcome (TLS included); a server that
    /// accepts the connection and says nothing is given up on then.
    #[arg(long, default_value_t = 30.0)]
    pub handshake_timeout_s: f64,
    /// Seconds the device waits, once welcomed, for any message of the server (a waiting server sends a keepalive
    /// every 5 s); past it the device resumes once, and gives up if the server stays silent as long again.
    #[arg(long, default_value_t = 60.0)]
    pub silence_timeout_s: f64,
    /// Seconds the device waits, once welcomed, for the server to move its session on (a plan, a verdict) while it
    /// hears only keepalives, e.g. while the server waits for --devices devices to join; past it the device gives up.
    #[arg(long, default_value_t = 3600.0)]
    pub progress_timeout_s: f64,
}

/// Runs `multispin device`: prints the generated text on stdout.
pub fn run(args: &DeviceArgs) -> Result<(), Failure> {
    // SAFETY: called only by `main`, after argument parsing and before any thread is started.
    #[allow(unsafe_code)]
    unsafe {
        args.threads.set_up()?;
    }
    if let Some(d) = args.distance_m
        && !(d > 0.0 && d.is_finite())
    {
        return Err(Failure::Input(format!(
            "distance_m: {d} is not a finite number > 0"
        )));
    }
    let handshake_timeout = seconds("handshake_timeout_s", args.handshake_timeout_s)?;
    let silence_timeout = seconds("silence_timeout_s", args.silence_timeout_s)?;
    let progress_timeout = seconds("progress_timeout_s", args.progress_timeout_s)?;
    let reconnect_for = std::time::Duration::try_from_secs_f64(args.reconnect_s)
        .ok()
        .filter(|d| *d <= spin_net::server::MAX_WAIT)
        .ok_or_else(|| {
            Failure::Input(format!(
                "reconnect_s: {} is not a number of seconds in [0, {}] (a year)",
                args.reconnect_s,
                spin_net::server::MAX_WAIT.as_secs()
            ))
        })?;
    let lookup = args.lookup.lookup()?;
    // Every flag, then the small files: a bad one is refused before the draft model loads.
    let tls = match &args.tls_ca {
        Some(ca) => {
            let host = args
                .connect
                .rsplit_once(':')
                .map_or(args.connect.as_str(), |(h, _)| h);
            let name = args
                .server_name
                .as_deref()
                .unwrap_or(host.trim_start_matches('[').trim_end_matches(']'));
            Some(ClientTls::from_file(ca, name).map_err(Failure::input)?)
        }
        None => None,
    };
    let token = match &args.token_file {
        Some(t) => {
            let text = crate::scenario::read_text_limited(t, "token_file", MAX_TOKEN_FILE_BYTES)?;
            let token = text.lines().next().unwrap_or("").trim();
            if token.is_empty() {
                return Err(Failure::Input(format!(
                    "token_file: {} has an empty first line",
                    t.display()
                )));
            }
            token.as_bytes().to_vec()
        }
        None => Vec::new(),
    };
    let drafter = load(args.draft.as_deref(), Embedded::Draft)?;
    let drafter = match args.draft_format.for_draft(&drafter) {
        None => drafter,
        Some(f) => drafter
            .quantize_host(f)
            .map_err(|e| Failure::Input(format!("draft_format: {}", e.to_string().replace('\n', " "))))?,
    };
    // A restricted-head draft scores a compact vocabulary but speaks the target's: the tokenizer and the identity
    // are the full vocabulary's.
    let tok = tokenizer_for(
        args.tokenizer.as_deref(),
        &drafter,
        "--draft",
        args.draft.as_deref(),
    )?;
    let mut cfg = DeviceConfig::new(
        args.connect.clone(),
        encode(&tok, &args.prompt)?,
        identity(&drafter, &tok),
    );
    cfg.distance_m = args.distance_m;
    cfg.lookup = lookup;
    cfg.tls = tls;
    cfg.token = token;
    cfg.handshake_timeout = handshake_timeout;
    cfg.silence_timeout = silence_timeout;
    cfg.progress_timeout = progress_timeout;
    cfg.reconnect_for = reconnect_for;
    let report = device_blocking(Arc::new(drafter), cfg);
    match report {
        Ok(r) => {
            if r.resumes > 0 {
                eprintln!("resumed the session {} time(s) after a cut connection", r.resumes);
            }
            println!("{}", tok.decode(&r.tokens).map_err(Failure::input)?);
            Ok(())
        }
        Err(e) => {
            let input = matches!(
                e,
                NetError::Mismatch { .. }
                    | NetError::Refused { .. }
                    | NetError::Version { .. }
                    | NetError::Invalid { .. }
            );
            Err(crate::failure::net(
                &format!("--connect {}", args.connect),
                e,
                input,
            ))
        }
    }
}
