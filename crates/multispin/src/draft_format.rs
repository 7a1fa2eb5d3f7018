//! `--draft-format` of `generate`, `simulate` and `device`: how a draft model's dense matrices are held.

use spin_runtime::Model;
use spin_runtime::quant::BlockFormat;

/// How a draft's dense matrices are held (`--draft-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DraftFormat {
    // Q8_0 for a dense draft of more than a million weights whose widths are whole blocks, else as stored.
    Auto,
    // As the file stores it.
    AsStored,
    // 8-bit blocks of 32 (one f16 scale each).
    #[value(name = "q8_0")]
    Q8_0,
    // 4-bit blocks of 32 (one f16 scale each).
    #[value(name = "q4_0")]
    Q4_0,
    // 4-bit blocks of 32 (an f16 scale and minimum each).
    #[value(name = "q4_1")]
    Q4_1,
}

/// Weights from which `auto` quantises a dense draft. A draft step reads every weight once; above about a million
/// (4 MB in f32, twice a core's L2 on the development machines) the step waits for those bytes, not for its
/// arithmetic: SmolLM2's distilled draft (5.9 M weights) took 1.10 ms a token as stored and 0.22 in Q8_0
/// (docs/runtime.md), while the embedded stories260K draft, whose weights sit in L2, is left in f32.
const AUTO_WEIGHTS: usize = 1 << 20;

impl DraftFormat {
    /// The host block format to quantise draft `d` to; `None` to run it as stored.
    pub fn for_draft(self, d: &Model) -> Option<BlockFormat> {
        match self {
            DraftFormat::Auto => {
                let c = d.config();
                let block = BlockFormat::Q8_0.block_elems();
                let weights: usize = spin_runtime::model::tensor_shapes(c)
                    .iter()
                    .map(|(_, shape)| shape.iter().product::<usize>())
                    .sum();
                let fits = c.dim.is_multiple_of(block) && c.hidden_dim.is_multiple_of(block);
                (d.is_dense() && fits && weights > AUTO_WEIGHTS).then_some(BlockFormat::Q8_0)
            }
            DraftFormat::AsStored => None,
            DraftFormat::Q8_0 => Some(BlockFormat::Q8_0),
            DraftFormat::Q4_0 => Some(BlockFormat::Q4_0),
            DraftFormat::Q4_1 => Some(BlockFormat::Q4_1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spin_runtime::model::{model_from_tensors, random_tensors};
    use spin_runtime::{Config, RopeStyle};

    fn dense(vocab: usize, dim: usize, hidden: usize) -> Model {
        let cfg = Config {
            vocab_size: vocab,
            dim,
            hidden_dim: hidden,
            n_layers: 1,
            n_heads: 4,
            n_kv_heads: 2,
            max_seq_len: 16,
            rms_eps: 1e-5,
            rope_theta: 10000.0,
            rope: RopeStyle::Interleaved,
            qkv_bias: false,
            tied_embeddings: true,
        };
        let device = spin_runtime::select_device().unwrap();
        model_from_tensors(
            cfg.clone(),
            random_tensors(&cfg, 0.1, 1, &device).unwrap(),
            &device,
        )
        .unwrap()
    }

    /// `auto` quantises a dense draft to Q8_0 from a million weights on, where its widths are whole blocks, and
    /// leaves a small one, one of other widths and an already quantised one as stored; the explicit formats are
    /// what they say.
    #[test]
    fn auto_quantises_large_dense_drafts_only() {
        // 4,096 · 256 embedding weights alone: 1,048,576 (the threshold), plus the layer's: above it.
        let large = dense(4096, 256, 512);
        assert_eq!(DraftFormat::Auto.for_draft(&large), Some(BlockFormat::Q8_0));
        let small = dense(512, 64, 128);
        assert_eq!(DraftFormat::Auto.for_draft(&small), None);
        let odd = dense(8192, 264, 512);
        assert_eq!(
            DraftFormat::Auto.for_draft(&odd),
            None,
            "264 is not a whole number of 32-value blocks"
        );
        let quantised = large.quantize_host(BlockFormat::Q8_0).unwrap();
        assert_eq!(DraftFormat::Auto.for_draft(&quantised), None);
        assert_eq!(DraftFormat::AsStored.for_draft(&large), None);
        assert_eq!(DraftFormat::Q4_0.for_draft(&small), Some(BlockFormat::Q4_0));
        assert_eq!(DraftFormat::Q4_1.for_draft(&small), Some(BlockFormat::Q4_1));
        assert_eq!(DraftFormat::Q8_0.for_draft(&small), Some(BlockFormat::Q8_0));
    }
}
