//! The one error type of `spin-channel`, naming the field that is out of its domain.

use thiserror::Error;

/// Invalid input to a channel function or constructor.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// A numeric field is outside its domain (NaN included).
    #[error("{field}: {value} is outside {domain}")]
    OutOfDomain {
        /// The offending field or argument.
        field: &'static str,
        /// The value given.
        value: f64,
        /// The allowed domain in words, e.g. "(0, ∞)".
        domain: &'static str,
    },
    /// A field named at run time (a file's field path, or a pair of unit fields), with what is wrong.
    #[error("{field}: {reason}")]
    Field {
        /// The offending field, or both fields of a unit pair ("bandwidth_hz, bandwidth_mhz").
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A structural problem such as an empty range or mismatched lengths.
    #[error("{field}: {reason}")]
    Invalid {
        /// The offending field or argument.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// Checks that `value` is finite and strictly positive.
pub fn positive(field: &'static str, value: f64) -> Result<f64, ChannelError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(ChannelError::OutOfDomain {
            field,
            value,
            domain: "(0, ∞)",
        })
    }
}

/// Checks that `value` is finite and not negative.
pub fn non_negative(field: &'static str, value: f64) -> Result<f64, ChannelError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(ChannelError::OutOfDomain {
            field,
            value,
            domain: "[0, ∞)",
        })
    }
}
