//! Unit pairs: one quantity under either of two names (`bandwidth_hz | bandwidth_mhz`), exactly one of them given,
//! the second converted by `spin_channel::units` (the rule of every file family). A section prefix (`system.`,
//! `devices[3].`) names the fields as the file path does.

use crate::FileError;
use spin_channel::units::{self, Conversion};

/// One quantity under either name of a unit pair: `first` in the unit the program uses, `second` converted by
/// `conversion`. Errors name both fields (`ul_power_w, ul_power_dbm: give exactly one of the pair, not both`) or
/// the converted one.
pub fn one_of(
    prefix: &str,
    first: (&str, Option<f64>),
    second: (&str, Option<f64>),
    conversion: Conversion,
) -> Result<f64, FileError> {
    let a = format!("{prefix}{}", first.0);
    let b = format!("{prefix}{}", second.0);
    units::one_of((&a, first.1), (&b, second.1), conversion).map_err(FileError::from)
}

/// The band of every file family: `bandwidth_hz` or `bandwidth_mhz` (under `prefix`), exactly one of them.
pub(crate) fn bandwidth_hz(prefix: &str, hz: Option<f64>, mhz: Option<f64>) -> Result<f64, FileError> {
    one_of(
        prefix,
        ("bandwidth_hz", hz),
        ("bandwidth_mhz", mhz),
        Conversion::MhzToHz,
    )
}

/// [`one_of`] where the pair may be left out altogether: `None` when neither name is given.
pub fn optional_one_of(
    prefix: &str,
    first: (&str, Option<f64>),
    second: (&str, Option<f64>),
    conversion: Conversion,
) -> Result<Option<f64>, FileError> {
    if first.1.is_none() && second.1.is_none() {
        return Ok(None);
    }
    one_of(prefix, first, second, conversion).map(Some)
}

/// A sweep axis under either name of a unit pair, converted element by element (an error names the element,
/// `fig7.dl_power_w[2]`).
pub fn one_of_list(
    prefix: &str,
    first: (&str, Option<&[f64]>),
    second: (&str, Option<&[f64]>),
    conversion: Conversion,
) -> Result<Vec<f64>, FileError> {
    let a = format!("{prefix}{}", first.0);
    let b = format!("{prefix}{}", second.0);
    units::one_of_list((&a, first.1), (&b, second.1), conversion).map_err(FileError::from)
}

/// The radio block of a scenario file as written: each quantity as its (SI, dB) unit pair, e.g.
/// `ul_power: (ul_power_w, ul_power_dbm)`. Paper-B and unified scenarios share it.
pub(crate) struct RadioPairs {
    pub ul_power: (Option<f64>, Option<f64>),
    pub dl_power: (Option<f64>, Option<f64>),
    pub noise_psd_server: (Option<f64>, Option<f64>),
    pub noise_psd_device: (Option<f64>, Option<f64>),
}

impl RadioPairs {
    /// The radio in SI units, each pair resolved by [`one_of`] in the file's field order (a top-level block: the
    /// errors name the fields without a prefix).
    pub(crate) fn resolve(self) -> Result<spin_optimize::round::Radio, FileError> {
        Ok(spin_optimize::round::Radio {
            ul_power_w: one_of(
                "",
                ("ul_power_w", self.ul_power.0),
                ("ul_power_dbm", self.ul_power.1),
                Conversion::DbmToW,
            )?,
            dl_power_w: one_of(
                "",
                ("dl_power_w", self.dl_power.0),
                ("dl_power_dbm", self.dl_power.1),
                Conversion::DbmToW,
            )?,
            noise_psd_server_w_per_hz: one_of(
                "",
                ("noise_psd_server_w_per_hz", self.noise_psd_server.0),
                ("noise_psd_server_dbm_per_hz", self.noise_psd_server.1),
                Conversion::DbmPerHzToWPerHz,
            )?,
            noise_psd_device_w_per_hz: one_of(
                "",
                ("noise_psd_device_w_per_hz", self.noise_psd_device.0),
                ("noise_psd_device_dbm_per_hz", self.noise_psd_device.1),
                Conversion::DbmPerHzToWPerHz,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_takes_exactly_one_and_names_both_with_the_prefix() {
        let mhz = one_of(
            "system.",
            ("bandwidth_hz", None),
            ("bandwidth_mhz", Some(10.0)),
            Conversion::MhzToHz,
        );
        assert_eq!(mhz, Ok(1e7));
        let both = one_of(
            "system.",
            ("bandwidth_hz", Some(1e7)),
            ("bandwidth_mhz", Some(10.0)),
            Conversion::MhzToHz,
        )
        .unwrap_err();
        assert_eq!(
            both.to_string(),
            "system.bandwidth_hz, system.bandwidth_mhz: give exactly one of the pair, not both"
        );
        let neither = one_of(
            "",
            ("ul_power_w", None),
            ("ul_power_dbm", None),
            Conversion::DbmToW,
        )
        .unwrap_err();
        assert_eq!(
            neither.to_string(),
            "ul_power_w, ul_power_dbm: missing (give exactly one of the pair)"
        );
        assert_eq!(
            optional_one_of("", ("a_w", None), ("a_dbm", None), Conversion::DbmToW),
            Ok(None)
        );
        let list = one_of_list(
            "fig7.",
            ("dl_power_dbm", None),
            ("dl_power_w", Some(&[1.0, 0.0][..])),
            Conversion::WToDbm,
        )
        .unwrap_err();
        assert!(list.to_string().starts_with("fig7.dl_power_w[1]: "), "{list}");
    }
}
