//! `multispin device`: one edge device as its own process, drafting for a `multispin serve` server.

use crate::failure::Failure;
use crate::simulate::{Embedded, encode, identity, load, load_tokenizer};
use clap::Args;
use spin_net::NetError;
use spin_net::blocking::device_blocking;
use spin_net::device::DeviceConfig;
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
    /// Tokenizer (llama2.c `.bin` or `tokenizer.json`); GGUF files and HF folders carry their own (default for a
    /// llama2.c model of 512 tokens: the embedded tok512, models/tok512.bin).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Prompt text (BOS is prepended when the tokenizer has one).
    #[arg(long, default_value = "")]
    pub prompt: String,
    /// Distance to the server in metres (default: the server's seeded drop).
    #[arg(long)]
    pub distance_m: Option<f64>,
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
    let drafter = load(args.draft.as_deref(), Embedded::Draft)?;
    let tok = load_tokenizer(
        args.tokenizer.as_deref(),
        args.draft.as_deref(),
        drafter.config().vocab_size,
    )?;
    let mut cfg = DeviceConfig::new(
        args.connect.clone(),
        encode(&tok, &args.prompt)?,
        identity(&drafter, &tok),
    );
    cfg.distance_m = args.distance_m;
    let report = device_blocking(Arc::new(drafter), cfg);
    match report {
        Ok(r) => {
            println!("{}", tok.decode(&r.tokens).map_err(Failure::input)?);
            Ok(())
        }
        Err(e) => {
            let input = matches!(
                e,
                NetError::Mismatch { .. } | NetError::Refused { .. } | NetError::Version { .. }
            );
            Err(crate::failure::net(
                &format!("--connect {}", args.connect),
                e,
                input,
            ))
        }
    }
}
