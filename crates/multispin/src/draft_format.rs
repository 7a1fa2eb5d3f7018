//! `--draft-format` of `generate` and `simulate`: how a draft model's dense matrices are held.

/// How a draft's dense matrices are held (`generate`/`simulate --draft-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DraftFormat {
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

impl DraftFormat {
    /// The host block format to quantise to; `None` for as stored.
    pub fn block_format(self) -> Option<spin_runtime::quant::BlockFormat> {
        use spin_runtime::quant::BlockFormat;
        match self {
            DraftFormat::AsStored => None,
            DraftFormat::Q8_0 => Some(BlockFormat::Q8_0),
            DraftFormat::Q4_0 => Some(BlockFormat::Q4_0),
            DraftFormat::Q4_1 => Some(BlockFormat::Q4_1),
        }
    }
}
