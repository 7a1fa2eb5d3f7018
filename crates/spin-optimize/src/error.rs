//! The one error type of `spin-optimize`: invalid scenarios name their field; infeasible requests say why.

use thiserror::Error;

/// Why a scenario, plan or request was refused.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum OptimizeError {
    /// A numeric field is outside its domain (NaN included).
    #[error("{field}: {value} is outside {domain}")]
    OutOfDomain {
        /// The offending field, as named in the scenario file (e.g. `devices[3].acceptance`).
        field: String,
        /// The value given.
        value: f64,
        /// The allowed domain in words.
        domain: &'static str,
    },
    /// A structural problem: empty device list, mismatched lengths, unknown names.
    #[error("{field}: {reason}")]
    Invalid {
        /// The offending field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The request has no feasible solution (e.g. a budget that cannot be met).
    #[error("infeasible: {reason}")]
    Infeasible {
        /// Why no solution exists.
        reason: String,
    },
    /// An exhaustive search was asked for on an instance too large to enumerate.
    #[error("{field}: search space of {} points exceeds the limit of {limit}", points(*size))]
    TooLarge {
        /// What makes the instance large (e.g. `devices`).
        field: String,
        /// The number of points the search would visit; `u128::MAX` stands for "more than u128 can hold" and is
        /// printed as such, never as the number itself.
        size: u128,
        /// The largest search this method accepts.
        limit: u128,
    },
}

/// A search-space size in words: the exact count, or "more than 3.4e38" where it saturated `u128`.
fn points(size: u128) -> String {
    if size == u128::MAX {
        format!("more than {:.1e}", u128::MAX as f64)
    } else {
        size.to_string()
    }
}

impl OptimizeError {
    /// Checks that `value` is finite and strictly positive.
    pub fn positive(field: impl Into<String>, value: f64) -> Result<f64, OptimizeError> {
        if value.is_finite() && value > 0.0 {
            Ok(value)
        } else {
            Err(OptimizeError::OutOfDomain {
                field: field.into(),
                value,
                domain: "(0, ∞)",
            })
        }
    }

    /// Checks that `value` is finite and not negative.
    pub fn non_negative(field: impl Into<String>, value: f64) -> Result<f64, OptimizeError> {
        if value.is_finite() && value >= 0.0 {
            Ok(value)
        } else {
            Err(OptimizeError::OutOfDomain {
                field: field.into(),
                value,
                domain: "[0, ∞)",
            })
        }
    }

    /// This error with `field` as its field, formatted only here: a check on a path that runs every round (a
    /// networked server builds and scores a round per round) passes an empty name and names the field on failure,
    /// instead of formatting a name per device that no one reads.
    pub(crate) fn naming(self, field: impl FnOnce() -> String) -> OptimizeError {
        match self {
            OptimizeError::OutOfDomain { value, domain, .. } => OptimizeError::OutOfDomain {
                field: field(),
                value,
                domain,
            },
            OptimizeError::Invalid { reason, .. } => OptimizeError::Invalid {
                field: field(),
                reason,
            },
            other => other,
        }
    }

    /// Checks α ∈ (0, 1).
    pub fn probability_open(field: impl Into<String>, value: f64) -> Result<f64, OptimizeError> {
        if value > 0.0 && value < 1.0 {
            Ok(value)
        } else {
            Err(OptimizeError::OutOfDomain {
                field: field.into(),
                value,
                domain: "(0, 1)",
            })
        }
    }
}
