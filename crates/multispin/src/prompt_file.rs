//! `--prompts FILE` of `generate` and `simulate`: one prompt a line, read with a bound.

use crate::failure::Failure;
use std::path::Path;

/// The largest prompts file, in bytes, checked before and while reading (docs/cli.md lists the limits).
pub const MAX_BYTES: usize = 1 << 20;

/// The prompts of `file`, one a line (`\n` or `\r\n`), in order: UTF-8 text of at most [`MAX_BYTES`] holding at
/// least one line and no blank one (a blank line would be an empty prompt; the error names its line). Every
/// failure is an input error naming `--prompts` and the file.
pub fn read(file: &Path) -> Result<Vec<String>, Failure> {
    let bytes = spin_runtime::limits::read_limited(file, MAX_BYTES as u64, "prompts file")
        .map_err(|e| Failure::Input(format!("--prompts: {}", first_line(&e.to_string()))))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| Failure::Input(format!("--prompts: {} is not UTF-8 text: {e}", file.display())))?;
    parse(&text).map_err(|reason| Failure::Input(format!("--prompts: {} {reason}", file.display())))
}

/// The lines of `text`, or why they are not a list of prompts.
fn parse(text: &str) -> Result<Vec<String>, String> {
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    if lines.is_empty() {
        return Err("holds no prompt".into());
    }
    if let Some(n) = lines.iter().position(|l| l.trim().is_empty()) {
        return Err(format!(
            "line {} is blank (one prompt a line; an empty prompt is no prompt)",
            n + 1
        ));
    }
    Ok(lines)
}

/// The first line of a message.
fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

/// Where a prompt of a prompts file came from, for messages: `--prompts FILE line N` (1-based).
pub fn line_label(file: &Path, index: usize) -> String {
    format!("--prompts {} line {}", file.display(), index + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_prompts_and_blank_ones_are_named() {
        assert_eq!(parse("a\r\nb c\n").unwrap(), ["a", "b c"]);
        assert_eq!(parse("a").unwrap(), ["a"]);
        assert_eq!(parse("").unwrap_err(), "holds no prompt");
        for (text, line) in [("\n", 1), ("a\n\nb\n", 2), ("a\n  \t\n", 2), ("a\nb\n\n", 3)] {
            let e = parse(text).unwrap_err();
            assert!(e.starts_with(&format!("line {line} is blank")), "{text:?}: {e}");
        }
    }
}
