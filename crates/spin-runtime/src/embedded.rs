//! The models committed under `models/` (see models/PROVENANCE.md), compiled into the binary so that commands,
//! tests and benchmarks can default to them without any file: the stories260K target (karpathy/tinyllamas, MIT),
//! its tok512 tokenizer, and a 2-layer, width-32 draft distilled from that target by `cargo xtask distill`.

use crate::error::Result;
use crate::llama2c::{Llama2cTokenizer, parse_checkpoint};
use crate::model::Model;
use candle_core::Device;

/// stories260K as a llama2.c v0 checkpoint (dim 64, 5 layers, 8 heads, 4 kv heads, vocab 512, 512 positions).
pub const TARGET: &[u8] = include_bytes!("../../../models/stories260K.bin");

/// The llama2.c tokenizer of [`TARGET`] and [`DRAFT`] (512 entries).
pub const TOKENIZER: &[u8] = include_bytes!("../../../models/tok512.bin");

/// The default draft model: 2 layers, dim 32, distilled from [`TARGET`] (same tokenizer), a llama2.c v0 file.
pub const DRAFT: &[u8] = include_bytes!("../../../models/draft-2x32.bin");

/// [`TARGET`] loaded on `device`.
pub fn target(device: &Device) -> Result<Model> {
    let (cfg, map) = parse_checkpoint(TARGET, "embedded stories260K", device)?;
    Model::from_source(cfg, &map, device)
}

/// [`DRAFT`] loaded on `device`.
pub fn draft(device: &Device) -> Result<Model> {
    let (cfg, map) = parse_checkpoint(DRAFT, "embedded draft", device)?;
    Model::from_source(cfg, &map, device)
}

/// [`TOKENIZER`] parsed.
pub fn tokenizer() -> Result<Llama2cTokenizer> {
    Llama2cTokenizer::parse(TOKENIZER, 512, "embedded tok512")
}
