//! The one error type of `spin-core`: every invalid input is reported with the field it came from.

use thiserror::Error;

/// Invalid input to a `spin-core` constructor or function.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum CoreError {
    /// A numeric field is outside its documented domain (NaN included).
    #[error("{field}: {value} is outside {domain}")]
    OutOfDomain {
        /// The name of the offending field or argument.
        field: &'static str,
        /// The value that was given.
        value: f64,
        /// The allowed domain, in words, e.g. "(0, 1)".
        domain: &'static str,
    },
    /// A structural problem: empty vectors, mismatched lengths, zero total mass and the like.
    #[error("{field}: {reason}")]
    Invalid {
        /// The name of the offending field or argument.
        field: &'static str,
        /// What is wrong, in lowercase words.
        reason: String,
    },
}
