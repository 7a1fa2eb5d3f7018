//! Reading scenario files: the file's text (at most [`MAX_SCENARIO_BYTES`], UTF-8), parsed by `spin-scenario` (JSON,
//! or TOML for `*.toml`; strict, every error naming its field path, unit pairs; docs/cli.md lists the fields).

use crate::failure::Failure;
use spin_optimize::round::Family;
use spin_scenario::Format;
use std::io::Read;
use std::path::Path;

pub use spin_scenario::{Loaded, PaperA};

/// The largest scenario file read: 16 MiB (checked before and while reading).
pub const MAX_SCENARIO_BYTES: u64 = 16 << 20;

/// Reads a scenario file of at most [`MAX_SCENARIO_BYTES`]; `*.toml` is TOML, anything else JSON.
pub fn load(path: &Path) -> Result<Loaded, Failure> {
    load_expecting(path, None)
}

/// [`load`] for a command that takes only `expect` scenarios: a file of the other model is refused by its `model`
/// field before its other fields are checked.
pub fn load_expecting(path: &Path, expect: Option<Family>) -> Result<Loaded, Failure> {
    let text = read_text(path, "scenario")?;
    spin_scenario::parse_expecting(&text, Format::of_path(path), expect).map_err(Failure::input)
}

/// Reads a UTF-8 text file of at most [`MAX_SCENARIO_BYTES`] (checked before and while reading); errors name
/// `what`.
pub fn read_text(path: &Path, what: &str) -> Result<String, Failure> {
    read_text_limited(path, what, MAX_SCENARIO_BYTES)
}

/// Reads a UTF-8 text file of at most `limit` bytes (checked before and while reading: `/dev/zero` or a pipe
/// reports length 0); errors name `what`.
pub fn read_text_limited(path: &Path, what: &str, limit: u64) -> Result<String, Failure> {
    let cannot = |e: std::io::Error| Failure::Input(format!("{what}: cannot read {}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    let too_large = || {
        Failure::Input(format!(
            "{what}: {} is larger than the limit of {limit} bytes",
            path.display()
        ))
    };
    if meta.is_dir() {
        return Err(Failure::Input(format!(
            "{what}: {} is a directory",
            path.display()
        )));
    }
    if meta.len() > limit {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    String::from_utf8(bytes)
        .map_err(|e| Failure::Input(format!("{what}: {} is not UTF-8: {e}", path.display())))
}
