//! Conversions between logarithmic units (dB, dBm, dBm/Hz) and SI units, used only at the edges.

/// dB to a linear power ratio: 10^(dB/10).
pub fn db_to_linear(db: f64) -> f64 {
    10f64.powf(db / 10.0)
}

/// A linear power ratio to dB.
pub fn linear_to_db(ratio: f64) -> f64 {
    10.0 * ratio.log10()
}

/// dBm to watts: 10^((dBm − 30)/10).
pub fn dbm_to_w(dbm: f64) -> f64 {
    db_to_linear(dbm - 30.0)
}

/// Watts to dBm.
pub fn w_to_dbm(w: f64) -> f64 {
    linear_to_db(w) + 30.0
}

/// A noise power spectral density in dBm/Hz to W/Hz (e.g. −169 dBm/Hz ≈ 1.26e−20 W/Hz).
pub fn dbm_per_hz_to_w_per_hz(dbm_per_hz: f64) -> f64 {
    dbm_to_w(dbm_per_hz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reference_values() {
        assert!((dbm_to_w(30.0) - 1.0).abs() < 1e-15);
        assert!((dbm_to_w(15.0) - 0.031_622_776_601_683_79).abs() < 1e-15);
        assert!((dbm_per_hz_to_w_per_hz(-169.0) - 1.258_925_411_794_167e-20).abs() < 1e-32);
        for x in [-40.0, -3.0, 0.0, 17.5, 46.0] {
            assert!((w_to_dbm(dbm_to_w(x)) - x).abs() < 1e-12);
            assert!((linear_to_db(db_to_linear(x)) - x).abs() < 1e-12);
        }
    }
}
