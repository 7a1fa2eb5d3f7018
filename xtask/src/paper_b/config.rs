//! Paper B reproduction parameters: the format is `spin_scenario::repro::paper_b` (docs/cli.md, "Reproduction
//! configs"); here the file is found and read, `scenarios/paper-b.toml` or the file named by [`CONFIG_ENV`].

use anyhow::Context;
use std::path::PathBuf;

pub use spin_scenario::repro::paper_b::{Config, Pair};

/// Environment variable naming an alternative parameter file (e.g. with measured acceptance rates).
pub const CONFIG_ENV: &str = "MULTISPIN_PAPER_B_CONFIG";

/// Finding and reading the parameter file.
pub(crate) trait Load: Sized {
    /// The committed parameter file.
    fn default_path() -> PathBuf;
    /// Reads the file named by [`CONFIG_ENV`], else the committed one.
    fn load() -> anyhow::Result<(Self, PathBuf)>;
}

impl Load for Config {
    fn default_path() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("scenarios")
            .join("paper-b.toml")
    }

    fn load() -> anyhow::Result<(Config, PathBuf)> {
        let path = std::env::var_os(CONFIG_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(Self::default_path);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let cfg = Config::parse(&text).with_context(|| format!("in {}", path.display()))?;
        Ok((cfg, path))
    }
}
