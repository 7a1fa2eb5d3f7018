//! The one error type of spin-net: every protocol, decode, handshake and link failure names its field or cause;
//! and the refusal codes a peer is sent for them (`ErrorCode`, part of the wire protocol and re-exported by `proto`).

use serde::{Deserialize, Serialize};

/// Errors of `spin-net`. Messages are lowercase and start with the field or subject at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// A socket operation failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// A frame body did not decode as a message.
    #[error("frame: {0}")]
    Decode(String),
    /// A message could not be encoded.
    #[error("encode: {0}")]
    Encode(String),
    /// A frame exceeded the size limit.
    #[error("frame: {size} bytes exceed the limit of {limit}")]
    TooLarge {
        /// The announced size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The peer speaks another protocol or version.
    #[error("version: peer sent {got}, this side speaks {want}")]
    Version {
        /// What the peer sent.
        got: String,
        /// What this side speaks.
        want: String,
    },
    /// Drafter and target do not share a vocabulary or tokenizer.
    #[error("{field}: {reason}")]
    Mismatch {
        /// `vocab` or `tokenizer`.
        field: &'static str,
        /// The two values.
        reason: String,
    },
    /// `Hello.resume` names no resumable session.
    #[error("session: {0} is not a session waiting to resume")]
    UnknownSession(u64),
    /// `Hello.resume` names a session whose device is still connected.
    #[error("session: {0} is connected; a resume is accepted once its connection is gone")]
    Busy(u64),
    /// The device's admission token is missing or wrong.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The server admits no more devices, connections or new sessions (which limit, in the message).
    #[error("full: {0}")]
    Full(String),
    /// A message arrived where the protocol does not allow it.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The peer refused us with an error message.
    #[error("refused ({code:?}): {message}")]
    Refused {
        /// Its code.
        code: ErrorCode,
        /// Its message.
        message: String,
    },
    /// The server shut down.
    #[error("server shut down: {0}")]
    Shutdown(String),
    /// The connection closed.
    #[error("connection: closed by the peer")]
    Closed,
    /// A device's connection was cut and its session could not be resumed in time.
    #[error("connection: {0}")]
    Lost(String),
    /// A step of the device's handshake (connecting, TLS, `Hello`, `Welcome`) did not complete within its timeout.
    /// The message does not repeat the address: whoever reports it names the server once (`multispin device`
    /// says `--connect <addr>: handshake: the server …`).
    #[error("handshake: the server {waiting} within {} s", .after.as_secs_f64())]
    Timeout {
        /// The server's address.
        addr: String,
        /// What did not happen, e.g. "accepted the connection but sent no Welcome".
        waiting: &'static str,
        /// The timeout.
        after: std::time::Duration,
    },
    /// After the handshake the server sent nothing, not even a `KeepAlive`, for the device's silence timeout: it
    /// hangs, or the path to it is gone.
    #[error("silence: the server sent nothing for {} s after the handshake, not even a keepalive", .after.as_secs_f64())]
    Silent {
        /// The server's address.
        addr: String,
        /// The silence timeout.
        after: std::time::Duration,
    },
    /// Once welcomed, the device heard no plan, verdict or drop for its progress timeout (only `KeepAlive`s, if
    /// anything): the server holds it without moving its session on.
    #[error(
        "stalled: the server sent no plan or verdict for {} s, only keepalives",
        .after.as_secs_f64()
    )]
    Stalled {
        /// The server's address.
        addr: String,
        /// The progress timeout.
        after: std::time::Duration,
    },
    /// An argument or received field is out of its domain.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field.
        field: String,
        /// Why.
        reason: String,
    },
    /// The runtime (models, verification) failed.
    #[error(transparent)]
    Runtime(#[from] spin_runtime::RuntimeError),
    /// A planner refused its inputs.
    #[error(transparent)]
    Optimize(#[from] spin_optimize::OptimizeError),
    /// The channel model refused its inputs.
    #[error(transparent)]
    Channel(#[from] spin_channel::ChannelError),
    /// spin-core refused a distribution or decision.
    #[error(transparent)]
    Core(#[from] spin_core::CoreError),
}

impl NetError {
    /// An invalid-field error.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        NetError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The refusal code sent to the peer for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            NetError::TooLarge { .. } => ErrorCode::TooLarge,
            NetError::Version { .. } => ErrorCode::Version,
            NetError::Mismatch { .. } => ErrorCode::Mismatch,
            NetError::UnknownSession(_) => ErrorCode::UnknownSession,
            NetError::Busy(_) => ErrorCode::Busy,
            NetError::Full(_) => ErrorCode::Full,
            NetError::Unauthorized(_) => ErrorCode::Unauthorized,
            NetError::Decode(_) | NetError::Invalid { .. } => ErrorCode::Malformed,
            _ => ErrorCode::Protocol,
        }
    }
}

impl NetError {
    /// Whether this is the connection failing under the session (reset, cut, closed without `Shutdown`, a frame
    /// cut in the middle, a reconnection whose handshake timed out) rather than a refusal or the end of the run: a
    /// device then reconnects and resumes. ([`NetError::Silent`] is not: the device resumes once after it, not in
    /// a loop.)
    pub fn is_cut(&self) -> bool {
        match self {
            NetError::Io(_) | NetError::Closed | NetError::Timeout { .. } => true,
            NetError::Decode(m) => m.contains("truncated"),
            _ => false,
        }
    }
}

/// `v` as a person reads it in a message: `{}` for 0 and magnitudes in [1e-4, 1e9), scientific notation beyond
/// (`1e308`, not the 309 digits `{}` writes), as the `multispin` command writes numbers.
pub(crate) fn number(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() || a == 0.0 || (1e-4..1e9).contains(&a) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, NetError>;

/// Refusal codes (stable numbers on the wire, docs/protocol.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The frame did not decode.
    Malformed,
    /// The frame exceeded the size limit.
    TooLarge,
    /// Wrong magic or protocol version.
    Version,
    /// The vocabulary or tokenizer does not match the target's.
    Mismatch,
    /// `Hello.resume` names no resumable session, or its secret is wrong (the two are not told apart).
    UnknownSession,
    /// A message that is not valid at this point of the session.
    Protocol,
    /// The server is full (devices, connections or sessions that have not drafted yet, docs/system.md).
    Full,
    /// `Hello.resume` names a session whose device is still connected (id and secret were right); retry once the
    /// old connection is gone.
    Busy,
    /// `Hello.token` is not one of the server's admission tokens.
    Unauthorized,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_messages_read_as_written() {
        assert_eq!(number(0.0), "0");
        assert_eq!(number(-1.0), "-1");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(1e308), "1e308");
        assert_eq!(number(-1e308), "-1e308");
        assert_eq!(number(1e-320), "1e-320");
        assert_eq!(number(1.5e-7), "1.5e-7");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::NEG_INFINITY), "-inf");
    }
}
