//! Pearson's chi-square test of speculative sampling on a real target and draft: the first two tokens that the
//! speculative loop (`Speculator`, draft length L) generates after a fixed prompt, counted over many seeded runs,
//! against their exact joint distribution under the target alone, p(t1) · p(t2 | t1), computed by the target's
//! own passes. Exact, not approximated: every first token among the most probable ones (until 0.999 of the mass,
//! at most 64) has its own row of 2-token cells, and all other first tokens share one cell whose expectation is the
//! rest of the mass; cells expected below 5 are pooled in ascending order of expectation (fixed by the
//! expectations, never by the counts). A negative control tests the same first tokens against the draft's own
//! distribution, which must be rejected. Prints the statistic, degrees of freedom and p-value of each test.
//!
//! Usage: exactness --target PATH --draft PATH [--draft-format as-stored|q8_0|q4_0|q4_1] [--prompt TEXT]
//!        [--draft-len 4] [--temperature 1] [--samples 4096] [--seed 0] [--lookup N] [--lookup-stop M]
//!
//! scripts/chi2-smollm2.sh runs it on SmolLM2-135M-Instruct and its distilled draft.

use spin_runtime::quant::BlockFormat;
use spin_runtime::speculative::{SpecConfig, Speculator, prob_rows, sampling};
use spin_runtime::{Model, load_model, load_tokenizer, select_device};
use statrs::distribution::{ChiSquared, ContinuousCDF};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Devices per speculative run: copies of the prompt, each with its own random stream.
const BATCH: usize = 64;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

struct Args {
    target: PathBuf,
    draft: PathBuf,
    format: Option<BlockFormat>,
    prompt: String,
    draft_len: usize,
    temperature: f64,
    samples: usize,
    seed: u64,
    /// `--lookup N` (0: off) and `--lookup-stop M`: prompt lookup while drafting, as `generate` takes them.
    lookup: usize,
    lookup_stop: usize,
}

fn parse() -> Result<Args, String> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.chunks(2);
    let mut a = Args {
        target: PathBuf::new(),
        draft: PathBuf::new(),
        format: None,
        prompt: "Once upon a time, there was a little".to_owned(),
        draft_len: 4,
        temperature: 1.0,
        samples: 4096,
        seed: 0,
        lookup: 0,
        lookup_stop: 0,
    };
    let num = |flag: &str, v: &str| -> Result<f64, String> {
        v.parse::<f64>()
            .map_err(|_| format!("{flag}: {v:?} is not a number"))
    };
    for pair in it.by_ref() {
        let [flag, v] = pair else {
            return Err(format!("{}: needs a value", pair[0]));
        };
        match flag.as_str() {
            "--target" => a.target = v.into(),
            "--draft" => a.draft = v.into(),
            "--draft-format" => {
                a.format = match v.as_str() {
                    "as-stored" => None,
                    "q8_0" => Some(BlockFormat::Q8_0),
                    "q4_0" => Some(BlockFormat::Q4_0),
                    "q4_1" => Some(BlockFormat::Q4_1),
                    _ => {
                        return Err(format!(
                            "--draft-format: {v:?} is not as-stored, q8_0, q4_0 or q4_1"
                        ));
                    }
                }
            }
            "--prompt" => a.prompt = v.clone(),
            "--draft-len" => a.draft_len = v.parse().map_err(|_| format!("--draft-len: {v:?}"))?,
            "--temperature" => a.temperature = num(flag, v)?,
            "--samples" => a.samples = v.parse().map_err(|_| format!("--samples: {v:?}"))?,
            "--seed" => a.seed = v.parse().map_err(|_| format!("--seed: {v:?}"))?,
            "--lookup" => a.lookup = v.parse().map_err(|_| format!("--lookup: {v:?}"))?,
            "--lookup-stop" => a.lookup_stop = v.parse().map_err(|_| format!("--lookup-stop: {v:?}"))?,
            _ => {
                return Err(format!(
                    "{flag}: unknown option (see the usage in the example's source)"
                ));
            }
        }
    }
    if a.target.as_os_str().is_empty() || a.draft.as_os_str().is_empty() {
        return Err("--target and --draft are required".into());
    }
    if !(a.temperature > 0.0 && a.temperature.is_finite()) {
        return Err(format!(
            "--temperature: {} is not > 0 (at 0 the test has one cell)",
            a.temperature
        ));
    }
    if a.samples < BATCH || a.draft_len == 0 {
        return Err(format!("--samples: at least {BATCH}; --draft-len: at least 1"));
    }
    Ok(a)
}

/// Pearson's statistic and degrees of freedom of `counts` against expectations `expected` (same order), cells
/// expected below 5 pooled in ascending order of expectation.
fn chi_square(counts: &[u64], expected: &[f64]) -> (f64, usize) {
    let mut cells: Vec<(f64, f64)> = counts
        .iter()
        .zip(expected)
        .map(|(&c, &e)| (c as f64, e))
        .collect();
    cells.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (mut merged, mut pool) = (Vec::new(), (0.0, 0.0));
    for (o, e) in cells {
        pool = (pool.0 + o, pool.1 + e);
        if pool.1 >= 5.0 {
            merged.push(pool);
            pool = (0.0, 0.0);
        }
    }
    if let Some(last) = merged.last_mut() {
        *last = (last.0 + pool.0, last.1 + pool.1);
    }
    let stat = merged.iter().map(|(o, e)| (o - e).powi(2) / e).sum();
    (stat, merged.len().saturating_sub(1))
}

fn p_value(stat: f64, df: usize) -> Result<f64, String> {
    let d = ChiSquared::new(df.max(1) as f64).map_err(|e| e.to_string())?;
    Ok(1.0 - d.cdf(stat))
}

/// The next-token distribution of `model` after `prompt` under `params`, over the full vocabulary (a restricted
/// head's row expanded: q = 0 off its tokens, as the drafter samples).
fn next_probs(model: &Model, prompt: &[u32], params: &spin_core::SamplingParams) -> Result<Vec<f64>, String> {
    let e = |e: spin_runtime::RuntimeError| e.to_string();
    let c = |e: candle_core::Error| e.to_string();
    let mut cache = model.new_cache();
    let mut input = Vec::new();
    match model.head_vocab() {
        Some(hv) => hv.map_tokens(prompt, &mut input).map_err(e)?,
        None => input.extend_from_slice(prompt),
    }
    let l = model.forward(&mut cache, &input).map_err(e)?;
    let mut row = l.narrow(0, prompt.len() - 1, 1).map_err(c)?;
    if let Some(hv) = model.head_vocab() {
        let compact = row.flatten_all().map_err(c)?.to_vec1::<f32>().map_err(c)?;
        let mut full = Vec::new();
        hv.expand_logits(&compact, &mut full).map_err(e)?;
        let n = full.len();
        row = candle_core::Tensor::from_vec(full, (1, n), &candle_core::Device::Cpu).map_err(c)?;
    }
    let p = prob_rows(&row, params).map_err(e)?;
    Ok(p[0].iter().map(|&x| f64::from(x)).collect())
}

fn run() -> Result<(), String> {
    let a = parse()?;
    let device = select_device().map_err(|e| e.to_string())?;
    let target = load_model(&a.target, &device).map_err(|e| e.to_string())?;
    let draft = load_model(&a.draft, &device).map_err(|e| e.to_string())?;
    let draft = match a.format {
        None => draft,
        Some(f) => draft.quantize_host(f).map_err(|e| e.to_string())?,
    };
    let v = target.config().vocab_size;
    let tok = load_tokenizer(None, &a.target, v).map_err(|e| e.to_string())?;
    let prompt = tok.encode(&a.prompt, tok.add_bos()).map_err(|e| e.to_string())?;
    let params = sampling(a.temperature).map_err(|e| e.to_string())?;
    // The exact joint distribution of the first two tokens.
    let p1 = next_probs(&target, &prompt, &params)?;
    let mut order: Vec<usize> = (0..v).collect();
    order.sort_by(|&x, &y| p1[y].total_cmp(&p1[x]));
    let (mut firsts, mut mass) = (Vec::new(), 0.0);
    for &t in &order {
        if mass >= 0.999 || firsts.len() == 64 {
            break;
        }
        firsts.push(t);
        mass += p1[t];
    }
    let mut expected = vec![0.0; firsts.len() * v + 1];
    for (i, &t1) in firsts.iter().enumerate() {
        let mut longer = prompt.clone();
        longer.push(t1 as u32);
        let p2 = next_probs(&target, &longer, &params)?;
        for (t2, &q) in p2.iter().enumerate() {
            expected[i * v + t2] = p1[t1] * q;
        }
    }
    let row_of = |t: usize| firsts.iter().position(|&f| f == t);
    *expected.last_mut().expect("one cell at least") = (1.0 - expected.iter().sum::<f64>()).max(0.0);
    println!(
        "prompt {:?} ({} tokens): {} first tokens hold {:.4} of the target's mass; temperature {}, draft length {}",
        a.prompt,
        prompt.len(),
        firsts.len(),
        mass,
        a.temperature,
        a.draft_len
    );
    // Speculative samples, BATCH devices per run.
    let runs = a.samples.div_ceil(BATCH);
    let n = runs * BATCH;
    let mut counts = vec![0u64; expected.len()];
    let mut first_counts = vec![0u64; v];
    let start = Instant::now();
    let mut looked_up = 0usize;
    let lookup = (a.lookup > 0).then_some(spin_runtime::drafter::Lookup {
        ngram: a.lookup,
        weight: 0.5,
    });
    for r in 0..runs {
        let prompts = vec![prompt.clone(); BATCH];
        let cfg = SpecConfig {
            params,
            max_new_tokens: 2,
            eos: None,
            seed: a.seed.wrapping_mul(1_000_003).wrapping_add(r as u64),
        };
        let mut s = Speculator::new(&target, &draft, &prompts, &vec![a.draft_len; BATCH], cfg)
            .map_err(|e| e.to_string())?;
        s.set_lookup(lookup, a.lookup_stop).map_err(|e| e.to_string())?;
        s.run().map_err(|e| e.to_string())?;
        looked_up += s.looked_up().iter().sum::<usize>();
        for d in &s.devices {
            let g = d.generated();
            let (t1, t2) = (g[0] as usize, g[1] as usize);
            first_counts[t1] += 1;
            counts[row_of(t1).map_or(expected.len() - 1, |i| i * v + t2)] += 1;
        }
        if (r + 1) % 8 == 0 || r + 1 == runs {
            eprintln!(
                "{} / {n} samples  {:.1} s",
                (r + 1) * BATCH,
                start.elapsed().as_secs_f64()
            );
        }
    }
    let scaled: Vec<f64> = expected.iter().map(|e| e * n as f64).collect();
    let (stat, df) = chi_square(&counts, &scaled);
    println!(
        "joint (t1, t2) against the target: chi-square {stat:.2}, {df} degrees of freedom, p = {:.4} \
         ({n} samples, {looked_up} drafted tokens looked up)",
        p_value(stat, df)?
    );
    let t1_target: Vec<f64> = p1.iter().map(|p| p * n as f64).collect();
    let (stat, df) = chi_square(&first_counts, &t1_target);
    println!(
        "first token against the target: chi-square {stat:.2}, {df} degrees of freedom, p = {:.4}",
        p_value(stat, df)?
    );
    let q1 = next_probs(&draft, &prompt, &params)?;
    let t1_draft: Vec<f64> = q1.iter().map(|q| q * n as f64).collect();
    let (stat, df) = chi_square(&first_counts, &t1_draft);
    println!(
        "negative control, first token against the draft: chi-square {stat:.2}, {df} degrees of freedom, p = {:.3e} \
         (must be small)",
        p_value(stat, df)?
    );
    Ok(())
}
