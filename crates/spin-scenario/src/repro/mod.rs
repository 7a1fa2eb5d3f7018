//! The reproduction configs of `cargo xtask reproduce` (`scenarios/paper-a.toml`, `scenarios/paper-b.toml`): the
//! third member of the family with scenario and drop files, by the same rules (docs/cli.md, "Reproduction
//! configs"). Keys of the older layout are refused with the name that replaced them.

pub mod paper_a;
pub mod paper_b;

use crate::FileError;
use crate::reader::{Document, Format};
use serde::de::DeserializeOwned;

/// Deserialises TOML `text` into `T`, first refusing every old key of `renamed` (old path, what replaced it); an
/// error names the field path (`pairs[1].acceptance: …`).
pub fn parse_toml<T: DeserializeOwned>(text: &str, renamed: &[(&str, &str)]) -> Result<T, FileError> {
    let doc = Document::parse(text, Format::Toml, "")?;
    doc.refuse_renamed(renamed)?;
    doc.into_struct()
}
