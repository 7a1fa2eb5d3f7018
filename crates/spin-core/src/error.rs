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
    /// A structural problem in one element of a list, e.g. `targets[3]: weight -0.1 at token 17 is negative`.
    #[error("{field}[{index}]: {reason}")]
    InvalidAt {
        /// The name of the list the element belongs to.
        field: &'static str,
        /// The position of the offending element in that list.
        index: usize,
        /// What is wrong, in lowercase words.
        reason: String,
    },
}

impl CoreError {
    /// Shorthand for [`CoreError::Invalid`].
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`CoreError::InvalidAt`].
    pub(crate) fn invalid_at(field: &'static str, index: usize, reason: impl Into<String>) -> Self {
        Self::InvalidAt {
            field,
            index,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`CoreError::OutOfDomain`].
    pub(crate) fn out_of_domain(field: &'static str, value: f64, domain: &'static str) -> Self {
        Self::OutOfDomain { field, value, domain }
    }
}
