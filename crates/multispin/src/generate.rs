//! `multispin generate`: text from real models by speculative decoding (a drafter plus the batched verifier), or by
//! plain decoding when no drafter is given.

use crate::failure::Failure;
use anyhow::Context;
use clap::Args;
use spin_runtime::speculative::{self, SpecConfig, Speculator};
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `multispin generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Target model: llama2.c `.bin`, GGUF `.gguf`, or a Hugging Face folder.
    #[arg(long)]
    pub target: PathBuf,
    /// Tokenizer (llama2.c `.bin` or `tokenizer.json`); GGUF files and HF folders carry their own.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Draft model (same vocabulary as the target).
    #[arg(long, conflicts_with = "self_draft_layers")]
    pub draft: Option<PathBuf>,
    /// Draft with the target's first N layers and its own head (self-speculation).
    #[arg(long)]
    pub self_draft_layers: Option<usize>,
    /// Draft length γ per round.
    #[arg(long, default_value_t = 4)]
    pub draft_len: usize,
    /// Prompt text (BOS is prepended when the tokenizer has one).
    #[arg(long, default_value = "")]
    pub prompt: String,
    /// Tokens to generate.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy decoding.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Seed of every random draw.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print acceptance and timing on stderr.
    #[arg(long)]
    pub stats: bool,
}

/// Runs `multispin generate`.
pub fn run(args: &GenerateArgs) -> Result<(), Failure> {
    // SAFETY: `run` is called only by `main`, after argument parsing and before any thread is started.
    #[allow(unsafe_code)]
    unsafe {
        spin_runtime::load::fix_cpu_threads();
    }
    if !(args.temperature >= 0.0 && args.temperature.is_finite()) {
        return Err(Failure::Input(format!(
            "temperature: {} is not a finite number ≥ 0",
            args.temperature
        )));
    }
    let device = spin_runtime::select_device().map_err(|e| Failure::Runtime(e.into()))?;
    let target = spin_runtime::load_model(&args.target, &device).map_err(Failure::input)?;
    let tok = spin_runtime::load_tokenizer(
        args.tokenizer.as_deref(),
        &args.target,
        target.config().vocab_size,
    )
    .map_err(Failure::input)?;
    let drafter = match (&args.draft, args.self_draft_layers) {
        (Some(p), _) => Some(spin_runtime::load_model(p, &device).map_err(Failure::input)?),
        (None, Some(n)) => Some(target.first_layers(n).map_err(Failure::input)?),
        (None, None) => None,
    };
    let params = speculative::sampling(args.temperature).map_err(Failure::input)?;
    let mut prompt = tok.encode(&args.prompt, true).map_err(Failure::input)?;
    if prompt.is_empty() {
        prompt = vec![0];
    }
    let start = Instant::now();
    let (generated, stats) = match &drafter {
        None => {
            let out =
                speculative::generate_plain(&target, &prompt, &params, args.max_tokens, tok.eos(), args.seed)
                    .context("plain decoding")?;
            (out, None)
        }
        Some(d) => {
            let cfg = SpecConfig {
                params,
                max_new_tokens: args.max_tokens,
                eos: tok.eos(),
                seed: args.seed,
            };
            let mut s = Speculator::new(&target, d, std::slice::from_ref(&prompt), &[args.draft_len], cfg)
                .map_err(Failure::input)?;
            s.run().context("speculative decoding")?;
            let dev = &s.devices[0];
            let verify_s: f64 = s.rounds.iter().map(|r| r.verify_s).sum();
            let alpha = dev.alpha.ratio_estimate(1.96).ok().flatten();
            let line = format!(
                "rounds {} | drafted {} | acceptance {} | draft {:.3} ms/token | verify {:.3} ms/round",
                dev.rounds,
                dev.drafted,
                alpha.map_or("n/a".into(), |a| format!(
                    "{:.4} ± {:.4}",
                    a.value,
                    a.high - a.value
                )),
                1e3 * dev.draft_time.as_secs_f64() / dev.drafted.max(1) as f64,
                1e3 * verify_s / s.rounds.len().max(1) as f64,
            );
            (dev.generated().to_vec(), Some(line))
        }
    };
    let elapsed = start.elapsed().as_secs_f64();
    let mut all = prompt.clone();
    all.extend_from_slice(&generated);
    println!("{}", tok.decode(&all).map_err(Failure::input)?);
    if args.stats {
        eprintln!(
            "generated {} tokens in {:.3} s ({:.1} tokens/s)",
            generated.len(),
            elapsed,
            generated.len() as f64 / elapsed.max(1e-9)
        );
        if let Some(line) = stats {
            eprintln!("{line}");
        }
    }
    Ok(())
}
