//! The operator's notices: whom the server waits for, the calibration, and one line per refused connection naming
//! the peer's address and the reason; to the callback given to [`Server::with_notices`], else the `tracing` log.
//! The callback runs on a thread of its own ([`LinePrinter`]): one that blocks (stderr into a pipe nobody reads)
//! stalls neither the listener nor the rounds; past a bounded queue, notices are dropped and counted. Refusal lines
//! are rate-limited, so that a flood of refused peers costs a count rather than a line each, said within a second
//! or two of the flood.

use super::*;
use crate::printer::LinePrinter;

/// Refusal lines said per second at most; the refusals beyond are counted, and the count is said once their second
/// is over: with the next refusal, or by the listener's timer within [`REFUSAL_FLUSH_EVERY`] after it (or when the
/// server stops).
pub const REFUSAL_LINES_PER_S: u32 = 20;

/// How often the listener says the count of unlisted refusals of a second that is over.
pub const REFUSAL_FLUSH_EVERY: Duration = Duration::from_millis(500);

/// How long the end of a run waits for the notices said before it to reach the callback.
const NOTICE_FLUSH_WITHIN: Duration = Duration::from_secs(2);

/// The notice sink, shared by the engine and the connection tasks.
#[derive(Clone)]
pub(super) struct Notices {
    /// The callback's printer thread (None: the `tracing` log).
    sink: Option<LinePrinter>,
    refusals: Arc<Mutex<RefusalWindow>>,
}

/// The refusal lines said in the current one-second window, and the refusals left unsaid.
struct RefusalWindow {
    start: Instant,
    said: u32,
    unsaid: u64,
}

impl Notices {
    /// Notices to `sink`, called on a thread of its own (None: the `tracing` log). Fails only when that thread
    /// cannot be started.
    pub(super) fn new(sink: Option<Notice>) -> Result<Self> {
        let sink = match sink {
            Some(f) => Some(LinePrinter::new("spin-net notices", f)?),
            None => None,
        };
        Ok(Notices {
            sink,
            refusals: Arc::new(Mutex::new(RefusalWindow {
                start: Instant::now(),
                said: 0,
                unsaid: 0,
            })),
        })
    }

    /// Says `text`; never waits for the callback.
    pub(super) fn say(&self, text: &str) {
        match &self.sink {
            Some(p) => {
                p.say(text);
            }
            None => tracing::info!("{text}"),
        }
    }

    /// Waits, for [`NOTICE_FLUSH_WITHIN`] at most, until the notices said so far reached the callback (the end of a
    /// run: a caller reads them once `Server::run` returned).
    pub(super) async fn flush(&self) {
        if let Some(p) = self.sink.clone() {
            let _ = tokio::task::spawn_blocking(move || p.flush(NOTICE_FLUSH_WITHIN)).await;
        }
    }

    /// One line for a connection from `peer` refused for `why` (a [`NetError`]'s text never holds a token or a
    /// secret): `refused 127.0.0.1:51234: unauthorized: Hello.token is not one of this server's tokens`.
    pub(super) fn refused(&self, peer: SocketAddr, why: &dyn std::fmt::Display) {
        let (earlier, say) = {
            let mut w = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
            let mut earlier = None;
            if w.start.elapsed() >= Duration::from_secs(1) {
                earlier = Some(std::mem::take(&mut w.unsaid)).filter(|&n| n > 0);
                w.start = Instant::now();
                w.said = 0;
            }
            let say = w.said < REFUSAL_LINES_PER_S;
            if say {
                w.said += 1;
            } else {
                w.unsaid += 1;
            }
            (earlier, say)
        };
        if let Some(n) = earlier {
            self.say(&unsaid_line(n));
        }
        if say {
            self.say(&format!("refused {peer}: {why}"));
        }
    }

    /// Says how many refusals went unsaid in a second that is over, if any, and starts a new second (the listener's
    /// timer: a flood that stops is still counted within a second or two, not only with the next refusal).
    pub(super) fn flush_due_refusals(&self) {
        let n = {
            let mut w = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
            if w.unsaid == 0 || w.start.elapsed() < Duration::from_secs(1) {
                return;
            }
            w.start = Instant::now();
            w.said = 0;
            std::mem::take(&mut w.unsaid)
        };
        self.say(&unsaid_line(n));
    }

    /// Says how many refusals went unsaid, if any (when the server stops).
    pub(super) fn flush_refusals(&self) {
        let n = std::mem::take(&mut self.refusals.lock().unwrap_or_else(|p| p.into_inner()).unsaid);
        if n > 0 {
            self.say(&unsaid_line(n));
        }
    }
}

fn unsaid_line(n: u64) -> String {
    format!(
        "refused {n} more connection(s), not listed (at most {REFUSAL_LINES_PER_S} refusals are listed a second)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_refusals_is_listed_up_to_the_rate_then_counted() {
        let lines: Arc<Mutex<Vec<String>>> = Default::default();
        let l = lines.clone();
        let n = Notices::new(Some(Box::new(move |t: &str| {
            l.lock().unwrap().push(t.to_string())
        })))
        .unwrap();
        let flushed = |n: &Notices| n.sink.as_ref().unwrap().flush(Duration::from_secs(10));
        let peer: SocketAddr = "127.0.0.9:4000".parse().unwrap();
        for _ in 0..REFUSAL_LINES_PER_S + 7 {
            n.refused(peer, &"full: 3 open connections");
        }
        // Within its second the count waits; once the second is over the timer says it, without a refusal more.
        n.flush_due_refusals();
        assert!(flushed(&n));
        assert_eq!(lines.lock().unwrap().len(), REFUSAL_LINES_PER_S as usize);
        std::thread::sleep(Duration::from_millis(1050));
        n.flush_due_refusals();
        n.flush_due_refusals();
        n.flush_refusals();
        assert!(flushed(&n));
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), REFUSAL_LINES_PER_S as usize + 1, "{lines:?}");
        assert_eq!(lines[0], "refused 127.0.0.9:4000: full: 3 open connections");
        assert!(
            lines.last().unwrap().starts_with("refused 7 more connection(s)"),
            "{lines:?}"
        );
    }
}
