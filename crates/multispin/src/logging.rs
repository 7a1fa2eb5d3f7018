//! The command's `tracing` subscriber: what the libraries log goes to stderr (spin-net's listener warns when
//! accepting a connection fails, e.g. when file descriptors run out), warnings and errors by default; `RUST_LOG`
//! sets the filter (`RUST_LOG=spin_net=info` adds a device's resumes). stdout is never written.

use crate::failure::Failure;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;

/// The environment variable that sets the filter.
const ENV: &str = "RUST_LOG";

/// The filter `rust_log` (the value of `RUST_LOG`) asks for, or warnings and errors when it is unset or empty; a
/// directive that does not parse is an input error naming `RUST_LOG`, not silently ignored.
pub fn filter(rust_log: Option<&str>) -> Result<EnvFilter, Failure> {
    let value = rust_log.unwrap_or("");
    EnvFilter::builder()
        .with_default_directive(LevelFilter::WARN.into())
        .parse(value)
        .map_err(|e| Failure::Input(format!("{ENV}: {value:?} is not a tracing filter: {e}")))
}

/// The subscriber that writes the events `filter` lets through to `writer`, one line each (colours only where
/// `ansi`).
pub fn subscriber<W>(filter: EnvFilter, writer: W, ansi: bool) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi)
        .finish()
}

/// Installs the subscriber of `RUST_LOG` (default: warnings) writing to stderr, for the whole process. Only
/// `tracing` events are written: the `log` records of dependencies are not bridged.
pub fn install() -> Result<(), Failure> {
    let value = match std::env::var(ENV) {
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(v)) => {
            return Err(Failure::Input(format!("{ENV}: {v:?} is not UTF-8")));
        }
    };
    let filter = filter(value.as_deref())?;
    let sub = subscriber(filter, std::io::stderr, std::io::stderr().is_terminal());
    // Set once, by `main`; a second call keeps the first.
    let _ = tracing::subscriber::set_global_default(sub);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    /// What the events below write under the filter of `rust_log`.
    fn logged(rust_log: Option<&str>) -> String {
        let buf = Buffer::default();
        let sub = subscriber(filter(rust_log).unwrap(), buf.clone(), false);
        tracing::subscriber::with_default(sub, || {
            tracing::warn!(target: "spin_net::server::conn", "listener: accept failed");
            tracing::info!(target: "spin_net::device", "device: resumed session");
        });
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn warnings_are_written_by_default_and_rust_log_chooses_more() {
        for default in [None, Some("")] {
            let text = logged(default);
            assert!(
                text.contains("WARN") && text.contains("listener: accept failed"),
                "{text:?}"
            );
            assert!(!text.contains("resumed"), "{text:?}");
            assert_eq!(text.lines().count(), 1, "{text:?}");
        }
        let text = logged(Some("spin_net=info"));
        assert!(
            text.contains("listener: accept failed") && text.contains("device: resumed session"),
            "{text:?}"
        );
        assert_eq!(logged(Some("off")), "");
    }

    #[test]
    fn a_filter_that_does_not_parse_is_refused_naming_rust_log() {
        let Err(Failure::Input(msg)) = filter(Some("spin_net=loud")) else {
            panic!("accepted");
        };
        assert!(
            msg.starts_with("RUST_LOG: \"spin_net=loud\" is not a tracing filter"),
            "{msg}"
        );
    }
}
