//! `multispin measure`: acceptance rates, batched verification latency and goodput of real models, written as CSV
//! and SVG under `target/measure/`, plus a paper-A scenario file built from the measured numbers for `plan`.

use crate::chart::svg_lines;
use crate::failure::Failure;
use crate::pairing;
use anyhow::Context;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use spin_runtime::measure::{self as m, Uplink};
use spin_runtime::speculative;
use spin_runtime::{Model, Tokenizer};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Arguments of `multispin measure`.
#[derive(Debug, Args)]
pub struct MeasureArgs {
    #[command(flatten)]
    pub threads: crate::threads::ThreadArgs,
    #[command(subcommand)]
    what: What,
}

/// The models every measurement uses.
#[derive(Debug, Args)]
struct Models {
    /// Target model (llama2.c `.bin`, `.gguf`, or a Hugging Face folder).
    #[arg(long)]
    target: PathBuf,
    /// Tokenizer, when the target does not carry one.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Draft model.
    #[arg(long, conflicts_with = "self_draft_layers")]
    draft: Option<PathBuf>,
    /// Draft with the target's first N layers (self-speculation); the default when no --draft is given is 1.
    #[arg(long)]
    self_draft_layers: Option<usize>,
    /// Output folder.
    #[arg(long, default_value = "target/measure")]
    out: PathBuf,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Dequantise GGUF models to dense f32 after loading (a memory-bound target on the CPU: every pass reads all
    /// the weights; docs/runtime.md).
    #[arg(long)]
    dequantize: bool,
}

#[derive(Debug, Subcommand)]
enum What {
    /// α per prompt set: mean ± std over prompts of the per-prompt acceptance rate (paper A Table I).
    Acceptance {
        #[command(flatten)]
        models: Models,
        /// Text files to cut prompts from (one prompt set per file).
        #[arg(long, required = true, num_args = 1..)]
        prompts: Vec<PathBuf>,
        /// Prompts per set.
        #[arg(long, default_value_t = 16)]
        count: usize,
        /// Words per prompt.
        #[arg(long, default_value_t = 8)]
        words: usize,
        /// Draft length.
        #[arg(long, default_value_t = 4)]
        draft_len: usize,
        /// Tokens generated per prompt.
        #[arg(long, default_value_t = 48)]
        new_tokens: usize,
        /// Sampling temperature (a finite number ≥ 1e-6).
        #[arg(long, default_value_t = 1.0)]
        temperature: f64,
    },
    /// Batched verification latency for K = 1..=max_k and per-token drafting latency, with the affine fit.
    VerifyLatency {
        #[command(flatten)]
        models: Models,
        /// Largest batch.
        #[arg(long, default_value_t = 16)]
        max_k: usize,
        /// Draft length of every verified draft.
        #[arg(long, default_value_t = 8)]
        draft_len: usize,
        /// Tokens already in every cache.
        #[arg(long, default_value_t = 64)]
        prefix_len: usize,
        /// Timed rounds; each times one pass of every K, interleaved (the median per K is kept).
        #[arg(long, default_value_t = 7)]
        reps: usize,
    },
    /// Wall time of one forward pass of the target over `--positions` new positions in each of `--sequences`
    /// sequences after `--prefix-len` tokens in every cache, logits for every position (what a verification
    /// costs): median, min and max over `--reps` passes, each from the same caches (copying them is not timed), which have held the pass's positions once already, as a verifier's caches have between rounds.
    PassCost {
        #[command(flatten)]
        models: Models,
        /// New positions per sequence.
        #[arg(long, default_value_t = 40)]
        positions: usize,
        /// Sequences in the pass (devices whose drafts are verified together).
        #[arg(long, default_value_t = 1)]
        sequences: usize,
        /// Tokens already in every cache.
        #[arg(long, default_value_t = 64)]
        prefix_len: usize,
        /// Timed passes.
        #[arg(long, default_value_t = 7)]
        reps: usize,
    },
    /// Empirical sum goodput against draft length for K devices beside the paper-A formula (Fig. 3).
    Goodput {
        #[command(flatten)]
        models: Models,
        /// Text file to cut the devices' prompts from.
        #[arg(long)]
        prompts: PathBuf,
        /// Number of devices K.
        #[arg(long, default_value_t = 4)]
        devices: usize,
        /// Largest draft length.
        #[arg(long, default_value_t = 12)]
        max_draft_len: usize,
        /// Tokens generated per device and draft length.
        #[arg(long, default_value_t = 48)]
        new_tokens: usize,
        /// Total uplink bandwidth in Hz.
        #[arg(long, default_value_t = 10e6)]
        bandwidth_hz: f64,
        /// Uplink spectral efficiency in bit/s/Hz.
        #[arg(long, default_value_t = 5.0)]
        spectral_efficiency: f64,
        /// Sampling temperature (a finite number ≥ 1e-6).
        #[arg(long, default_value_t = 1.0)]
        temperature: f64,
    },
}

struct Loaded {
    target: Model,
    drafter: Model,
    tok: Tokenizer,
}

fn load(models: &Models) -> Result<Loaded, Failure> {
    let device = spin_runtime::select_device().map_err(|e| Failure::Runtime(e.into()))?;
    let mut target = spin_runtime::load_model(&models.target, &device).map_err(Failure::input)?;
    pairing::check_target(&target, Some(&models.target))?;
    if models.dequantize {
        target = target.dequantize().map_err(Failure::input)?;
    }
    let tok = crate::simulate::tokenizer_for(
        models.tokenizer.as_deref(),
        &target,
        "--target",
        Some(&models.target),
    )?;
    let drafter = match &models.draft {
        Some(p) => {
            let d = spin_runtime::load_model(p, &device).map_err(Failure::input)?;
            if models.dequantize {
                d.dequantize().map_err(Failure::input)?
            } else {
                d
            }
        }
        None => target
            .first_layers(models.self_draft_layers.unwrap_or(1))
            .map_err(Failure::input)?,
    };
    pairing::check_draft(&drafter, &target, "--draft")?;
    std::fs::create_dir_all(&models.out).with_context(|| format!("creating {}", models.out.display()))?;
    Ok(Loaded { target, drafter, tok })
}

/// The largest text file `measure --prompts` cuts prompts from, in bytes (docs/cli.md lists the limits): a corpus
/// of stories or plays, read whole, never a stream without end.
pub const MAX_CORPUS_BYTES: u64 = 64 << 20;

fn read_text(path: &Path) -> Result<String, Failure> {
    let first_line = |e: &dyn std::fmt::Display| e.to_string().lines().next().unwrap_or("").to_string();
    let bytes = spin_runtime::limits::read_limited(path, MAX_CORPUS_BYTES, "prompts")
        .map_err(|e| Failure::Input(format!("--prompts: {}", first_line(&e))))?;
    String::from_utf8(bytes)
        .map_err(|e| Failure::Input(format!("--prompts: {} is not UTF-8 text: {e}", path.display())))
}

/// The sampling of a measurement at `t`: the rule of every sampling command, less greedy decoding (a measured
/// acceptance is of sampled drafts).
fn positive_temperature(t: f64) -> Result<spin_core::SamplingParams, Failure> {
    let t = crate::temperature::check(t)?;
    if t == 0.0 {
        return Err(Failure::Input(
            "--temperature: 0 (greedy) is not measured here; give a finite number ≥ 1e-6".into(),
        ));
    }
    speculative::sampling(t).map_err(Failure::input)
}

/// Runs `multispin measure`.
pub fn run(args: &MeasureArgs) -> Result<(), Failure> {
    // SAFETY: `run` is called only by `main`, after argument parsing and before any thread is started.
    #[allow(unsafe_code)]
    unsafe {
        args.threads.set_up()?;
    }
    match &args.what {
        What::Acceptance {
            models,
            prompts,
            count,
            words,
            draft_len,
            new_tokens,
            temperature,
        } => acceptance(
            models,
            prompts,
            *count,
            *words,
            *draft_len,
            *new_tokens,
            *temperature,
        ),
        What::VerifyLatency {
            models,
            max_k,
            draft_len,
            prefix_len,
            reps,
        } => verify_latency_fit(models, *max_k, *draft_len, *prefix_len, *reps),
        What::PassCost {
            models,
            positions,
            sequences,
            prefix_len,
            reps,
        } => pass_cost(models, *positions, *sequences, *prefix_len, *reps),
        What::Goodput {
            models,
            prompts,
            devices,
            max_draft_len,
            new_tokens,
            bandwidth_hz,
            spectral_efficiency,
            temperature,
        } => goodput(
            models,
            prompts,
            *devices,
            *max_draft_len,
            *new_tokens,
            *bandwidth_hz,
            *spectral_efficiency,
            *temperature,
        ),
    }
}

/// `measure acceptance`: the acceptance rate per prompt set, as CSV and SVG.
fn acceptance(
    models: &Models,
    prompts: &[PathBuf],
    count: usize,
    words: usize,
    draft_len: usize,
    new_tokens: usize,
    temperature: f64,
) -> Result<(), Failure> {
    let params = positive_temperature(temperature)?;
    positive("--count", count)?;
    positive("--words", words)?;
    positive("--draft-len", draft_len)?;
    at_most("--count", count, MAX_DEVICES)?;
    // Two drafted tokens are the least an acceptance estimate needs.
    if new_tokens < 2 {
        return Err(Failure::Input(format!("--new-tokens: {new_tokens} is below 2")));
    }
    // Every file is read before the models load, so a bad one is refused at once.
    let texts = prompts
        .iter()
        .map(|p| read_text(p))
        .collect::<Result<Vec<_>, _>>()?;
    let l = load(models)?;
    let max_seq = l.target.config().max_seq_len;
    at_most("--new-tokens", new_tokens, max_seq)?;
    at_most("--draft-len", draft_len, max_seq)?;
    let mut csv = String::from("prompt_set,prompts,alpha_mean,alpha_std\n");
    let mut bars = Vec::new();
    for (i, (path, text)) in prompts.iter().zip(&texts).enumerate() {
        let ps = m::prompts_from_text(text, &l.tok, count, words, models.seed + i as u64)
            .map_err(Failure::input)?;
        fits_context(&l, &ps, new_tokens, draft_len)?;
        let name = path
            .file_stem()
            .map_or("prompts".into(), |s| s.to_string_lossy().into_owned());
        let bar = progress(ps.len() * new_tokens, &format!("{name}: tokens"));
        let alphas = m::acceptance_per_prompt(
            &l.target,
            &l.drafter,
            &ps,
            draft_len,
            new_tokens,
            params,
            models.seed,
            &mut |done| bar.set_position(done as u64),
        )
        .context("measuring acceptance")?;
        bar.finish_and_clear();
        let (mean, std) = m::mean_std(&alphas);
        writeln!(csv, "{name},{},{mean:.6},{std:.6}", alphas.len()).expect("writing to a String");
        println!("{name}: α = {mean:.4} ± {std:.4} over {} prompts", alphas.len());
        bars.push((name, mean));
    }
    write(&models.out.join("acceptance.csv"), &csv)?;
    let pts: Vec<(f64, f64)> = bars.iter().enumerate().map(|(i, b)| (i as f64, b.1)).collect();
    svg_lines(
        &models.out.join("acceptance.svg"),
        "Acceptance rate per prompt set",
        "prompt set index",
        "alpha",
        &[("alpha", &pts, true)],
    )?;
    Ok(())
}

/// `measure verify-latency`: batched verification latency against K and its robust affine fit.
fn verify_latency_fit(
    models: &Models,
    max_k: usize,
    draft_len: usize,
    prefix_len: usize,
    reps: usize,
) -> Result<(), Failure> {
    if max_k < 2 {
        return Err(Failure::Input(format!(
            "--max-k: {max_k} is below 2 (an affine fit needs two points)"
        )));
    }
    at_most("--max-k", max_k, m::MAX_VERIFY_BATCH)?;
    positive("--prefix-len", prefix_len)?;
    positive("--reps", reps)?;
    at_most("--reps", reps, 10_000)?;
    let l = load(models)?;
    let (robust, draft_s, pts) = verify_latency(&l, max_k, draft_len, prefix_len, reps, models.seed)?;
    let fit = robust.fit;
    let mut csv = String::from("k,verify_s,fit_s\n");
    for &(k, t) in &pts {
        writeln!(csv, "{k},{t:.6e},{:.6e}", fit.intercept + fit.slope * k).expect("writing to a String");
    }
    write(&models.out.join("verify_latency.csv"), &csv)?;
    let line: Vec<(f64, f64)> = pts
        .iter()
        .map(|&(k, _)| (k, fit.intercept + fit.slope * k))
        .collect();
    svg_lines(
        &models.out.join("verify_latency.svg"),
        "Batched verification latency",
        "K (drafts in the batch)",
        "seconds",
        &[("measured", &pts, true), ("T_fix + K T_lin", &line, false)],
    )?;
    println!("{}", describe_fit(&robust, draft_len));
    println!("drafting {:.4} ms/token", 1e3 * draft_s);
    Ok(())
}

/// `measure pass-cost`: the time of one pass over S sequences × P positions after a prefix.
fn pass_cost(
    models: &Models,
    positions: usize,
    sequences: usize,
    prefix_len: usize,
    reps: usize,
) -> Result<(), Failure> {
    positive("--positions", positions)?;
    positive("--sequences", sequences)?;
    at_most("--sequences", sequences, m::MAX_VERIFY_BATCH)?;
    positive("--reps", reps)?;
    at_most("--reps", reps, 10_000)?;
    let l = load(models)?;
    let cfg = l.target.config();
    let (vocab, max_seq) = (cfg.vocab_size, cfg.max_seq_len);
    if prefix_len + positions > max_seq {
        return Err(Failure::Input(format!(
            "--positions: {prefix_len} prefix + {positions} new positions exceed the context of \
             {max_seq} tokens"
        )));
    }
    // Deterministic, vocabulary-spread tokens: the cost of a pass does not depend on which tokens.
    let token = |i: usize| ((i * 7919 + 13) % vocab) as u32;
    let prefix: Vec<u32> = (0..prefix_len).map(token).collect();
    let mut base = l.target.new_cache();
    if !prefix.is_empty() {
        l.target.forward(&mut base, &prefix).context("prefix pass")?;
    }
    let inputs: Vec<Vec<u32>> = (0..sequences)
        .map(|s| {
            (0..positions)
                .map(|j| token(prefix_len + s * positions + j))
                .collect()
        })
        .collect();
    let refs: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        // A clone holds exactly its positions. The same pass run once untimed and cut off again leaves each cache
        // as a verifier's is between rounds: room for the positions, in memory already written (a pass into fresh
        // room would also time the kernel mapping its pages, which a decoder pays once per doubling), and
        // working buffers of the pass's size.
        let mut caches: Vec<_> = (0..sequences)
            .map(|_| {
                let mut c = base.clone();
                c.reserve(positions);
                c
            })
            .collect();
        let mut cref: Vec<&mut spin_runtime::KvCache> = caches.iter_mut().collect();
        l.target.forward_batch(&mut cref, &refs).context("untimed pass")?;
        for c in cref.iter_mut() {
            c.truncate(prefix_len).context("cutting the untimed pass off")?;
        }
        let start = std::time::Instant::now();
        l.target.forward_batch(&mut cref, &refs).context("timed pass")?;
        times.push(start.elapsed().as_secs_f64());
    }
    let (lo, hi) = times
        .iter()
        .fold((f64::INFINITY, 0f64), |(lo, hi), &t| (lo.min(t), hi.max(t)));
    println!(
        "pass of {sequences} × {positions} positions after a prefix of {prefix_len}: median {:.3} ms, \
         min {:.3} ms, max {:.3} ms over {reps} passes",
        1e3 * m::median(&times),
        1e3 * lo,
        1e3 * hi
    );
    Ok(())
}

/// `measure goodput`: empirical and formula goodput per draft length, and a paper-A scenario file from the
/// measured numbers.
#[allow(clippy::too_many_arguments)]
fn goodput(
    models: &Models,
    prompts: &Path,
    devices: usize,
    max_draft_len: usize,
    new_tokens: usize,
    bandwidth_hz: f64,
    spectral_efficiency: f64,
    temperature: f64,
) -> Result<(), Failure> {
    let params = positive_temperature(temperature)?;
    for (flag, v) in [
        ("--bandwidth-hz", bandwidth_hz),
        ("--spectral-efficiency", spectral_efficiency),
    ] {
        if !(v > 0.0 && v.is_finite()) {
            return Err(Failure::Input(format!(
                "{flag}: {v} is not a finite positive number"
            )));
        }
    }
    positive("--devices", devices)?;
    at_most("--devices", devices, MAX_DEVICES)?;
    positive("--max-draft-len", max_draft_len)?;
    if new_tokens < 2 {
        return Err(Failure::Input(format!("--new-tokens: {new_tokens} is below 2")));
    }
    // Read before the models load and the passes are timed, so a bad file is refused at once.
    let text = read_text(prompts)?;
    let l = load(models)?;
    let max_seq = l.target.config().max_seq_len;
    at_most("--new-tokens", new_tokens, max_seq)?;
    at_most("--max-draft-len", max_draft_len, max_seq.saturating_sub(33))?;
    let (robust, draft_s, _) = verify_latency(&l, devices.max(2), max_draft_len, 32, 5, models.seed)?;
    let fit = robust.fit;
    let ps = m::prompts_from_text(&text, &l.tok, devices, 8, models.seed).map_err(Failure::input)?;
    fits_context(&l, &ps, new_tokens, max_draft_len)?;
    let uplink = Uplink {
        bandwidth_hz,
        spectral_efficiency,
        distribution_bits: m::distribution_bits(l.target.config().vocab_size),
    };
    let mut csv = String::from("draft_len,alpha,empirical_tok_s,formula_tok_s\n");
    let (mut emp, mut form, mut alphas) = (Vec::new(), Vec::new(), Vec::new());
    let bar = progress(max_draft_len + 1, "draft lengths");
    for len in 0..=max_draft_len {
        let g = m::goodput(
            &l.target,
            &l.drafter,
            &ps,
            len,
            new_tokens,
            params,
            &uplink,
            &fit,
            models.seed,
        )
        .context("measuring goodput")?;
        writeln!(
            csv,
            "{len},{:.6},{:.6},{:.6}",
            g.alpha, g.empirical_tok_s, g.formula_tok_s
        )
        .expect("writing to a String");
        emp.push((len as f64, g.empirical_tok_s));
        form.push((len as f64, g.formula_tok_s));
        if g.alpha.is_finite() {
            alphas.push(g.alpha);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    write(&models.out.join("goodput.csv"), &csv)?;
    svg_lines(
        &models.out.join("goodput.svg"),
        "Sum goodput versus draft length",
        "draft length L",
        "tokens/s",
        &[("empirical", &emp, true), ("paper-A formula", &form, false)],
    )?;
    write_measured_scenario(
        &models.out,
        &alphas,
        &fit,
        draft_s,
        &uplink,
        max_draft_len,
        devices,
    )
}

/// The paper-A scenario file of a goodput measurement (`scenario.json` under `out`): the mean measured
/// acceptance, the verification fit and the drafting time for every device, on the measured uplink.
fn write_measured_scenario(
    out: &Path,
    alphas: &[f64],
    fit: &m::AffineFit,
    draft_s: f64,
    uplink: &Uplink,
    max_draft_len: usize,
    devices: usize,
) -> Result<(), Failure> {
    // A scenario needs α in (0, 1) and non-negative latencies; a measurement at the edge is moved inside
    // and said so, never changed silently.
    if alphas.is_empty() {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "no draft length gave an acceptance estimate: raise --new-tokens"
        )));
    }
    let measured = m::mean_std(alphas).0;
    let alpha = measured.clamp(1e-6, 1.0 - 1e-6);
    if alpha != measured {
        eprintln!("note: measured α = {measured} is outside (0, 1); scenario.json uses {alpha}");
    }
    if fit.intercept < 0.0 || fit.slope < 0.0 {
        eprintln!(
            "note: the verification fit T_fix = {}, T_lin = {} has a negative term; \
             scenario.json uses 0 for it",
            crate::number::si(fit.intercept, "s"),
            crate::number::si(fit.slope, "s")
        );
    }
    let scenario = serde_json::json!({
        "model": "paper-a",
        "bandwidth_hz": uplink.bandwidth_hz,
        "distribution_bits": uplink.distribution_bits,
        "verify_fixed_s": fit.intercept.max(0.0),
        "verify_per_device_s": fit.slope.max(0.0),
        "max_draft_len": max_draft_len,
        "devices": (0..devices).map(|_| serde_json::json!({
            "acceptance": alpha,
            "draft_token_s": draft_s,
            "spectral_efficiency": uplink.spectral_efficiency,
        })).collect::<Vec<_>>(),
    });
    let json = serde_json::to_string_pretty(&scenario).context("serialising the scenario")?;
    write(&out.join("scenario.json"), &json)?;
    println!(
        "wrote goodput.csv, goodput.svg and scenario.json to {} (α = {alpha:.4})",
        out.display()
    );
    Ok(())
}

type Latency = (m::RobustFit, f64, Vec<(f64, f64)>);

/// Most devices (prompts) a measurement runs at once; checked before anything is allocated.
const MAX_DEVICES: usize = m::MAX_VERIFY_BATCH;

fn positive(flag: &str, v: usize) -> Result<(), Failure> {
    if v == 0 {
        return Err(Failure::Input(format!("{flag}: must be positive")));
    }
    Ok(())
}

/// Refuses, before any work, a run whose longest prompt plus `new_tokens` plus one round's draft would pass the
/// context of the target or the drafter: the run would otherwise stop part-way and lose what it measured.
fn fits_context(
    l: &Loaded,
    prompts: &[Vec<u32>],
    new_tokens: usize,
    draft_len: usize,
) -> Result<(), Failure> {
    let context = l.target.config().max_seq_len.min(l.drafter.config().max_seq_len);
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let needed = longest + new_tokens + draft_len;
    if needed > context {
        let room = context.saturating_sub(longest + draft_len);
        return Err(Failure::Input(format!(
            "--new-tokens: a prompt of {longest} tokens, {new_tokens} new tokens and a draft of {draft_len} need \
             {needed} positions, above the context of {context}; use --new-tokens {room} or less"
        )));
    }
    Ok(())
}

fn at_most(flag: &str, v: usize, limit: usize) -> Result<(), Failure> {
    if v > limit {
        return Err(Failure::Input(format!(
            "{flag}: {v} exceeds the limit of {limit}"
        )));
    }
    Ok(())
}

fn verify_latency(
    l: &Loaded,
    max_k: usize,
    draft_len: usize,
    prefix_len: usize,
    reps: usize,
    seed: u64,
) -> Result<Latency, Failure> {
    // `verify_latency_samples` rejects a zero prefix_len or reps and a sweep past max_seq_len itself.
    let ks: Vec<usize> = (1..=max_k).collect();
    let bar = progress(reps, &format!("verifying K = 1..{max_k}"));
    let samples = m::verify_latency_samples(&l.target, &ks, prefix_len, draft_len, reps, &mut || bar.inc(1))
        .map_err(Failure::input)?;
    bar.finish_and_clear();
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed);
    let robust = m::robust_fit(&ks, &samples, m::BOOTSTRAP_RESAMPLES, &mut rng)
        .context("fitting the verification latency")?;
    let pts: Vec<(f64, f64)> = ks
        .iter()
        .zip(&samples)
        .map(|(&k, t)| (k as f64, m::median(t)))
        .collect();
    let draft_s = m::draft_token_latency_s(&l.drafter, prefix_len, 32).map_err(Failure::input)?;
    Ok((robust, draft_s, pts))
}

/// The fit in words: T_lin and the K_max/K_1 ratio with their intervals, and T_fix as a value only when its whole
/// interval is above zero (otherwise the fixed cost is not resolved, and only the interval is printed).
fn describe_fit(r: &m::RobustFit, draft_len: usize) -> String {
    let ms = |x: f64| 1e3 * x;
    let fix = if r.fixed_cost_resolved() {
        format!(
            "T_fix = {:.4} ms (95 % interval {:.4} to {:.4} ms)",
            ms(r.fit.intercept),
            ms(r.t_fix.low),
            ms(r.t_fix.high)
        )
    } else {
        format!(
            "T_fix: not resolved (95 % interval {:.4} to {:.4} ms reaches zero)",
            ms(r.t_fix.low),
            ms(r.t_fix.high)
        )
    };
    format!(
        "{fix}; T_lin = {:.4} ms per draft (95 % interval {:.4} to {:.4} ms); Theil–Sen on per-K medians, R² = {:.4}\n\
         cost of K = {} / K = {} at draft length {draft_len}: {:.3}× (95 % interval {:.3}× to {:.3}×)",
        ms(r.fit.slope),
        ms(r.t_lin.low),
        ms(r.t_lin.high),
        r.fit.r2,
        r.k_max,
        r.k_min,
        r.ratio,
        r.ratio_interval.low,
        r.ratio_interval.high
    )
}

/// A progress bar of `len` steps on stderr; indicatif hides it when stderr is not a terminal.
fn progress(len: usize, msg: &str) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    let style = ProgressStyle::with_template("{msg:>24} [{bar:40}] {pos}/{len} ({elapsed}, eta {eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(msg.to_owned());
    bar
}

fn write(path: &Path, text: &str) -> Result<(), Failure> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
