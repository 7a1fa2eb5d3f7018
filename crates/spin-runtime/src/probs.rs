//! From logits to the probability rows every decision of the runtime samples from: the sampling settings of a
//! temperature, one row or a batch of rows under them, and the one-pass argmax of greedy decoding. Below the
//! drafter, the verifier, the composed loop and plain decoding, which all share them.

use crate::error::{Result, RuntimeError};
use spin_core::{SamplingParams, probs_from_logits};

/// The index of the first largest entry of `row`; an error naming `logits` when the row is empty or holds NaN or
/// +∞ (as `spin_core::probs_from_logits` refuses them).
pub fn argmax(row: &[f32]) -> Result<u32> {
    let ((best, max), bad) = pulp::Arch::new().dispatch(crate::kernels::FirstMax { row });
    if row.is_empty() || bad || max == f32::NEG_INFINITY {
        return Err(RuntimeError::invalid(
            "logits",
            "need a finite largest entry (empty, NaN, +∞ or all −∞)",
        ));
    }
    Ok(best as u32)
}

/// Sampling settings: `temperature = 0` is greedy decoding (top-1, exactly reproducing argmax decoding).
pub fn sampling(temperature: f64) -> Result<SamplingParams> {
    if temperature == 0.0 {
        Ok(SamplingParams::new(1.0, Some(1), None)?)
    } else {
        Ok(SamplingParams::new(temperature, None, None)?)
    }
}

/// Turns logits (n, vocab) into n probability rows under `params`.
pub fn prob_rows(logits: &candle_core::Tensor, params: &SamplingParams) -> Result<Vec<Vec<f32>>> {
    let rows = logits.to_dtype(candle_core::DType::F32)?.to_vec2::<f32>()?;
    rows.iter()
        .map(|r| {
            let mut out = Vec::with_capacity(r.len());
            probs_into(r, params, &mut out)?;
            Ok(out)
        })
        .collect()
}

/// Writes one logits row's probabilities under `params` into `out`. Top-1 (temperature 0) is a one-hot row at the
/// first largest logit, found in one pass ([`argmax`]) instead of 512 exponentials and a
/// selection: the same row `probs_from_logits` gives (ties go to the smaller id in both), cheap enough for a
/// drafter whose whole step is a few microseconds (docs/runtime.md, "Draft step").
pub fn probs_into(row: &[f32], params: &SamplingParams, out: &mut Vec<f32>) -> Result<()> {
    if params.top_k() == Some(1) {
        let t = argmax(row)? as usize;
        out.clear();
        out.resize(row.len(), 0.0);
        out[t] = 1.0;
        return Ok(());
    }
    probs_from_logits(row, params, out)?;
    Ok(())
}
