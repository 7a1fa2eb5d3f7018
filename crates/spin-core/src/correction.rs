//! The correction step after a rejection, in the two directions of paper B: UL (the device uploads its q at the
//! rejected position, the server samples) and DL (the server downloads p, the device samples).
//!
//! Both modes compute the same residual norm(max(0, p − q)); they differ in which side holds which distribution
//! and which side draws, and that side is explicit in [`Mode::sampler`] and [`Correction::sampled_by`]. What
//! crosses the air may be the full distribution or a truncated / quantised [`SparseDist`]; then the residual is
//! computed from exactly what was received (see docs/exactness.md for when that stays exact).

use crate::CoreError;
use crate::chance::Chance;
use crate::dist::{Dist, SparseDist, Weight};
use crate::verify::sample_residual;

/// The direction of the correction exchange (UL or DL mode of paper B). The one mode type of the workspace: the
/// planners of `spin-optimize` choose it, the runtime and the networked system act on it. Serialised as `"ul"` and
/// `"dl"` (the names in plans, traces and `multispin correct` output).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Mode {
    /// The device uploads q_r; the server (which holds p_r) samples the correction.
    #[serde(rename = "ul")]
    Uplink,
    /// The server downloads p_r; the device (which holds q_r) samples the correction and reports it.
    #[serde(rename = "dl")]
    Downlink,
}

/// One end of the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The verifier holding the target model.
    Server,
    /// The drafting edge device.
    Device,
}

impl Mode {
    /// The side that draws the correction token.
    pub fn sampler(self) -> Side {
        match self {
            Mode::Uplink => Side::Server,
            Mode::Downlink => Side::Device,
        }
    }

    /// The side that sends its distribution.
    pub fn sender(self) -> Side {
        match self {
            Mode::Uplink => Side::Device,
            Mode::Downlink => Side::Server,
        }
    }
}

/// The distribution that crossed the air: in full, or truncated / quantised.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'s, 'a, W: Weight = f32> {
    /// The full dense distribution (V values of `W::BITS` bits, no indices).
    Full(Dist<'a, W>),
    /// The sparse form with its index and value bits.
    Sparse(&'s SparseDist),
}

impl<'s> Payload<'s, 'static, f32> {
    /// A sparse payload (`Payload::Sparse` with the unused dense type fixed, so no annotation is needed).
    pub fn sparse(s: &'s SparseDist) -> Self {
        Payload::Sparse(s)
    }
}

impl<W: Weight> Payload<'_, '_, W> {
    /// The bits on the air: V · `W::BITS` for a full distribution, V_eff(⌈log₂V⌉ + Q) for a sparse one.
    pub fn bits_on_air(&self) -> u64 {
        match self {
            Payload::Full(d) => d.len() as u64 * u64::from(W::BITS),
            Payload::Sparse(s) => s.bits_on_air(),
        }
    }

    fn vocab(&self) -> usize {
        match self {
            Payload::Full(d) => d.len(),
            Payload::Sparse(s) => s.vocab(),
        }
    }
}

/// The drawn correction and what it cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Correction {
    /// The mode used.
    pub mode: Mode,
    /// The correction token, drawn from the residual.
    pub token: u32,
    /// Which side drew it (`mode.sampler()`).
    pub sampled_by: Side,
    /// The size of the exchanged distribution in bits.
    pub bits_on_air: u64,
}

/// Draws the correction at the rejected position on the sampling side of `mode`.
///
/// `local` is the distribution the sampling side holds (p_r at the server for UL, q_r at the device for DL);
/// `received` is what crossed the air from the other side. A sparse payload is expanded into `scratch`
/// (resized to V and reused across calls, so there is no allocation once warm).
///
/// ```
/// use spin_core::{Dist, SparseDist};
/// use spin_core::correction::{Mode, Payload, Side, correct};
/// use rand::SeedableRng;
///
/// let p = [0.7f32, 0.2, 0.1, 0.0];
/// let q = [0.1f32, 0.3, 0.3, 0.3];
/// let (p, q) = (Dist::new(&p)?, Dist::new(&q)?);
/// let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
/// let mut scratch = Vec::new();
/// // UL: the device sends its q, truncated to 3 entries and quantised to 8 bits; the server samples.
/// let sent = SparseDist::truncate(q, 3)?.quantise(8)?;
/// let c = correct(Mode::Uplink, p, Payload::sparse(&sent), &mut scratch, &mut rng)?;
/// assert_eq!((c.token, c.sampled_by, c.bits_on_air), (0, Side::Server, 3 * (2 + 8)));
/// // DL: the server sends p in full; the device samples.
/// let c = correct(Mode::Downlink, q, Payload::Full(p), &mut scratch, &mut rng)?;
/// assert_eq!((c.token, c.sampled_by), (0, Side::Device));
/// # Ok::<(), spin_core::CoreError>(())
/// ```
pub fn correct<Wl: Weight, Wr: Weight, C: Chance + ?Sized>(
    mode: Mode,
    local: Dist<'_, Wl>,
    received: Payload<'_, '_, Wr>,
    scratch: &mut Vec<f32>,
    chance: &mut C,
) -> Result<Correction, CoreError> {
    if received.vocab() != local.len() {
        return Err(CoreError::invalid(
            "received",
            format!(
                "has a vocabulary of {} but the local distribution has {}",
                received.vocab(),
                local.len()
            ),
        ));
    }
    let bits_on_air = received.bits_on_air();
    let token = match received {
        Payload::Full(r) => residual_for(mode, local, r, chance)?,
        Payload::Sparse(s) => {
            s.write_dense(scratch);
            let r =
                Dist::new(scratch.as_slice()).map_err(|e| CoreError::invalid("received", e.to_string()))?;
            residual_for(mode, local, r, chance)?
        }
    };
    Ok(Correction {
        mode,
        token,
        sampled_by: mode.sampler(),
        bits_on_air,
    })
}

fn residual_for<Wl: Weight, Wr: Weight, C: Chance + ?Sized>(
    mode: Mode,
    local: Dist<'_, Wl>,
    received: Dist<'_, Wr>,
    chance: &mut C,
) -> Result<u32, CoreError> {
    match mode {
        Mode::Uplink => sample_residual(local, received, chance),
        Mode::Downlink => sample_residual(received, local, chance),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_keep_their_names_in_files_and_output() {
        // Plans, traces and `multispin correct` write the modes as `ul` and `dl`; nothing else is read.
        assert_eq!(
            serde_json::to_string(&[Mode::Uplink, Mode::Downlink]).unwrap(),
            r#"["ul","dl"]"#
        );
        let back: Vec<Mode> = serde_json::from_str(r#"["dl","ul"]"#).unwrap();
        assert_eq!(back, [Mode::Downlink, Mode::Uplink]);
        assert!(serde_json::from_str::<Mode>(r#""uplink""#).is_err());
    }
}
