//! `multispin serve`: the edge server as its own process; devices (`multispin device`) connect over TCP.

use crate::failure::Failure;
use crate::simulate::{Embedded, RESUME_GRACE, ServerArgs, identity, load, load_tokenizer, scheme_table};
use anyhow::Context;
use clap::Args;
use spin_net::blocking::serve_blocking;
use std::io::Write;
use std::path::PathBuf;
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
    let target = load(args.server.target.as_deref(), Embedded::Target)?;
    let tok = load_tokenizer(
        args.server.tokenizer.as_deref(),
        args.server.target.as_deref(),
        target.config().vocab_size,
    )?;
    let mut cfg = args.server.config(identity(&target, &tok))?;
    cfg.min_devices = args.devices;
    cfg.stop_when_done = !args.keep_serving;
    cfg.resume_grace = RESUME_GRACE;
    let mut trace = match &args.trace {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    let target = Arc::new(target);
    let mut rounds = Vec::new();
    let summary = serve_blocking(
        &args.listen,
        target,
        cfg,
        |addr| eprintln!("listening on {addr}"),
        |t| {
            if let Some(w) = trace.as_mut() {
                // Flushed per round: ctrl-c never leaves a cut line.
                let _ =
                    writeln!(w, "{}", serde_json::to_string(t).unwrap_or_default()).and_then(|_| w.flush());
            }
            rounds.push(t.clone());
        },
    );
    let summary = summary.map_err(|e| crate::failure::net(&format!("--listen {}", args.listen), e, true))?;
    println!("{}", scheme_table(&[(summary.clone(), rounds)]));
    eprintln!("stopped: {}", summary.stopped);
    Ok(())
}
