//! Reading the reproduction configs (`scenarios/paper-{a,b}.toml`) by the rules of the scenario files that
//! `multispin plan` and `correct` read (docs/cli.md, "Reproduction configs"): unknown keys and duplicates refused, every error
//! naming its field path, quantities in either unit of a pair (`spin_channel::units::one_of`), one name per
//! quantity. Keys of the older layout are refused with the name that replaced them.

use anyhow::{Result, anyhow, bail};
use serde::de::DeserializeOwned;
use spin_channel::units::{self, Conversion};

/// Deserialises TOML `text` into `T`; an error names the field path (`pairs[1].acceptance: …`).
pub fn parse_toml<T: DeserializeOwned>(text: &str, renamed: &[(&str, &str)]) -> Result<T> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| anyhow!("malformed TOML: {}", e.message().trim()))?;
    for (old, new) in renamed {
        if lookup(&table, old) {
            bail!("{old}: renamed to {new} (docs/cli.md lists the names)");
        }
    }
    // The table parsed above, not the text a second time. The error's message is the part that names the problem
    // (a TOML error's Display is a multi-line excerpt of the file).
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let inner = e.inner().message().trim().to_string();
        match e.path().to_string().as_str() {
            "." | "?" | "" => anyhow!("{inner}"),
            path => anyhow!("{path}: {inner}"),
        }
    })
}

/// Whether the dotted `path` (`sampling.bandwidths_mhz`) is a key of `table`; a segment `name[]` walks into every
/// table of the array `name` (`pairs[].verify_per_draft_s`: any pair has the key).
fn lookup(table: &toml::Table, path: &str) -> bool {
    let (head, tail) = match path.split_once('.') {
        Some((h, t)) => (h, Some(t)),
        None => (path, None),
    };
    if let Some(name) = head.strip_suffix("[]") {
        let Some(items) = table.get(name).and_then(toml::Value::as_array) else {
            return false;
        };
        return items.iter().any(|item| match (item.as_table(), tail) {
            (Some(t), Some(rest)) => lookup(t, rest),
            (Some(_), None) => true,
            (None, _) => false,
        });
    }
    match (table.get(head), tail) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(v), Some(rest)) => v.as_table().is_some_and(|t| lookup(t, rest)),
    }
}

/// One quantity under either name of a unit pair; `prefix` is the section (`system.`) for the error.
pub fn one_of(
    prefix: &str,
    first: (&str, Option<f64>),
    second: (&str, Option<f64>),
    conversion: Conversion,
) -> Result<f64> {
    let a = format!("{prefix}{}", first.0);
    let b = format!("{prefix}{}", second.0);
    units::one_of((&a, first.1), (&b, second.1), conversion).map_err(|e| anyhow!("{e}"))
}

/// A sweep axis under either name of a unit pair.
pub fn one_of_list(
    prefix: &str,
    first: (&str, Option<&[f64]>),
    second: (&str, Option<&[f64]>),
    conversion: Conversion,
) -> Result<Vec<f64>> {
    let a = format!("{prefix}{}", first.0);
    let b = format!("{prefix}{}", second.0);
    units::one_of_list((&a, first.1), (&b, second.1), conversion).map_err(|e| anyhow!("{e}"))
}
