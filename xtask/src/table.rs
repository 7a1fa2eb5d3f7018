//! Result tables of the reproduction: one type written as CSV, as fixed-width text (insta) and as Markdown.

use anyhow::Context;
use std::fmt::Write as _;
use std::path::Path;

/// One table cell: a number (rendered with fixed significant digits) or text.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// A number; integers print without a fraction.
    Num(f64),
    /// Free text.
    Text(String),
}

impl From<f64> for Cell {
    fn from(v: f64) -> Self {
        Cell::Num(v)
    }
}
impl From<usize> for Cell {
    fn from(v: usize) -> Self {
        Cell::Num(v as f64)
    }
}
impl From<u32> for Cell {
    fn from(v: u32) -> Self {
        Cell::Num(f64::from(v))
    }
}
impl From<&str> for Cell {
    fn from(v: &str) -> Self {
        Cell::Text(v.to_owned())
    }
}
impl From<String> for Cell {
    fn from(v: String) -> Self {
        Cell::Text(v)
    }
}

/// A rectangular table with named columns.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Table {
    /// Column names (with units, e.g. `goodput_tok_per_s`).
    pub columns: Vec<String>,
    /// Rows, each as long as `columns`.
    pub rows: Vec<Vec<Cell>>,
}

/// Formats `v` with `sig` significant digits, without exponent for ordinary magnitudes.
pub fn format_sig(v: f64, sig: usize) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    if v == v.trunc() && v.abs() < 1e15 {
        return format!("{}", v as i64);
    }
    let magnitude = if v == 0.0 {
        0
    } else {
        v.abs().log10().floor() as i32
    };
    if !(-4..15).contains(&magnitude) {
        return format!("{:.*e}", sig.saturating_sub(1), v);
    }
    let decimals = (sig as i32 - 1 - magnitude).max(0) as usize;
    format!("{v:.decimals$}")
}

impl Table {
    /// An empty table with these columns.
    pub fn new(columns: &[&str]) -> Self {
        Table {
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row.
    ///
    /// # Panics
    /// When the row's length differs from the number of columns: that is a bug in the figure code, not input.
    pub fn push(&mut self, row: Vec<Cell>) {
        assert_eq!(
            row.len(),
            self.columns.len(),
            "row length must match the columns {:?}",
            self.columns
        );
        self.rows.push(row);
    }

    fn cell_text(cell: &Cell, sig: usize) -> String {
        match cell {
            Cell::Num(v) => format_sig(*v, sig),
            Cell::Text(t) => t.clone(),
        }
    }

    /// Writes the table as CSV with full precision numbers (text cells quoted when needed).
    pub fn write_csv(&self, path: &Path) -> anyhow::Result<()> {
        let mut out = String::new();
        let quote = |s: &str| {
            if s.contains([',', '"', '\n']) {
                format!("\"{}\"", s.replace('"', "\"\""))
            } else {
                s.to_owned()
            }
        };
        let header: Vec<String> = self.columns.iter().map(|c| quote(c)).collect();
        writeln!(out, "{}", header.join(","))?;
        for row in &self.rows {
            let cells: Vec<String> = row
                .iter()
                .map(|c| match c {
                    Cell::Num(v) => format!("{v}"),
                    Cell::Text(t) => quote(t),
                })
                .collect();
            writeln!(out, "{}", cells.join(","))?;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
    }

    fn text_grid(&self, sig: usize) -> Vec<Vec<String>> {
        let mut grid = vec![self.columns.clone()];
        grid.extend(
            self.rows
                .iter()
                .map(|r| r.iter().map(|c| Self::cell_text(c, sig)).collect()),
        );
        grid
    }

    /// Fixed-width text with `sig` significant digits: the form kept in insta snapshots.
    #[cfg_attr(
        not(test),
        allow(dead_code, reason = "only the snapshot tests render text tables")
    )]
    pub fn render(&self, sig: usize) -> String {
        let grid = self.text_grid(sig);
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|j| grid.iter().map(|r| r[j].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for row in &grid {
            let line: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:>w$}")).collect();
            out.push_str(line.join("  ").trim_end());
            out.push('\n');
        }
        out
    }

    /// The index of column `name`.
    pub fn col(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }

    /// The numbers of column `name` (NaN for a text cell; empty when there is no such column).
    pub fn values(&self, name: &str) -> Vec<f64> {
        let Some(j) = self.col(name) else {
            return Vec::new();
        };
        self.rows
            .iter()
            .map(|r| match &r[j] {
                Cell::Num(v) => *v,
                Cell::Text(_) => f64::NAN,
            })
            .collect()
    }

    /// A Markdown table like [`Table::to_markdown`], with every column `X_ci95` folded into column `X` as
    /// "mean ± half-width" (the reviewer reads the interval beside its mean).
    pub fn to_markdown_ci(&self, sig: usize) -> String {
        let ci_of = |j: usize| self.col(&format!("{}_ci95", self.columns[j]));
        let shown: Vec<usize> = (0..self.columns.len())
            .filter(|&j| {
                !self.columns[j].ends_with("_ci95")
                    || self.col(self.columns[j].trim_end_matches("_ci95")).is_none()
            })
            .collect();
        let mut out = String::new();
        let header: Vec<String> = shown
            .iter()
            .map(|&j| {
                if ci_of(j).is_some() {
                    format!("{} (± 95 % CI)", self.columns[j])
                } else {
                    self.columns[j].clone()
                }
            })
            .collect();
        out.push_str(&format!(
            "| {} |\n|{}\n",
            header.join(" | "),
            "---|".repeat(shown.len())
        ));
        for row in &self.rows {
            let cells: Vec<String> = shown
                .iter()
                .map(|&j| {
                    let v = Self::cell_text(&row[j], sig);
                    match ci_of(j).map(|c| &row[c]) {
                        // A spread below rounding noise of the mean (an identical value in every realisation).
                        Some(Cell::Num(h))
                            if h.is_finite()
                                && *h
                                    <= 1e-9
                                        * f64::max(
                                            1.0,
                                            match &row[j] {
                                                Cell::Num(m) => m.abs(),
                                                Cell::Text(_) => 1.0,
                                            },
                                        ) =>
                        {
                            format!("{v} ± 0")
                        }
                        Some(Cell::Num(h)) if h.is_finite() => format!("{v} ± {}", format_sig(*h, 2)),
                        _ => v,
                    }
                })
                .collect();
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
        out
    }

    /// A Markdown table with `sig` significant digits, for REPORT.md.
    pub fn to_markdown(&self, sig: usize) -> String {
        let grid = self.text_grid(sig);
        let mut out = String::new();
        for (i, row) in grid.iter().enumerate() {
            out.push_str(&format!("| {} |\n", row.join(" | ")));
            if i == 0 {
                out.push_str(&format!("|{}\n", "---|".repeat(row.len())));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn significant_digits() {
        assert_eq!(format_sig(145.237, 4), "145.2");
        assert_eq!(format_sig(0.012345, 3), "0.0123");
        assert_eq!(format_sig(20.0, 4), "20");
        assert_eq!(format_sig(1.5e-7, 3), "1.50e-7");
        assert_eq!(format_sig(-2.26, 2), "-2.3");
    }

    #[test]
    fn renders_csv_text_and_markdown() {
        let mut t = Table::new(&["scheme", "goodput_tok_per_s"]);
        t.push(vec!["exact".into(), 145.2371.into()]);
        t.push(vec!["a,b".into(), 3usize.into()]);
        assert_eq!(
            t.render(4),
            "scheme  goodput_tok_per_s\n exact              145.2\n   a,b                  3\n"
        );
        assert!(
            t.to_markdown(3)
                .starts_with("| scheme | goodput_tok_per_s |\n|---|---|\n| exact | 145 |")
        );
        let dir = std::env::temp_dir().join(format!("xtask-table-{}", std::process::id()));
        let path = dir.join("t.csv");
        t.write_csv(&path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "scheme,goodput_tok_per_s\nexact,145.2371\n\"a,b\",3\n"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn markdown_folds_intervals_into_their_column() {
        let mut t = Table::new(&["x", "g", "g_ci95"]);
        t.push(vec![1usize.into(), 145.2371.into(), 1.234.into()]);
        assert_eq!(
            t.to_markdown_ci(4),
            "| x | g (± 95 % CI) |\n|---|---|\n| 1 | 145.2 ± 1.2 |\n"
        );
        assert_eq!(t.values("g"), vec![145.2371]);
    }
}
