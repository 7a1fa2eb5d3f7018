//! `multispin generate`: text from real models by speculative decoding (a drafter plus the batched verifier), or by
//! plain decoding when no drafter is given.

use crate::failure::Failure;
use crate::simulate::{Embedded, load, load_tokenizer};
use anyhow::Context;
use clap::Args;
use spin_runtime::speculative::{self, SpecConfig, Speculator};
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `multispin generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub threads: crate::threads::ThreadArgs,
    /// Target model: llama2.c `.bin`, GGUF `.gguf`, or a Hugging Face folder (default: the embedded stories260K
    /// checkpoint, models/stories260K.bin).
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Tokenizer (llama2.c `.bin` or `tokenizer.json`); GGUF files and HF folders carry their own (default for a
    /// llama2.c model of 512 tokens: the embedded tok512, models/tok512.bin).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Draft model (same vocabulary as the target); without it and without --self-draft-layers, plain decoding.
    #[arg(long, conflicts_with = "self_draft_layers")]
    pub draft: Option<PathBuf>,
    /// Draft with the target's first N layers and its own head (self-speculation).
    #[arg(allow_hyphen_values = true, long)]
    pub self_draft_layers: Option<usize>,
    /// Draft length γ per round.
    #[arg(allow_hyphen_values = true, long, default_value_t = 4)]
    pub draft_len: usize,
    /// Prompt text (BOS is prepended when the tokenizer has one); at most 1 MiB, and it must fit the context.
    #[arg(long, default_value = "")]
    pub prompt: String,
    /// Tokens to generate (≥ 1). Generation stops early at the end-of-sequence token or when prompt plus output
    /// fill the model's context; the latter is reported on stderr and still exits 0.
    #[arg(allow_hyphen_values = true, long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Sampling temperature: 0 is greedy decoding, otherwise a finite number ≥ 1e-6.
    #[arg(allow_hyphen_values = true, long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Seed of every random draw.
    #[arg(allow_hyphen_values = true, long, default_value_t = 0)]
    pub seed: u64,
    /// Print acceptance and timing on stderr.
    #[arg(long)]
    pub stats: bool,
}

/// The longest prompt accepted, in bytes, checked before tokenising (docs/cli.md lists the limits).
pub const MAX_PROMPT_BYTES: usize = 1 << 20;

/// The smallest temperature other than 0: below it 1/T overflows or the distribution is greedy anyway.
pub const MIN_TEMPERATURE: f64 = 1e-6;

/// A message on one line.
fn flat(text: &str) -> String {
    text.lines().next().unwrap_or("").to_string()
}

/// Checks the numeric arguments before anything is loaded: each failure names its flag.
fn check_counts(args: &GenerateArgs) -> Result<(), Failure> {
    let t = args.temperature;
    if !(t == 0.0 || (t.is_finite() && t >= MIN_TEMPERATURE)) {
        return Err(Failure::Input(format!(
            "--temperature: {t:e} is neither 0 (greedy) nor a finite number ≥ {MIN_TEMPERATURE:e}"
        )));
    }
    if args.draft_len == 0 {
        return Err(Failure::Input("--draft-len: must be at least 1".into()));
    }
    if args.max_tokens == 0 {
        return Err(Failure::Input("--max-tokens: must be at least 1".into()));
    }
    if args.self_draft_layers == Some(0) {
        return Err(Failure::Input("--self-draft-layers: must be at least 1".into()));
    }
    Ok(())
}

/// Runs `multispin generate`.
pub fn run(args: &GenerateArgs) -> Result<(), Failure> {
    // SAFETY: `run` is called only by `main`, after argument parsing and before any thread is started.
    #[allow(unsafe_code)]
    unsafe {
        args.threads.set_up()?;
    }
    check_counts(args)?;
    let target = load(args.target.as_deref(), Embedded::Target)?;
    let tok = load_tokenizer(
        args.tokenizer.as_deref(),
        args.target.as_deref(),
        target.config().vocab_size,
    )?;
    let drafter = match (&args.draft, args.self_draft_layers) {
        (Some(p), _) => Some(load(Some(p), Embedded::Draft)?),
        (None, Some(n)) => Some(
            target
                .first_layers(n)
                .map_err(|e| Failure::Input(format!("--self-draft-layers: {}", flat(&e.to_string()))))?,
        ),
        (None, None) => None,
    };
    // The context: every token of the sequence (prompt and generated) must fit both models.
    let context = drafter.as_ref().map_or(target.config().max_seq_len, |d| {
        d.config().max_seq_len.min(target.config().max_seq_len)
    });
    // Refuse a prompt that cannot fit before tokenising it (tokenising is linear-time but not free).
    let lower = tok.min_tokens(&args.prompt, true);
    if args.prompt.len() > MAX_PROMPT_BYTES || lower > context {
        return Err(Failure::Input(format!(
            "--prompt: {} bytes need at least {lower} tokens, more than the context of {context} tokens \
             (and the prompt limit is {MAX_PROMPT_BYTES} bytes)",
            args.prompt.len()
        )));
    }
    let params = speculative::sampling(args.temperature).map_err(Failure::input)?;
    let mut prompt = tok.encode(&args.prompt, true).map_err(Failure::input)?;
    if prompt.is_empty() {
        prompt = vec![0];
    }
    if prompt.len() > context {
        return Err(Failure::Input(format!(
            "--prompt: {} tokens do not fit the context of {context} tokens",
            prompt.len()
        )));
    }
    // Past the context the models cannot run: generate what fits, print it, say why on stderr and exit 0 (as
    // llama.cpp does). A speculative round drafts at most `remaining − 1` tokens and adds one (the bonus or
    // resampled token), so a round never feeds more than prompt + max_tokens − 1 positions: capping max_tokens
    // at the room left keeps both modes inside the context.
    let room = context - prompt.len();
    let max_tokens = args.max_tokens.min(room);
    let start = Instant::now();
    let (generated, stats) = match &drafter {
        // Greedy: the same tokens as the sampling path at temperature 0, without a distribution per token.
        None if args.temperature == 0.0 => (
            spin_runtime::decode::greedy(&target, &prompt, max_tokens, tok.eos())
                .context("greedy decoding")?,
            None,
        ),
        None => {
            let out =
                speculative::generate_plain(&target, &prompt, &params, max_tokens, tok.eos(), args.seed)
                    .context("plain decoding")?;
            (out, None)
        }
        Some(d) => {
            let cfg = SpecConfig {
                params,
                max_new_tokens: max_tokens,
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
    if max_tokens < args.max_tokens && generated.len() == max_tokens && tok.eos() != generated.last().copied()
    {
        eprintln!(
            "note: stopped at the context limit: {} prompt + {} generated = {context} tokens (--max-tokens asked \
             for {})",
            prompt.len(),
            generated.len(),
            args.max_tokens
        );
    }
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
