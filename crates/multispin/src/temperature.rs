//! `--temperature` of `generate`, `simulate` and `serve`: one rule for every command that samples.

use crate::failure::Failure;
use crate::number::plain;

/// The smallest temperature other than 0: below it 1/T overflows or the distribution is greedy anyway.
pub const MIN_TEMPERATURE: f64 = 1e-6;

/// `t` if it is 0 (greedy decoding) or a finite number ≥ [`MIN_TEMPERATURE`]; otherwise an input error naming
/// `--temperature`.
pub fn check(t: f64) -> Result<f64, Failure> {
    if t == 0.0 || (t.is_finite() && t >= MIN_TEMPERATURE) {
        return Ok(t);
    }
    Err(Failure::Input(format!(
        "--temperature: {} is neither 0 (greedy) nor a finite number ≥ {}",
        plain(t),
        plain(MIN_TEMPERATURE)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_the_range_pass_everything_else_names_the_flag() {
        for good in [0.0, -0.0, MIN_TEMPERATURE, 0.8, 1e300] {
            assert_eq!(check(good).ok(), Some(good));
        }
        for bad in [1e-9, 1e-320, -1.0, f64::NAN, f64::INFINITY] {
            let Err(Failure::Input(msg)) = check(bad) else {
                panic!("{bad} passed");
            };
            assert!(msg.starts_with("--temperature: "), "{msg}");
            assert!(
                msg.contains("neither 0 (greedy) nor a finite number ≥ 1e-6"),
                "{msg}"
            );
        }
    }
}
