//! The command's `tracing` subscriber: what the libraries log goes to stderr (spin-net's listener warns when
//! accepting a connection fails, e.g. when file descriptors run out), warnings and errors by default; `RUST_LOG`
//! sets the filter (`RUST_LOG=spin_net=info` adds a device's resumes). Dependencies that write `log` records
//! instead (the tokenizer library, TLS) go through the same filter. stdout is never written.
//!
//! Lines said while a command runs its async work (the log, `serve`'s address and notices) go to stderr through
//! one printer thread ([`line()`]): a stderr that nobody reads then blocks that thread, never a runtime worker, and
//! past a bounded queue lines are dropped and counted. The thread starts with the first such line.

use crate::failure::Failure;
use spin_net::printer::LinePrinter;
use std::io::{IsTerminal, Write};
use std::sync::OnceLock;
use std::time::Duration;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;

/// The environment variable that sets the filter.
const ENV: &str = "RUST_LOG";

/// The stderr printer, started by the first line (None if its thread could not be started).
static STDERR: OnceLock<Option<LinePrinter>> = OnceLock::new();

/// Writes `text` and a newline to stderr in one write (a line is never split by another).
fn write_stderr(text: &str) {
    let mut line = String::with_capacity(text.len() + 1);
    line.push_str(text);
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Says `text` as one line on stderr without waiting for it to be written (see the module's notes); written at
/// once where no printer thread could be started.
pub fn line(text: &str) {
    match STDERR
        .get_or_init(|| LinePrinter::new("multispin stderr", write_stderr).ok())
        .as_ref()
    {
        Some(p) => {
            p.say(text);
        }
        None => write_stderr(text),
    }
}

/// Waits, for `within` at most, until the lines said so far are written: before a command writes its last lines
/// itself (a summary, an error), so that they come after.
pub fn flush(within: Duration) {
    if let Some(p) = STDERR.get().and_then(Option::as_ref) {
        p.flush(within);
    }
}

/// The `tracing` writer: each event, formatted into a buffer, is one [`line()`] when the buffer is dropped.
struct EventLines;

/// One event's text.
struct EventLine(Vec<u8>);

impl Write for EventLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for EventLine {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.0);
        let text = text.trim_end_matches('\n');
        if !text.is_empty() {
            line(text);
        }
    }
}

impl<'a> MakeWriter<'a> for EventLines {
    type Writer = EventLine;
    fn make_writer(&'a self) -> EventLine {
        EventLine(Vec::new())
    }
}

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

/// Turns the `log` records of dependencies into `tracing` events, for the whole process (once; a second call keeps
/// the first): records above `max` are not even formatted.
fn bridge_log(max: LevelFilter) {
    use tracing_log::AsLog;
    let _ = tracing_log::LogTracer::builder()
        .with_max_level(max.as_log())
        .init();
}

/// Installs the subscriber of `RUST_LOG` (default: warnings) writing to stderr through [`line()`], for the whole
/// process, and bridges the dependencies' `log` records to it.
pub fn install() -> Result<(), Failure> {
    let value = match std::env::var(ENV) {
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(v)) => {
            return Err(Failure::Input(format!("{ENV}: {v:?} is not UTF-8")));
        }
    };
    let filter = filter(value.as_deref())?;
    let max = filter.max_level_hint().unwrap_or(LevelFilter::TRACE);
    let sub = subscriber(filter, EventLines, std::io::stderr().is_terminal());
    // Set once, by `main`; a second call keeps the first.
    let _ = tracing::subscriber::set_global_default(sub);
    bridge_log(max);
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

    /// What `emit` writes under the filter of `rust_log`.
    fn written_by(rust_log: Option<&str>, emit: impl FnOnce()) -> String {
        let buf = Buffer::default();
        let sub = subscriber(filter(rust_log).unwrap(), buf.clone(), false);
        tracing::subscriber::with_default(sub, emit);
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    /// What the events below write under the filter of `rust_log`.
    fn logged(rust_log: Option<&str>) -> String {
        written_by(rust_log, || {
            tracing::warn!(target: "spin_net::server::conn", "listener: accept failed");
            tracing::info!(target: "spin_net::device", "device: resumed session");
        })
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

    /// A dependency's `log` record reaches the subscriber under the same filter as the events.
    #[test]
    fn log_records_of_dependencies_go_through_the_filter() {
        bridge_log(LevelFilter::TRACE);
        let written = |rust_log: Option<&str>| {
            written_by(rust_log, || {
                log::warn!(target: "tokenizers::tokenizer", "a warning from a dependency");
                log::debug!(target: "rustls::conn", "a debug record");
            })
        };
        let text = written(None);
        assert!(
            text.contains("WARN") && text.contains("a warning from a dependency"),
            "{text:?}"
        );
        assert!(!text.contains("debug record"), "{text:?}");
        let text = written(Some("rustls=debug"));
        assert!(text.contains("a debug record"), "{text:?}");
        assert_eq!(written(Some("off")), "");
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
