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

/// The messages of `err` and its sources joined by ": ", each on one line, leaving out a source whose text the
/// message before it already contains (an error that prints its source, `io: Connection refused (os error 111)`,
/// would otherwise say it twice).
pub fn chain_text<'a>(messages: impl IntoIterator<Item = String> + 'a) -> String {
    let mut parts: Vec<String> = Vec::new();
    for m in messages {
        let m = m.lines().next().unwrap_or("").trim_end().to_string();
        if parts.last().is_some_and(|last| last.contains(&m)) {
            continue;
        }
        parts.push(m);
    }
    parts.join(": ")
}

/// A network error of `serve` or `device`, said once and with the address it concerns: `what` names the side and
/// the address (`--connect 127.0.0.1:7878`). Refusals and mismatches reported by the peer are input errors (exit 2).
pub fn net(what: &str, err: spin_net::NetError, input: bool) -> Failure {
    let mut messages = vec![err.to_string()];
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        messages.push(s.to_string());
        source = s.source();
    }
    let text = format!("{what}: {}", chain_text(messages));
    if input {
        Failure::Input(text)
    } else {
        Failure::Runtime(anyhow::anyhow!(text))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_say_each_cause_once() {
        let text = chain_text([
            "io: Connection refused (os error 111)".to_string(),
            "Connection refused (os error 111)".to_string(),
        ]);
        assert_eq!(text, "io: Connection refused (os error 111)");
        assert_eq!(chain_text(["a".to_string(), "b\nmore".to_string()]), "a: b");
    }
}
