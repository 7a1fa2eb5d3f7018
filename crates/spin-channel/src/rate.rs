//! Shannon rates of an AWGN link: spectral efficiency from SNR, bit rate from bandwidth, power and gain.

use crate::error::{ChannelError, non_negative, positive};

/// Spectral efficiency log₂(1 + snr) in bit/s/Hz (paper A, eq. 5).
pub fn spectral_efficiency(snr: f64) -> Result<f64, ChannelError> {
    non_negative("snr", snr)?;
    Ok(snr.ln_1p() / std::f64::consts::LN_2)
}

/// Bit rate b·log₂(1 + p·g / (N0·b)) in bit/s of a link with bandwidth `bandwidth_hz`, transmit power
/// `power_w`, power gain `gain` and noise power spectral density `noise_psd_w_per_hz`.
pub fn rate_bps(
    bandwidth_hz: f64,
    power_w: f64,
    gain: f64,
    noise_psd_w_per_hz: f64,
) -> Result<f64, ChannelError> {
    positive("bandwidth_hz", bandwidth_hz)?;
    non_negative("power_w", power_w)?;
    positive("gain", gain)?;
    positive("noise_psd_w_per_hz", noise_psd_w_per_hz)?;
    let snr = power_w * gain / (noise_psd_w_per_hz * bandwidth_hz);
    Ok(bandwidth_hz * spectral_efficiency(snr)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shannon_reference_values() {
        assert_eq!(spectral_efficiency(0.0).unwrap(), 0.0);
        assert!((spectral_efficiency(1.0).unwrap() - 1.0).abs() < 1e-15);
        assert!((spectral_efficiency(1023.0).unwrap() - 10.0).abs() < 1e-12);
        // 1 MHz, SNR = 1e-3 W · 1e-10 / (1e-19 W/Hz · 1e6 Hz) = 1 → 1 Mbit/s.
        assert!((rate_bps(1e6, 1e-3, 1e-10, 1e-19).unwrap() - 1e6).abs() < 1e-6);
        assert!(
            rate_bps(-1.0, 1.0, 1.0, 1.0)
                .unwrap_err()
                .to_string()
                .starts_with("bandwidth_hz")
        );
        assert!(spectral_efficiency(f64::NAN).is_err());
    }
}
