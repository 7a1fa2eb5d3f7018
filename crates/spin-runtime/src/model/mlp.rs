//! The feed-forward block: SwiGLU, down(silu(gate(x)) · up(x)), fused into one gate|up product and one kernel
//! on the CPU fast path.

use super::Model;
use super::weights::{Fused, Layer};
use crate::error::Result;
use crate::kernels::SwiGlu;
use candle_core::{D, Tensor};

impl Model {
    /// The block's output (B, T, dim) for the normed input `hn` (B, T, dim), to be added to the residual.
    /// `fused` says whether the CPU kernels run; `fw` holds the layer's fused dense weights when they exist.
    pub(super) fn mlp(&self, layer: &Layer, fused: bool, fw: Option<&Fused>, hn: &Tensor) -> Result<Tensor> {
        let (b, t, d) = hn.dims3()?;
        Ok(match fw {
            Some(f) => {
                let ff = hn
                    .reshape((b * t, d))?
                    .matmul(&f.gate_up)?
                    .apply_op1_no_bwd(&SwiGlu)?;
                ff.matmul(&f.down)?.reshape((b, t, d))?
            }
            None => {
                let (g, u) = (layer.gate.forward(hn)?, layer.up.forward(hn)?);
                let ff = if fused {
                    Tensor::cat(&[&g, &u], D::Minus1)?.apply_op1_no_bwd(&SwiGlu)?
                } else {
                    (g.silu()? * u)?
                };
                layer.down.forward(&ff)?
            }
        })
    }
}
