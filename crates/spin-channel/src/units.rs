//! Conversions between logarithmic units (dB, dBm, dBm/Hz) and SI units, used only at the edges, and the rule
//! every file of the project follows for them: a quantity may be written in its SI unit or in the unit radio
//! engineers use (`bandwidth_hz` or `bandwidth_mhz`, `ul_power_w` or `ul_power_dbm`, `noise_psd_server_w_per_hz`
//! or `noise_psd_server_dbm_per_hz`, `channel_gain` or `channel_gain_db`), exactly one of each pair
//! (docs/cli.md, "Reproduction configs").

use crate::ChannelError;

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

/// MHz to Hz.
pub fn mhz_to_hz(mhz: f64) -> f64 {
    mhz * 1e6
}

/// How the second field of a unit pair converts to the unit of the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversion {
    /// MHz to Hz ([`mhz_to_hz`]).
    MhzToHz,
    /// dBm to W ([`dbm_to_w`]).
    DbmToW,
    /// dBm/Hz to W/Hz ([`dbm_per_hz_to_w_per_hz`]).
    DbmPerHzToWPerHz,
    /// dB to a linear ratio ([`db_to_linear`]).
    DbToLinear,
    /// W to dBm ([`w_to_dbm`]), for files whose first field is logarithmic (a figure axis in dBm).
    WToDbm,
    /// A linear power ratio to dB ([`linear_to_db`]), for files whose first field is in dB (a path-loss gain).
    LinearToDb,
}

impl Conversion {
    /// Converts `value`, or says why the result is not a usable value of the first field's unit.
    pub fn apply(self, value: f64) -> Result<f64, String> {
        let out = match self {
            Conversion::MhzToHz => mhz_to_hz(value),
            Conversion::DbmToW => dbm_to_w(value),
            Conversion::DbmPerHzToWPerHz => dbm_per_hz_to_w_per_hz(value),
            Conversion::DbToLinear => db_to_linear(value),
            Conversion::WToDbm => w_to_dbm(value),
            Conversion::LinearToDb => linear_to_db(value),
        };
        match self {
            Conversion::WToDbm | Conversion::LinearToDb if out.is_finite() => Ok(out),
            Conversion::WToDbm => Err(format!(
                "{} W converts to {out} dBm, not a finite number (the power must be positive)",
                show(value)
            )),
            Conversion::LinearToDb => Err(format!(
                "{} converts to {out} dB, not a finite number (the ratio must be positive)",
                show(value)
            )),
            _ if out.is_finite() && out > 0.0 => Ok(out),
            _ => Err(format!(
                "{} converts to {out:e} in SI units, not a finite positive number",
                show(value)
            )),
        }
    }
}

/// A number as a user wrote it: plain for ordinary magnitudes, in exponent form for huge or tiny ones (so 1e308
/// does not print as 309 digits).
fn show(value: f64) -> String {
    let a = value.abs();
    if a == 0.0 || !a.is_finite() || (1e-4..1e9).contains(&a) {
        format!("{value}")
    } else {
        format!("{value:e}")
    }
}

/// The error of a unit pair given twice (`both`) or not at all, naming both fields.
fn not_one(first: &str, second: &str, both: bool) -> ChannelError {
    ChannelError::Field {
        field: format!("{first}, {second}"),
        reason: if both {
            "give exactly one of the pair, not both".into()
        } else {
            "missing (give exactly one of the pair)".into()
        },
    }
}

/// One quantity that a file may write under either of two names (`first` in the unit the program uses, `second`
/// converted by `conversion`): exactly one must be present. The first is returned as written (its domain is the
/// caller's to check, with the caller's message); the second must convert to a finite value (and a positive one
/// for SI units). Errors name both fields, or the converted one.
pub fn one_of(
    first: (&str, Option<f64>),
    second: (&str, Option<f64>),
    conversion: Conversion,
) -> Result<f64, ChannelError> {
    match (first.1, second.1) {
        (Some(v), None) => Ok(v),
        (None, Some(v)) => conversion.apply(v).map_err(|reason| ChannelError::Field {
            field: second.0.to_string(),
            reason,
        }),
        (Some(_), Some(_)) => Err(not_one(first.0, second.0, true)),
        (None, None) => Err(not_one(first.0, second.0, false)),
    }
}

/// [`one_of`] for a list (a sweep axis): exactly one of the two lists, the second converted element by element;
/// an error names the element (`dl_power_w[2]`).
pub fn one_of_list(
    first: (&str, Option<&[f64]>),
    second: (&str, Option<&[f64]>),
    conversion: Conversion,
) -> Result<Vec<f64>, ChannelError> {
    match (first.1, second.1) {
        (Some(v), None) => Ok(v.to_vec()),
        (None, Some(v)) => v
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                conversion.apply(x).map_err(|reason| ChannelError::Field {
                    field: format!("{}[{i}]", second.0),
                    reason,
                })
            })
            .collect(),
        (Some(_), Some(_)) => Err(not_one(first.0, second.0, true)),
        (None, None) => Err(not_one(first.0, second.0, false)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_pairs_take_exactly_one_and_name_the_field() {
        let c = Conversion::DbmToW;
        assert_eq!(one_of(("p_w", Some(2.0)), ("p_dbm", None), c), Ok(2.0));
        assert!((one_of(("p_w", None), ("p_dbm", Some(30.0)), c).unwrap() - 1.0).abs() < 1e-15);
        let both = one_of(("p_w", Some(1.0)), ("p_dbm", Some(30.0)), c).unwrap_err();
        assert_eq!(
            both.to_string(),
            "p_w, p_dbm: give exactly one of the pair, not both"
        );
        let none = one_of(("p_w", None), ("p_dbm", None), c).unwrap_err();
        assert_eq!(
            none.to_string(),
            "p_w, p_dbm: missing (give exactly one of the pair)"
        );
        let huge = one_of(("p_w", None), ("p_dbm", Some(1e308)), c).unwrap_err();
        assert!(
            huge.to_string().starts_with("p_dbm: 1e308 converts to inf"),
            "{huge}"
        );
        let nan = one_of(("b_hz", None), ("b_mhz", Some(f64::NAN)), Conversion::MhzToHz).unwrap_err();
        assert!(nan.to_string().starts_with("b_mhz: NaN"), "{nan}");
        // The logarithmic direction: any finite dBm is valid, a non-positive power is not.
        let w = Conversion::WToDbm;
        assert!((one_of(("p_dbm", None), ("p_w", Some(1.0)), w).unwrap() - 30.0).abs() < 1e-12);
        assert!(one_of(("p_dbm", None), ("p_w", Some(0.0)), w).is_err());
        assert!(one_of(("p_dbm", None), ("p_w", Some(-1.0)), w).is_err());
        assert_eq!(one_of(("p_dbm", Some(-20.0)), ("p_w", None), w), Ok(-20.0));
        let db = Conversion::LinearToDb;
        assert!((one_of(("g_db", None), ("g", Some(1e-3)), db).unwrap() + 30.0).abs() < 1e-12);
        let zero = one_of(("g_db", None), ("g", Some(0.0)), db).unwrap_err();
        assert!(zero.to_string().starts_with("g: 0 converts to -inf dB"), "{zero}");
    }

    #[test]
    fn unit_pair_lists_name_the_element() {
        let c = Conversion::MhzToHz;
        let v = one_of_list(("b_hz", None), ("b_mhz", Some(&[5.0, 10.0][..])), c).unwrap();
        assert_eq!(v, vec![5e6, 1e7]);
        let e = one_of_list(("b_hz", None), ("b_mhz", Some(&[5.0, f64::INFINITY][..])), c).unwrap_err();
        assert!(e.to_string().starts_with("b_mhz[1]: inf converts to inf"), "{e}");
        assert_eq!(
            one_of_list(("b_hz", Some(&[1.0][..])), ("b_mhz", None), c).unwrap(),
            vec![1.0]
        );
        assert!(one_of_list(("b_hz", Some(&[1.0][..])), ("b_mhz", Some(&[1.0][..])), c).is_err());
    }

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
