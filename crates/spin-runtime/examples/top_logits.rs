//! The K largest next-token logits after a prompt, from a model as its file stores it (the quantised host route for
//! a GGUF file on the CPU) and from the same model dequantised to f32: what decides a greedy token where two
//! runtimes' texts part (an argmax near-tie under different rounding, or a bug).
//!
//! `cargo run --release -p spin-runtime --example top_logits -- MODEL "PROMPT" [K]` (K defaults to 3; BOS as the
//! file says).

use std::process::ExitCode;

fn top(
    model: &spin_runtime::Model,
    tok: &spin_runtime::Tokenizer,
    ids: &[u32],
    k: usize,
) -> Result<String, String> {
    let e = |e: spin_runtime::RuntimeError| e.to_string();
    let v = model.config().vocab_size;
    let mut cache = model.new_cache();
    let rows = model.forward_logits(&mut cache, ids).map_err(e)?;
    let last = &rows[rows.len() - v..];
    let mut order: Vec<usize> = (0..v).collect();
    order.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
    let mut out = Vec::with_capacity(k);
    for &i in order.iter().take(k) {
        out.push(format!(
            "{:?} {:.3}",
            tok.decode(&[i as u32]).map_err(e)?,
            last[i]
        ));
    }
    Ok(out.join(", "))
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: top_logits MODEL \"PROMPT\" [K]";
    let path = std::path::PathBuf::from(args.next().ok_or(usage)?);
    let prompt = args.next().ok_or(usage)?;
    let k: usize = match args.next() {
        Some(v) => v.parse().map_err(|_| format!("K: {v:?} is not a count"))?,
        None => 3,
    };
    let e = |e: spin_runtime::RuntimeError| e.to_string();
    let device = spin_runtime::select_device().map_err(e)?;
    let model = spin_runtime::load_model(&path, &device).map_err(e)?;
    let tok = spin_runtime::load_tokenizer(None, &path, model.config().vocab_size).map_err(e)?;
    let ids = tok.encode(&prompt, tok.add_bos()).map_err(e)?;
    if ids.is_empty() {
        return Err("PROMPT: no tokens".into());
    }
    println!("as stored: {}", top(&model, &tok, &ids, k)?);
    println!(
        "dequantised to f32: {}",
        top(&model.dequantize().map_err(e)?, &tok, &ids, k)?
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
