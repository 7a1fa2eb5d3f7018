//! `cargo xtask distill`: trains a draft model for a target (llama2.c, GGUF or model folder) by running the spin-runtime `distill` example
//! in release mode, so that xtask itself never depends on candle. The options are parsed here first, so `--help`
//! and a mistyped or missing option answer at once, before a release build of candle (minutes, the first time).

use clap::Args;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The distill example's options, with its defaults (checked against the example's usage line by a test).
#[derive(Debug, Clone, Args)]
pub struct DistillArgs {
    /// The target to distil from: a llama2.c checkpoint (e.g. models/stories260K.bin), a GGUF file or a model
    /// folder (these two need --head-vocab).
    #[arg(long)]
    pub target: PathBuf,
    /// Where to write the draft: a llama2.c v0 checkpoint (sharing the target's tokenizer), or with --head-vocab
    /// a model folder holding the restricted head's token ids.
    #[arg(long)]
    pub out: PathBuf,
    /// Training steps.
    #[arg(long, default_value_t = 300)]
    pub steps: u32,
    /// Sequences per step.
    #[arg(long, default_value_t = 8)]
    pub batch: u32,
    /// Tokens per training sequence.
    #[arg(long, default_value_t = 64)]
    pub seq_len: u32,
    /// Student model width.
    #[arg(long, default_value_t = 32)]
    pub dim: u32,
    /// Student feed-forward width.
    #[arg(long, default_value_t = 64)]
    pub hidden: u32,
    /// Student layers.
    #[arg(long, default_value_t = 2)]
    pub layers: u32,
    /// Student attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: u32,
    /// Student key/value heads.
    #[arg(long, default_value_t = 2)]
    pub kv_heads: u32,
    /// Learning rate (the peak of the cosine schedule).
    #[arg(long, default_value_t = 3e-3)]
    pub lr: f64,
    /// Seed of the training sequences and the student's initialisation.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Restricted output head over the target's N most frequent tokens (0: a full head, llama2.c targets only);
    /// the target's top-k distributions are cached once and the student trained on them (needs
    /// MULTISPIN_SHARED_DATA for the corpora).
    #[arg(long, default_value_t = 0)]
    pub head_vocab: u32,
    /// With --head-vocab: the target probabilities kept per position.
    #[arg(long, default_value_t = 32)]
    pub top_k: u32,
    /// With --head-vocab: TinyStories windows of --seq-len tokens in the training text (besides the target's
    /// answers to 48 instructions).
    #[arg(long, default_value_t = 512)]
    pub story_seqs: u32,
    /// With --head-vocab: stop training after this many minutes (0: no limit); the steps done are printed, and
    /// --steps with that number rebuilds the same draft.
    #[arg(long, default_value_t = 0.0)]
    pub minutes: f64,
    /// With --head-vocab and a GGUF target: the target's layers the student starts from, comma-separated (e.g.
    /// 0,29); it then has the target's width, heads and norms (--dim … --kv-heads unused), its embedding and head
    /// the target's rows of the head's tokens. `none`: a random student of the shape given.
    #[arg(long, default_value = "none")]
    pub init_layers: String,
    /// With --head-vocab: held-in TinyStories openings (a paragraph's first 12 words) the target continues
    /// greedily to --seq-len tokens, added to the training text.
    #[arg(long, default_value_t = 0)]
    pub openings: u32,
    /// With --head-vocab: instructions the target answers (greedily, then twice sampled at temperature 0.8) for
    /// the training text: 48 written out, then 8 templates × 40 subjects (at most 368); none is an evaluation
    /// instruction of scripts/bench-speculative-smollm2.sh.
    #[arg(long, default_value_t = 48)]
    pub instructions: u32,
    /// With --head-vocab: instructions the target writes itself (asked for one in four ways, sampled at
    /// temperature 0.7, deduplicated), answered like --instructions: questions in the target's own words.
    #[arg(long, default_value_t = 0)]
    pub self_instructions: u32,
    /// With --head-vocab: a file for the target's top-k distributions over the training text, read when it
    /// exists (built from the same target and text options, or refused), else written after caching; `none`:
    /// no file. Saves the text generation and caching (most of a first run) when only training options change.
    #[arg(long, default_value = "none")]
    pub cache_file: String,
    /// With --head-vocab: `constant` keeps --lr for every step; `cosine` warms up linearly over the first
    /// steps/20 steps (at most 50), then decays along a half cosine to a tenth of --lr at the last step.
    #[arg(long, default_value = "constant", value_parser = ["constant", "cosine"])]
    pub lr_schedule: String,
    /// With --head-vocab: weight of the cross-entropy at the target's most probable head token, added to the KL
    /// (0: the KL alone). Greedy acceptance needs only the top token to agree.
    #[arg(long, default_value_t = 0.0)]
    pub argmax_weight: f64,
    /// With --init-layers: the first N of those layers, and the embedding and head, keep the target's weights
    /// (no gradient, a forward pass alone per step); the layers above them and the final norm train. 0: every
    /// tensor trains.
    #[arg(long, default_value_t = 0)]
    pub freeze_layers: u32,
}

impl DistillArgs {
    /// The example's command line for these options.
    fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            "--target".to_owned(),
            self.target.display().to_string(),
            "--out".to_owned(),
            self.out.display().to_string(),
        ];
        for (flag, v) in [
            ("--steps", self.steps.to_string()),
            ("--batch", self.batch.to_string()),
            ("--seq-len", self.seq_len.to_string()),
            ("--dim", self.dim.to_string()),
            ("--hidden", self.hidden.to_string()),
            ("--layers", self.layers.to_string()),
            ("--heads", self.heads.to_string()),
            ("--kv-heads", self.kv_heads.to_string()),
            ("--lr", self.lr.to_string()),
            ("--seed", self.seed.to_string()),
            ("--head-vocab", self.head_vocab.to_string()),
            ("--top-k", self.top_k.to_string()),
            ("--story-seqs", self.story_seqs.to_string()),
            ("--minutes", self.minutes.to_string()),
            ("--init-layers", self.init_layers.clone()),
            ("--openings", self.openings.to_string()),
            ("--instructions", self.instructions.to_string()),
            ("--self-instructions", self.self_instructions.to_string()),
            ("--cache-file", self.cache_file.clone()),
            ("--lr-schedule", self.lr_schedule.clone()),
            ("--argmax-weight", self.argmax_weight.to_string()),
            ("--freeze-layers", self.freeze_layers.to_string()),
        ] {
            a.push(flag.to_owned());
            a.push(v);
        }
        a
    }
}

/// glibc's allocator settings for the training process: no mmap threshold (large blocks come from the heap) and
/// no trimming (freed memory stays for the next step's tensors).
const MALLOC_TUNABLES: &str =
    "glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=17179869184";

/// Runs `cargo run --release -p spin-runtime --example distill -- <args>`; its exit status is ours, its messages
/// (on its stdout and stderr) are the only ones printed.
pub fn run(args: &DistillArgs) -> ExitCode {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!(
        "distill: building the spin-runtime distill example in release mode (a first build compiles candle: \
         several minutes), then training {} steps with progress lines",
        args.steps
    );
    let mut command = Command::new(cargo);
    // Training allocates tensors of tens of megabytes and frees them every step; glibc hands blocks above its
    // mmap threshold (at most 32 MiB) straight back to the kernel and trims the heap, so each step faulted its
    // pages in again (about 14 s of kernel time in 8 steps of batch 16 × 128 positions). Keeping freed memory for
    // reuse halved the wall time of a step on 2 cores. Only where the caller has not set the tunables.
    if std::env::var_os("GLIBC_TUNABLES").is_none() {
        command.env("GLIBC_TUNABLES", MALLOC_TUNABLES);
    }
    let status = command
        .args([
            "run",
            "--release",
            "-p",
            "spin-runtime",
            "--example",
            "distill",
            "--",
        ])
        .args(args.to_args())
        .status();
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => {
            eprintln!("error: distill: the example failed ({s})");
            ExitCode::from(s.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1))
        }
        Err(e) => {
            eprintln!("error: distill: cannot start cargo: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: DistillArgs,
    }

    /// The options parsed here are the example's: every flag and default of its usage line, in its order.
    #[test]
    fn options_match_the_example_usage() {
        let src = std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crates/spin-runtime/examples/distill.rs"),
        )
        .unwrap();
        let usage: String = src
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .skip_while(|l| !l.contains("Usage:"))
            .collect::<Vec<_>>()
            .join(" ");
        let a = Cli::try_parse_from(["distill", "--target", "t.bin", "--out", "o.bin"])
            .unwrap()
            .args
            .to_args();
        for pair in a.chunks(2).skip(2) {
            let at = usage
                .find(&format!("[{} ", pair[0]))
                .unwrap_or_else(|| panic!("{} not in the example's usage: {usage}", pair[0]));
            let written = usage[at + pair[0].len() + 2..].split(']').next().unwrap();
            match (written.parse::<f64>(), pair[1].parse::<f64>()) {
                (Ok(w), Ok(d)) => assert_eq!(w, d, "default of {}", pair[0]),
                _ => assert_eq!(written, pair[1], "default of {}", pair[0]),
            }
        }
        let err = Cli::try_parse_from(["distill", "--out", "o.bin"]).unwrap_err();
        assert!(err.to_string().contains("--target"), "{err}");
        let err = Cli::try_parse_from(["distill", "--targte", "t"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("similar argument exists: '--target'"), "{err}");
    }
}
