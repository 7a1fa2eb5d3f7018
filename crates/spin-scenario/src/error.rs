//! The one error of this crate: the field path a problem concerns and what is wrong with it.

use std::fmt;

/// Why a file was refused. `field` is the path as written in the file (`devices[2].acceptance`, `system.bandwidth_hz`,
/// `ul_power_w, ul_power_dbm` for a pair), or the name of the whole file (`scenario`, `drop`) for a problem of the
/// file as a whole; it is empty where the reason already names its field (a library's own error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    /// The field path, or the file's name; empty where `reason` names the field itself.
    pub field: String,
    /// What is wrong, on one line.
    pub reason: String,
}

impl FileError {
    /// An error of `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> FileError {
        FileError {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// An error whose text already names its field (the errors of `spin-optimize` and `spin-channel` do).
    pub fn named(err: impl fmt::Display) -> FileError {
        FileError::new("", err.to_string())
    }

    /// The same error under a section prefix (`channel.`): the field becomes `channel.<field>` (for an error
    /// whose reason names the field, the prefix goes in front of the reason).
    pub fn within(mut self, prefix: &str) -> FileError {
        if self.field.is_empty() {
            self.reason = format!("{prefix}{}", self.reason);
        } else {
            self.field = format!("{prefix}{}", self.field);
        }
        self
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{}: {}", self.field, self.reason)
        }
    }
}

impl std::error::Error for FileError {}

impl From<spin_channel::ChannelError> for FileError {
    fn from(e: spin_channel::ChannelError) -> Self {
        FileError::named(e)
    }
}

impl From<spin_optimize::OptimizeError> for FileError {
    fn from(e: spin_optimize::OptimizeError) -> Self {
        FileError::named(e)
    }
}
