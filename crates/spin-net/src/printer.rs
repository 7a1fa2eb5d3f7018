//! Lines said by async tasks and written by one thread of their own: a sink that blocks (stderr into a pipe that
//! nobody reads, a slow terminal) then holds that thread, never a runtime worker. The queue between them is
//! bounded: a line said while it is full is dropped and counted, and the count is written as soon as the sink
//! moves again, before the next line.
//!
//! The server's operator notices go through one (`Server::with_notices`); `multispin` writes its whole stderr
//! through one, the `tracing` log included.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::time::{Duration, Instant};

/// Lines a [`LinePrinter`] holds for its sink at most (some 100 kB of notices: minutes of a busy server's).
pub const PRINTER_QUEUE_LINES: usize = 1024;

enum Item {
    Line(String),
    /// Answered once every item before it went to the sink.
    Flush(mpsc::Sender<()>),
}

/// A handle to a printer thread (cloned handles share it; the thread ends once every handle is dropped and what
/// was queued is written).
#[derive(Clone)]
pub struct LinePrinter {
    tx: SyncSender<Item>,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    /// Lines dropped in all.
    dropped: AtomicU64,
    /// Of those, the ones the sink has not been told of yet.
    untold: AtomicU64,
}

/// The line that stands for `n` dropped lines.
pub fn dropped_line(n: u64) -> String {
    format!("({n} line(s) dropped here: they were said faster than this output was read)")
}

impl LinePrinter {
    /// A printer writing each line to `sink` on a thread named `name`, holding up to [`PRINTER_QUEUE_LINES`]
    /// lines. Fails only when the thread cannot be started.
    pub fn new(name: &str, sink: impl FnMut(&str) + Send + 'static) -> std::io::Result<Self> {
        Self::with_capacity(PRINTER_QUEUE_LINES, name, sink)
    }

    /// [`LinePrinter::new`] holding up to `capacity` lines (at least 1).
    pub fn with_capacity(
        capacity: usize,
        name: &str,
        mut sink: impl FnMut(&str) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel::<Item>(capacity.max(1));
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        std::thread::Builder::new().name(name.into()).spawn(move || {
            let tell = |sink: &mut dyn FnMut(&str)| {
                let n = c.untold.swap(0, Ordering::Relaxed);
                if n > 0 {
                    sink(&dropped_line(n));
                }
            };
            for item in rx {
                tell(&mut sink);
                match item {
                    Item::Line(text) => sink(&text),
                    Item::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
            tell(&mut sink);
        })?;
        Ok(LinePrinter { tx, counts })
    }

    /// Queues `text` for the sink and returns at once: false when it was dropped (the queue is full, or the
    /// printer's thread is gone).
    pub fn say(&self, text: &str) -> bool {
        match self.tx.try_send(Item::Line(text.to_owned())) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counts.dropped.fetch_add(1, Ordering::Relaxed);
                self.counts.untold.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Lines dropped so far.
    pub fn dropped(&self) -> u64 {
        self.counts.dropped.load(Ordering::Relaxed)
    }

    /// Waits, blocking this thread for `within` at most, until every line said before went to the sink (and the
    /// count of dropped lines with them); false when that did not happen in time. For a thread that may block:
    /// from async code, through `spawn_blocking`.
    pub fn flush(&self, within: Duration) -> bool {
        let by = Instant::now() + within;
        let (done, wait) = mpsc::channel();
        let mut item = Item::Flush(done);
        loop {
            match self.tx.try_send(item) {
                Ok(()) => break,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(back)) => {
                    if Instant::now() >= by {
                        return false;
                    }
                    item = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        wait.recv_timeout(by.saturating_duration_since(Instant::now()))
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn collecting() -> (Arc<Mutex<Vec<String>>>, impl FnMut(&str) + Send + 'static) {
        let lines: Arc<Mutex<Vec<String>>> = Default::default();
        let l = lines.clone();
        (lines, move |t: &str| l.lock().unwrap().push(t.to_owned()))
    }

    #[test]
    fn lines_reach_the_sink_in_order() {
        let (lines, sink) = collecting();
        let p = LinePrinter::new("test-printer", sink).unwrap();
        for i in 0..100 {
            assert!(p.say(&format!("line {i}")));
        }
        assert!(p.flush(Duration::from_secs(10)));
        let want: Vec<String> = (0..100).map(|i| format!("line {i}")).collect();
        assert_eq!(*lines.lock().unwrap(), want);
        assert_eq!(p.dropped(), 0);
    }

    /// A sink that blocks never blocks the sayer: past the queue, lines are dropped and counted, and the count is
    /// written once the sink moves again.
    #[test]
    fn a_blocked_sink_drops_and_counts_instead_of_blocking() {
        let (lines, mut collect) = collecting();
        let (release, released) = mpsc::channel::<()>();
        let released = Mutex::new(released);
        let p = LinePrinter::with_capacity(4, "test-printer", move |t: &str| {
            // The first line holds the sink until the test releases it.
            if t == "first" {
                let _ = released.lock().unwrap().recv();
            }
            collect(t);
        })
        .unwrap();
        assert!(p.say("first"));
        // Let the thread take the first line (the queue then has room for 4; 3 if it has not yet).
        std::thread::sleep(Duration::from_millis(100));
        let start = Instant::now();
        let said: Vec<bool> = (0..20).map(|i| p.say(&format!("line {i}"))).collect();
        assert!(start.elapsed() < Duration::from_secs(1), "{:?}", start.elapsed());
        let kept = said.iter().filter(|&&s| s).count();
        assert!((3..=4).contains(&kept), "{said:?}");
        assert_eq!(p.dropped(), 20 - kept as u64);
        release.send(()).unwrap();
        assert!(p.flush(Duration::from_secs(10)));
        // The count comes as soon as the sink moves again, before the lines that were kept.
        let lines = lines.lock().unwrap();
        let want: Vec<String> = ["first".to_string(), dropped_line(20 - kept as u64)]
            .into_iter()
            .chain((0..kept).map(|i| format!("line {i}")))
            .collect();
        assert_eq!(*lines, want);
    }

    #[test]
    fn a_flush_gives_up_on_a_sink_that_never_returns() {
        let p = LinePrinter::with_capacity(2, "test-printer", |_: &str| {
            std::thread::sleep(Duration::from_secs(3600))
        })
        .unwrap();
        p.say("stuck");
        let start = Instant::now();
        assert!(!p.flush(Duration::from_millis(200)));
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
