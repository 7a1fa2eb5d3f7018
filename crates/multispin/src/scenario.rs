//! Reading scenario files: JSON with a `model` field (`paper-a`, the default, `paper-b` or `unified`).

use crate::failure::Failure;
use serde::de::DeserializeOwned;
use std::path::Path;

/// Which control model a scenario file describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// Paper A: draft lengths and OFDMA uplink bandwidth.
    PaperA,
    /// Paper B: uplink/downlink correction and proactive draft lengths.
    PaperB,
    /// The unified model of both papers (docs/unified.md).
    Unified,
}

/// Reads `path` as JSON and tells its model kind; malformed JSON is an input error naming the file.
pub fn read(path: &Path) -> Result<(Model, serde_json::Value), Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::Input(format!("scenario: cannot read {}: {e}", path.display())))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Failure::Input(format!("scenario: malformed JSON in {}: {e}", path.display())))?;
    let model = match value.get("model") {
        None => Model::PaperA,
        Some(serde_json::Value::String(s)) if s == "paper-a" => Model::PaperA,
        Some(serde_json::Value::String(s)) if s == "paper-b" => Model::PaperB,
        Some(serde_json::Value::String(s)) if s == "unified" => Model::Unified,
        Some(other) => {
            return Err(Failure::Input(format!(
                "model: expected \"paper-a\", \"paper-b\" or \"unified\", found {other}"
            )));
        }
    };
    Ok((model, value))
}

/// Deserialises a scenario value into `T`; serde's message (which names the field) becomes an input error.
pub fn parse<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, Failure> {
    serde_json::from_value(value).map_err(|e| Failure::Input(format!("scenario: {e}")))
}
