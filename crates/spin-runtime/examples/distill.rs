//! `cargo xtask distill` runs this: trains a small draft model for a target by distillation.
//!
//! A llama2.c target (e.g. stories260K) with `--head-vocab 0`: the student learns from text the target samples and
//! is saved as a llama2.c v0 checkpoint sharing the target's tokenizer. A GGUF file or model folder (which carry
//! their tokenizer) with `--head-vocab N > 0`: the target's top-k distributions are cached once from its batched
//! passes over TinyStories validation (less its first 64 KiB, held out for evaluation; `$MULTISPIN_SHARED_DATA/
//! corpora`), over its greedy continuations of held-in story openings (`--openings`) and over its own greedy and
//! sampled answers to instructions (`--instructions`, and `--self-instructions` the target writes itself), and a student with a restricted head over the target's N
//! most frequent tokens (docs/runtime.md, "Restricted draft head") is trained on that cache by KL and saved as a
//! model folder. Both are deterministic from `--seed`.
//!
//! Usage: distill --target PATH --out PATH [--steps 300] [--batch 8] [--seq-len 64] [--dim 32] [--hidden 64]
//!        [--layers 2] [--heads 4] [--kv-heads 2] [--lr 3e-3] [--seed 0] [--head-vocab 0] [--top-k 32]
//!        [--story-seqs 512] [--minutes 0] [--init-layers none]
//!        [--openings 0] [--instructions 48] [--self-instructions 0] [--cache-file none] [--lr-schedule constant]
//!        [--argmax-weight 0] [--freeze-layers 0]

use spin_runtime::train::{DistillConfig, distill};
use spin_runtime::{Config, RopeStyle, llama2c};
use std::path::PathBuf;
use std::process::ExitCode;

#[path = "distill/head_route.rs"]
mod head_route;

fn main() -> ExitCode {
    // Training runs candle's element-wise ops (and the backward pass's) on its own pool, which the binaries hold
    // to one thread (see `fix_cpu_threads`); here it gets every core unless CANDLE_NUM_THREADS says otherwise
    // (about 1.4x faster training steps on 2 cores).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: the first statements of main, before any thread exists.
    #[allow(unsafe_code)]
    let threads = unsafe {
        if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
            std::env::set_var("CANDLE_NUM_THREADS", cores.to_string());
        }
        spin_runtime::load::fix_cpu_threads()
    };
    println!("candle CPU threads: {threads}");
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |name: &str| -> Option<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    fn num<T: std::str::FromStr>(v: Option<String>, name: &str, default: T) -> Result<T, String> {
        match v {
            None => Ok(default),
            Some(s) => s.parse().map_err(|_| format!("{name}: {s:?} is not a number")),
        }
    }
    fn layers(v: Option<String>) -> Result<Vec<usize>, String> {
        match v.as_deref() {
            None | Some("none") => Ok(Vec::new()),
            Some(s) => s
                .split(',')
                .map(|x| {
                    x.trim().parse().map_err(|_| {
                        format!("--init-layers: {x:?} is not a layer index (e.g. 0,1,29 or none)")
                    })
                })
                .collect(),
        }
    }
    let target_path = PathBuf::from(get("--target").ok_or("--target: missing")?);
    let out = PathBuf::from(get("--out").ok_or("--out: missing")?);
    let head: usize = num(get("--head-vocab"), "--head-vocab", 0)?;
    let carries_tokenizer = target_path.is_dir() || target_path.extension().is_some_and(|e| e == "gguf");
    if head > 0 || carries_tokenizer {
        if head == 0 {
            return Err("--head-vocab: a GGUF or folder target needs a restricted head (e.g. 4096)".into());
        }
        if !carries_tokenizer {
            return Err(
                "--head-vocab: needs a target that carries its tokenizer (GGUF file or model folder)".into(),
            );
        }
        let o = head_route::Opts {
            head,
            top_k: num(get("--top-k"), "--top-k", 32)?,
            story_seqs: num(get("--story-seqs"), "--story-seqs", 512)?,
            steps: num(get("--steps"), "--steps", 300)?,
            batch: num(get("--batch"), "--batch", 8)?,
            seq_len: num(get("--seq-len"), "--seq-len", 64)?,
            dim: num(get("--dim"), "--dim", 32)?,
            hidden: num(get("--hidden"), "--hidden", 64)?,
            layers: num(get("--layers"), "--layers", 2)?,
            heads: num(get("--heads"), "--heads", 4)?,
            kv_heads: num(get("--kv-heads"), "--kv-heads", 2)?,
            lr: num(get("--lr"), "--lr", 3e-3)?,
            cosine: match get("--lr-schedule").as_deref() {
                None | Some("constant") => false,
                Some("cosine") => true,
                Some(v) => return Err(format!("--lr-schedule: {v:?} is not constant or cosine")),
            },
            // Checked here, not when training starts after minutes of caching the target's passes.
            argmax_weight: spin_runtime::train::check_argmax_weight(num(
                get("--argmax-weight"),
                "--argmax-weight",
                0.0,
            )?)
            .map_err(|e| format!("--argmax-weight: {e}"))?,
            seed: num(get("--seed"), "--seed", 0)?,
            minutes: num(get("--minutes"), "--minutes", 0.0)?,
            init_layers: layers(get("--init-layers"))?,
            freeze_layers: num(get("--freeze-layers"), "--freeze-layers", 0)?,
            openings: num(get("--openings"), "--openings", 0)?,
            instructions: num(get("--instructions"), "--instructions", 48)?,
            self_instructions: num(get("--self-instructions"), "--self-instructions", 0)?,
            cache_file: get("--cache-file").filter(|v| *v != "none").map(PathBuf::from),
        };
        // Checked here, not after minutes of caching.
        if o.freeze_layers > 0 && o.freeze_layers >= o.init_layers.len() {
            return Err(format!(
                "--freeze-layers: {} would freeze every one of the {} layers --init-layers names",
                o.freeze_layers,
                o.init_layers.len()
            ));
        }
        return head_route::run(&target_path, &out, &o);
    }
    if get("--init-layers").is_some_and(|v| v != "none") {
        return Err("--init-layers: only with --head-vocab (a GGUF target)".into());
    }
    let target = llama2c::load_checkpoint(
        &target_path,
        &spin_runtime::select_device().map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let tc = target.config();
    let student = Config {
        vocab_size: tc.vocab_size,
        dim: num(get("--dim"), "--dim", 32)?,
        hidden_dim: num(get("--hidden"), "--hidden", 64)?,
        n_layers: num(get("--layers"), "--layers", 2)?,
        n_heads: num(get("--heads"), "--heads", 4)?,
        n_kv_heads: num(get("--kv-heads"), "--kv-heads", 2)?,
        max_seq_len: tc.max_seq_len,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: RopeStyle::Interleaved,
        qkv_bias: false,
        tied_embeddings: true,
    };
    let cfg = DistillConfig {
        student: student.clone(),
        steps: num(get("--steps"), "--steps", 300)?,
        batch: num(get("--batch"), "--batch", 8)?,
        seq_len: num(get("--seq-len"), "--seq-len", 64)?,
        learning_rate: num(get("--lr"), "--lr", 3e-3)?,
        seed: num(get("--seed"), "--seed", 0)?,
    };
    let start = std::time::Instant::now();
    let tensors = distill(&target, &cfg, |s| {
        if s.step % 10 == 0 || s.step + 1 == cfg.steps {
            println!(
                "step {:5}  KL {:.4} nats/token  {:.0} tokens/s  {:.1} s",
                s.step,
                s.kl,
                s.tokens_per_s,
                start.elapsed().as_secs_f64()
            );
        }
    })
    .map_err(|e| e.to_string())?;
    llama2c::write_checkpoint(&out, &student, &tensors).map_err(|e| e.to_string())?;
    println!("wrote {}", out.display());
    Ok(())
}
