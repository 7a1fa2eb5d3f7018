//! Wireless channel models for Multi-SPIN: unit conversions, path loss, Rayleigh block fading, Shannon rates.
//!
//! A leaf crate: no IO, no async; every random draw takes the caller's `&mut impl Rng`. SI units inside
//! (W, Hz, W/Hz, bit/s); dB and dBm exist only in the conversion functions of [`units`].

pub mod error;
pub mod fading;
pub mod paper_a;
pub mod paper_b;
pub mod rate;
pub mod units;

pub use error::ChannelError;
pub use fading::{PathLoss, rayleigh_power_gain};
pub use rate::{rate_bps, snr, snr_for_spectral_efficiency, spectral_efficiency, transfer_time_s};
