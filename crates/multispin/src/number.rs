//! Numbers as a person reads them in messages and tables: plain decimals where they fit ("-1", "0.25"),
//! engineering notation with an SI prefix and unit otherwise ("153.8 mW", "12.5 µs"), never "-1e0" or "0.0000e0".

/// `v` as a user would type it: the shortest decimal that reads back as `v` for magnitudes in [1e-4, 1e9) (and 0),
/// scientific notation with a mantissa beyond them ("1.5e-7", "3e12").
pub fn plain(v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    let a = v.abs();
    if a == 0.0 || (1e-4..1e9).contains(&a) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// `text` with every number of more than 20 digits written as [`plain`] writes it: an f64's `{}` writes every
/// digit (1e308 as 309 of them, 1e-320 as 321), and libraries' messages use it. Numbers of up to 20 digits (every
/// u64) are left exactly as they are, as is anything that does not read as a number.
pub fn shorten_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(|c: char| c.is_ascii_digit()) {
        out.push_str(&rest[..start]);
        let run = &rest[start..];
        let len = run
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(run.len());
        let number = run[..len].trim_end_matches('.');
        let digits = number.chars().filter(char::is_ascii_digit).count();
        match number.parse::<f64>() {
            Ok(v) if digits > 20 => out.push_str(&plain(v)),
            _ => out.push_str(number),
        }
        rest = &run[number.len()..];
    }
    out.push_str(rest);
    out
}

/// `v` in `unit` with an SI prefix so that the mantissa lies in [1, 1000), four significant digits, trailing zeros
/// kept to show the precision ("153.8 mW", "1.000 W", "0 W"). Magnitudes beyond the prefixes fall back to
/// [`plain`].
pub fn si(v: f64, unit: &str) -> String {
    const PREFIXES: [(i32, &str); 11] = [
        (-24, "y"),
        (-21, "z"),
        (-18, "a"),
        (-15, "f"),
        (-12, "p"),
        (-9, "n"),
        (-6, "µ"),
        (-3, "m"),
        (0, ""),
        (3, "k"),
        (6, "M"),
    ];
    if v == 0.0 {
        return format!("0 {unit}");
    }
    if !v.is_finite() {
        return format!("{v} {unit}");
    }
    let exp3 = (v.abs().log10().floor() as i32).div_euclid(3) * 3;
    let Some(&(e, prefix)) = PREFIXES.iter().find(|(e, _)| *e == exp3) else {
        return format!("{} {unit}", plain(v));
    };
    let mantissa = v / 10f64.powi(e);
    // Rounding to four digits can reach 1000 (999.96 → "1000.0"): move to the next prefix then.
    let decimals = 4 - (mantissa.abs().log10().floor() as i32 + 1).clamp(1, 3);
    let text = format!("{mantissa:.*}", decimals as usize);
    if text.trim_start_matches('-').starts_with("1000")
        && let Some(&(_, next)) = PREFIXES.iter().find(|(x, _)| *x == e + 3)
    {
        return format!("{:.3} {next}{unit}", mantissa / 1000.0);
    }
    format!("{text} {prefix}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_numbers_read_as_typed() {
        assert_eq!(plain(-1.0), "-1");
        assert_eq!(plain(0.0), "0");
        assert_eq!(plain(0.25), "0.25");
        assert_eq!(plain(1.5e-7), "1.5e-7");
        assert_eq!(plain(3e12), "3e12");
        assert_eq!(plain(f64::NAN), "NaN");
    }

    #[test]
    fn long_numbers_are_shortened_and_others_kept() {
        let huge = format!("{}", -1e308);
        let tiny = format!("{}", 1e-320);
        assert_eq!(
            shorten_numbers(&format!("bandwidth_hz: {huge} is not a finite number > 0")),
            "bandwidth_hz: -1e308 is not a finite number > 0"
        );
        assert_eq!(
            shorten_numbers(&format!("x: {tiny} is outside (0, 1)")),
            "x: 1e-320 is outside (0, 1)"
        );
        assert_eq!(shorten_numbers(&format!("{}", 1e21)), "1e21");
        for kept in [
            "gguf: array length 18446744073709551615 exceeds max 1073741824",
            "devices[1].acceptance: 0.30000000000000004 is outside (0, 1) at v1.2.3.",
            "no numbers here",
            "",
        ] {
            assert_eq!(shorten_numbers(kept), kept);
        }
    }

    #[test]
    fn si_prefixes_keep_four_digits() {
        assert_eq!(si(0.0, "W"), "0 W");
        assert_eq!(si(0.153_846, "W"), "153.8 mW");
        assert_eq!(si(0.846_16, "W"), "846.2 mW");
        assert_eq!(si(1.0, "W"), "1.000 W");
        assert_eq!(si(12.5e-6, "s"), "12.50 µs");
        assert_eq!(si(-2.5e3, "Hz"), "-2.500 kHz");
        assert_eq!(si(0.999_96, "W"), "1.000 W");
        assert_eq!(si(1e30, "W"), "1e30 W");
    }
}
