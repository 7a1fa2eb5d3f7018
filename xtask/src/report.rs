//! The reproduction context (output folder, quick or paper-scale, seed, progress bars) and REPORT.md.

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a stage reports on a stderr that is not a terminal (a log file, CI).
const PLAIN_EVERY: Duration = Duration::from_secs(5);

/// The progress of one stage: a bar on a terminal, a plain line every few seconds elsewhere (a log shows that a
/// long stage is alive and how far it is), nothing in quick runs.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
    plain: Option<Plain>,
}

#[derive(Debug)]
struct Plain {
    label: String,
    len: u64,
    done: AtomicU64,
    start: Instant,
    last: Mutex<Instant>,
}

impl Progress {
    /// One more step (any thread).
    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
        if let Some(p) = &self.plain {
            let done = p.done.fetch_add(n, Ordering::Relaxed) + n;
            if let Ok(mut last) = p.last.lock()
                && last.elapsed() >= PLAIN_EVERY
            {
                *last = Instant::now();
                eprintln!(
                    "{}: {done}/{} after {:.0} s",
                    p.label,
                    p.len,
                    p.start.elapsed().as_secs_f64()
                );
            }
        }
    }

    /// Ends the stage (the timing line follows from [`Ctx::timed`]).
    pub fn finish_and_clear(&self) {
        self.bar.finish_and_clear();
    }

    /// Whether nothing is shown.
    #[cfg_attr(
        not(test),
        allow(dead_code, reason = "the report test checks quick runs stay silent")
    )]
    pub fn is_hidden(&self) -> bool {
        self.bar.is_hidden() && self.plain.is_none()
    }
}

/// What every figure function gets: where to write, how large to run, which seed.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// Output folder (default `target/reproduce`).
    pub out_dir: PathBuf,
    /// Quick configuration: small sample counts, no progress bars (snapshot tests, smoke runs).
    pub quick: bool,
    /// Master seed; each figure derives its own streams from it.
    pub seed: u64,
}

impl Ctx {
    /// The progress of a stage of `len` steps labelled `msg`: a bar when stderr is a terminal, a line every few
    /// seconds when it is not, nothing in quick mode.
    pub fn progress(&self, len: u64, msg: &str) -> Progress {
        if self.quick {
            return Progress {
                bar: ProgressBar::hidden(),
                plain: None,
            };
        }
        if !std::io::stderr().is_terminal() {
            return Progress {
                bar: ProgressBar::hidden(),
                plain: Some(Plain {
                    label: msg.trim().to_owned(),
                    len,
                    done: AtomicU64::new(0),
                    start: Instant::now(),
                    last: Mutex::new(Instant::now()),
                }),
            };
        }
        let bar = ProgressBar::new(len);
        let style = ProgressStyle::with_template("{msg:>28} [{bar:40}] {pos}/{len} ({elapsed}, eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        bar.set_message(msg.to_owned());
        Progress { bar, plain: None }
    }

    /// Runs one figure's computation and prints how long it took on stderr (`paper A fig 6: 1.2 s`), so a user
    /// sees where the time of a reproduction goes.
    pub fn timed<T>(&self, label: &str, f: impl FnOnce() -> T) -> T {
        let start = std::time::Instant::now();
        let out = f();
        eprintln!("{label:>16}: {:.1} s", start.elapsed().as_secs_f64());
        out
    }

    /// The path of `file` inside the output folder.
    pub fn path(&self, file: &str) -> PathBuf {
        self.out_dir.join(file)
    }
}

/// The Markdown that embeds figure `file` (relative to REPORT.md) with its title as alt text and its caption notes.
pub fn embed(file: &str, title: &str, notes: &[String]) -> String {
    let mut md = format!("![{title}]({file})\n\n");
    if !notes.is_empty() {
        md.push_str(&format!("*{}*\n\n", notes.join(" ")));
    }
    md
}

/// REPORT.md under construction: a header, then one section per figure.
#[derive(Debug, Clone, Default)]
pub struct Report {
    sections: Vec<(String, String)>,
    claims: Vec<[String; 6]>,
}

/// One row of the report's summary table: a figure's claim in the paper beside ours, the difference and why.
#[derive(Debug, Clone)]
pub struct Claim<'a> {
    /// The figure (e.g. "A Fig. 7").
    pub figure: &'a str,
    /// What is claimed, in a few words.
    pub claim: &'a str,
    /// Our number or finding.
    pub ours: String,
    /// The paper's number or statement.
    pub paper: &'a str,
    /// The difference in a few words ("+6 %", "matches", "opposite order").
    pub difference: String,
    /// Why, from the model (or as an erratum of the paper).
    pub why: String,
}

fn anchor(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

impl Report {
    /// Adds a section with a Markdown body.
    pub fn section(&mut self, title: &str, markdown_body: String) {
        self.sections.push((title.to_owned(), markdown_body));
    }

    /// Adds a row to the summary table (ours | paper | difference | why).
    pub fn claim(&mut self, c: Claim) {
        let cell = |t: &str| t.replace('|', "\\|").replace('\n', " ");
        self.claims.push([
            cell(c.figure),
            cell(c.claim),
            cell(&c.ours),
            cell(c.paper),
            cell(&c.difference),
            cell(&c.why),
        ]);
    }

    /// The whole report as Markdown.
    pub fn render(&self, ctx: &Ctx, command: &str) -> String {
        let mut out = String::from("# Multi-SPIN reproduction report\n\n");
        out.push_str(&format!(
            "Generated by `{command}` with seed {} in the {} configuration. Every number below was computed by \
             this run; the papers' numbers are quoted beside ours where the papers print them. CSV and SVG files \
             for each figure sit next to this report.\n\n",
            ctx.seed,
            if ctx.quick { "quick (small sample counts)" } else { "paper-scale" }
        ));
        out.push_str("## Contents\n\n");
        if !self.claims.is_empty() {
            out.push_str("- [Summary: every figure and claim against the papers](#summary-every-figure-and-claim-against-the-papers)\n");
        }
        for (title, _) in &self.sections {
            out.push_str(&format!("- [{title}](#{})\n", anchor(title)));
        }
        out.push('\n');
        if !self.claims.is_empty() {
            out.push_str(
                "## Summary: every figure and claim against the papers\n\n\
                 Each row: the claim, our number from this run, the paper's, the difference and why it differs (from \
                 the model, from a parameter the paper leaves unstated — with its sensitivity band in the section of \
                 the figure — or as an erratum of the paper, with the computation). Intervals are 95 % confidence \
                 intervals over the realisations.\n\n\
                 | figure | claim | ours | paper | difference | why |\n|---|---|---|---|---|---|\n",
            );
            for c in &self.claims {
                out.push_str(&format!("| {} |\n", c.join(" | ")));
            }
            out.push('\n');
        }
        for (title, body) in &self.sections {
            out.push_str(&format!("## {title}\n\n{}\n\n", body.trim_end()));
        }
        out
    }

    /// Writes the report to `path`.
    pub fn write(&self, ctx: &Ctx, command: &str, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, self.render(ctx, command)).with_context(|| format!("writing {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lists_sections_in_order() {
        let ctx = Ctx {
            out_dir: PathBuf::from("out"),
            quick: true,
            seed: 3,
        };
        let mut r = Report::default();
        r.section("Paper A, Fig. 3", "body one".into());
        r.section("Paper B, Fig. 6", "body two\n".into());
        let text = r.render(&ctx, "cargo xtask reproduce --quick");
        assert!(text.contains("seed 3 in the quick"));
        assert!(text.contains("- [Paper A, Fig. 3](#paper-a-fig-3)"));
        let one = text.find("## Paper A, Fig. 3").unwrap();
        let two = text.find("## Paper B, Fig. 6").unwrap();
        assert!(one < two && text.ends_with("body two\n\n"));
        assert!(ctx.progress(10, "x").is_hidden());
        assert_eq!(ctx.path("a.csv"), PathBuf::from("out/a.csv"));
    }
}
