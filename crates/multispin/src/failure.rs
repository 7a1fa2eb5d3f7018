//! How a subcommand fails: bad input (exit 2, one line naming the field) or a failure of the work (exit 1).

use std::fmt::Display;

/// The error of every subcommand.
#[derive(Debug)]
pub enum Failure {
    /// Invalid input: a message that names the field and the reason.
    Input(String),
    /// The work failed for another reason (IO, a model that cannot run).
    Runtime(anyhow::Error),
}

impl Failure {
    /// An input error from anything displayable (library errors already name their field).
    pub fn input(err: impl Display) -> Self {
        Failure::Input(err.to_string())
    }
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Self {
        Failure::Runtime(err)
    }
}

impl From<std::io::Error> for Failure {
    fn from(err: std::io::Error) -> Self {
        Failure::Runtime(err.into())
    }
}
