//! Shannon rates of an AWGN link: spectral efficiency from SNR, bit rate from bandwidth, power and gain.

use crate::error::{ChannelError, non_negative, positive};

/// Spectral efficiency log₂(1 + snr) in bit/s/Hz (paper A, eq. 5).
pub fn spectral_efficiency(snr: f64) -> Result<f64, ChannelError> {
    non_negative("snr", snr)?;
    Ok(snr.ln_1p() / std::f64::consts::LN_2)
}

/// SNR = p·g / (N0·b) of a link of bandwidth b with transmit power p, power gain g and receiver noise density N0
/// (the argument of every Shannon rate here; paper A eq. 5, paper B's UL and DL rates).
///
/// Not validated: the planners call it in their inner loops on inputs their scenarios validated once.
pub fn snr(power_w: f64, gain: f64, noise_psd_w_per_hz: f64, bandwidth_hz: f64) -> f64 {
    power_w * gain / (noise_psd_w_per_hz * bandwidth_hz)
}

/// The SNR whose spectral efficiency is `spectral_efficiency` bit/s/Hz: 2^r − 1, the inverse of
/// [`spectral_efficiency`], computed as exp_m1(r ln 2) for accuracy at small r.
pub fn snr_for_spectral_efficiency(spectral_efficiency: f64) -> f64 {
    (spectral_efficiency * std::f64::consts::LN_2).exp_m1()
}

/// τ = bits / (b·log₂(1 + snr)) in seconds: the time to send `bits` over bandwidth b at the Shannon rate (paper B's
/// UL delay τ^ul and DL delay τ^dl), computed as bits·ln 2 / (b·ln(1 + snr)).
///
/// Not validated (planners' inner loops); snr = 0 gives +∞, as no bit gets through.
pub fn transfer_time_s(bits: f64, bandwidth_hz: f64, snr: f64) -> f64 {
    bits * std::f64::consts::LN_2 / (bandwidth_hz * snr.ln_1p())
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
    Ok(bandwidth_hz * spectral_efficiency(snr(power_w, gain, noise_psd_w_per_hz, bandwidth_hz))?)
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

    #[test]
    fn transfer_time_is_bits_over_the_shannon_rate() {
        // 1 MHz at SNR 1 carries 1 Mbit/s: 1e6 bits take 1 s.
        assert_eq!(snr(1e-3, 1e-10, 1e-19, 1e6), 1.0);
        assert!((transfer_time_s(1e6, 1e6, 1.0) - 1.0).abs() < 1e-15);
        // Against rate_bps on paper B's UL setting (34,816 bits, 10 MHz / 4, 15 dBm, −169 dBm/Hz).
        let (p, n0, b) = (
            crate::units::dbm_to_w(15.0),
            crate::units::dbm_per_hz_to_w_per_hz(-169.0),
            2.5e6,
        );
        for g in [1e-13, 1e-11, 1e-9] {
            let t = transfer_time_s(34_816.0, b, snr(p, g, n0, b));
            let r = rate_bps(b, p, g, n0).unwrap();
            assert!((t - 34_816.0 / r).abs() <= 1e-12 * t, "{t} vs {}", 34_816.0 / r);
        }
        assert_eq!(transfer_time_s(1.0, 1.0, 0.0), f64::INFINITY);
        for r in [1e-9, 0.5, 1.0, 10.0] {
            let back = spectral_efficiency(snr_for_spectral_efficiency(r)).unwrap();
            assert!((back - r).abs() <= 1e-12 * r, "{r} -> {back}");
        }
        assert_eq!(snr_for_spectral_efficiency(10.0), 1023.0);
    }
}
