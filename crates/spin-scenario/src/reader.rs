//! The strict reader every file family shares: JSON or TOML text parsed once into a value, a repeated key refused
//! (serde_json's own `Value` keeps the last one silently; TOML refuses it itself), then deserialised into a file
//! struct that refuses unknown fields, every error naming its field path (`devices[2].acceptance: …`) on one line.

use crate::FileError;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::path::Path;

/// The syntax of a file's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JSON (RFC 8259), duplicate keys refused.
    Json,
    /// TOML 1.0.
    Toml,
}

impl Format {
    /// The format of a file by its name: `*.toml` is TOML, anything else JSON.
    pub fn of_path(path: &Path) -> Format {
        if path.extension().is_some_and(|e| e == "toml") {
            Format::Toml
        } else {
            Format::Json
        }
    }
}

/// A file parsed once: its value, deserialised into a struct by [`Document::into_struct`] (not from the text a
/// second time). `root` names the whole file in errors that have no field (`scenario`, `drop`; empty for none).
pub struct Document {
    value: Value,
    root: &'static str,
}

enum Value {
    Json(serde_json::Value),
    Toml(toml::Value),
}

/// The source position of byte `offset` of `text` as "line L, column C" (both from 1).
pub fn line_column(text: &str, offset: usize) -> String {
    let offset = offset.min(text.len());
    let before = &text.as_bytes()[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let column = String::from_utf8_lossy(&before[line_start..]).chars().count() + 1;
    format!("line {line}, column {column}")
}

/// Names an error by its field path, or by `root` at the top level; the first line of the message only (a TOML
/// error's Display is a multi-line excerpt of the file).
fn at_path(path: &serde_path_to_error::Path, root: &str, inner: &str) -> FileError {
    let path = path.to_string();
    let inner = inner.lines().next().unwrap_or("").trim();
    if path == "." || path == "?" || path.is_empty() {
        FileError::new(root, inner)
    } else {
        FileError::new(path, inner)
    }
}

/// A TOML syntax error, with its position when the parser gives one.
fn malformed_toml(text: &str, root: &str, e: &toml::de::Error) -> FileError {
    let at = e
        .span()
        .map(|s| format!(" at {}", line_column(text, s.start)))
        .unwrap_or_default();
    FileError::new(root, format!("malformed TOML{at}: {}", e.message().trim()))
}

impl Document {
    /// Parses `text` as `format`; syntax errors say where in the text they are, a repeated JSON key is named by its
    /// path.
    pub fn parse(text: &str, format: Format, root: &'static str) -> Result<Document, FileError> {
        let value = match format {
            Format::Toml => {
                let table: toml::Table = text.parse().map_err(|e| malformed_toml(text, root, &e))?;
                Value::Toml(toml::Value::Table(table))
            }
            Format::Json => {
                let mut de = serde_json::Deserializer::from_str(text);
                let value: StrictJson = serde_path_to_error::deserialize(&mut de).map_err(|e| {
                    let inner = e.inner();
                    // A syntax error has no field to name: say where in the file it is instead.
                    if inner.is_syntax() || inner.is_eof() {
                        let msg = inner.to_string();
                        let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
                        FileError::new(
                            root,
                            format!(
                                "malformed JSON at line {}, column {}: {msg}",
                                inner.line(),
                                inner.column()
                            ),
                        )
                    } else {
                        at_path(e.path(), root, &inner.to_string())
                    }
                })?;
                de.end()
                    .map_err(|e| FileError::new(root, format!("trailing characters: {e}")))?;
                Value::Json(value.0)
            }
        };
        Ok(Document { value, root })
    }

    /// The top-level string field `key`, if the file has one that is a string; `Err` with its JSON text when it is
    /// present but not a string (for the message naming a wrong value).
    pub fn top_level_str(&self, key: &str) -> Option<Result<String, String>> {
        let json = match &self.value {
            Value::Json(v) => v.get(key).cloned(),
            Value::Toml(v) => v.get(key).and_then(|m| serde_json::to_value(m).ok()),
        }?;
        Some(match json {
            serde_json::Value::String(s) => Ok(s),
            other => Err(other.to_string()),
        })
    }

    /// Whether the dotted `path` (`sampling.bandwidths_mhz`) is a key of the file; a segment `name[]` walks into
    /// every table of the array `name` (`pairs[].verify_per_draft_s`: any pair has the key).
    pub fn has_key(&self, path: &str) -> bool {
        match &self.value {
            Value::Toml(toml::Value::Table(t)) => lookup_toml(t, path),
            Value::Toml(_) => false,
            Value::Json(v) => lookup_json(v, path),
        }
    }

    /// Refuses every key of `renamed` (old name, what replaced it) that the file still has, naming the new key.
    pub fn refuse_renamed(&self, renamed: &[(&str, &str)]) -> Result<(), FileError> {
        for (old, new) in renamed {
            if self.has_key(old) {
                return Err(FileError::new(
                    *old,
                    format!("renamed to {new} (docs/cli.md lists the names)"),
                ));
            }
        }
        Ok(())
    }

    /// Deserialises the parsed value into `T`, the error naming the field path.
    pub fn into_struct<T: DeserializeOwned>(self) -> Result<T, FileError> {
        let root = self.root;
        match self.value {
            Value::Json(v) => serde_path_to_error::deserialize(v)
                .map_err(|e| at_path(e.path(), root, &e.inner().to_string())),
            Value::Toml(v) => {
                serde_path_to_error::deserialize(v).map_err(|e| at_path(e.path(), root, e.inner().message()))
            }
        }
    }
}

/// Deserialises TOML `text` straight into `T` (no value in between), so an error names both the field path and
/// where in the text the field is (`fading: unknown variant … (line 9, column 10)`).
pub fn toml_with_positions<T: DeserializeOwned>(text: &str, root: &'static str) -> Result<T, FileError> {
    let de = toml::Deserializer::parse(text).map_err(|e| malformed_toml(text, root, &e))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e
            .inner()
            .span()
            .map(|s| format!(" ({})", line_column(text, s.start)))
            .unwrap_or_default();
        let inner = e.inner().message().trim().to_string();
        let inner = format!("{}{at}", inner.lines().next().unwrap_or(""));
        at_path(e.path(), root, &inner)
    })
}

fn lookup_toml(table: &toml::Table, path: &str) -> bool {
    let (head, tail) = match path.split_once('.') {
        Some((h, t)) => (h, Some(t)),
        None => (path, None),
    };
    if let Some(name) = head.strip_suffix("[]") {
        let Some(items) = table.get(name).and_then(toml::Value::as_array) else {
            return false;
        };
        return items.iter().any(|item| match (item.as_table(), tail) {
            (Some(t), Some(rest)) => lookup_toml(t, rest),
            (Some(_), None) => true,
            (None, _) => false,
        });
    }
    match (table.get(head), tail) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(v), Some(rest)) => v.as_table().is_some_and(|t| lookup_toml(t, rest)),
    }
}

fn lookup_json(value: &serde_json::Value, path: &str) -> bool {
    let (head, tail) = match path.split_once('.') {
        Some((h, t)) => (h, Some(t)),
        None => (path, None),
    };
    if let Some(name) = head.strip_suffix("[]") {
        let Some(items) = value.get(name).and_then(serde_json::Value::as_array) else {
            return false;
        };
        return items.iter().any(|item| match tail {
            Some(rest) => lookup_json(item, rest),
            None => true,
        });
    }
    match (value.get(head), tail) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(v), Some(rest)) => lookup_json(v, rest),
    }
}

/// A JSON value whose objects refuse a repeated key. The error is raised while deserialising the repeated key's
/// value, so serde_path_to_error names it by its path.
struct StrictJson(serde_json::Value);

impl<'de> Deserialize<'de> for StrictJson {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(StrictJson)
    }
}

struct StrictVisitor;

/// Fails with "duplicate field `key`" in place of the repeated key's value.
struct Duplicate<'a>(&'a str);

impl<'de> serde::de::DeserializeSeed<'de> for Duplicate<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, _: D) -> Result<(), D::Error> {
        Err(serde::de::Error::custom(format_args!(
            "duplicate field `{}`",
            self.0
        )))
    }
}

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, serde_json::Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(StrictJson(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(serde_json::Value::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                map.next_value_seed(Duplicate(&key))?;
            }
            let StrictJson(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(serde_json::Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_from_one() {
        assert_eq!(line_column("ab\ncd", 0), "line 1, column 1");
        assert_eq!(line_column("ab\ncd", 4), "line 2, column 2");
        assert_eq!(line_column("é\nx", 99), "line 2, column 2");
    }

    #[test]
    fn renamed_keys_are_found_in_sections_and_arrays_of_tables() {
        let doc = Document::parse(
            "[sampling]\nbandwidths_mhz = [1.0]\n[[pairs]]\nname = \"a\"\n[[pairs]]\nverify_per_draft_s = 1.0\n",
            Format::Toml,
            "",
        )
        .unwrap();
        assert!(doc.has_key("sampling.bandwidths_mhz"));
        assert!(doc.has_key("pairs[].verify_per_draft_s"));
        assert!(!doc.has_key("pairs[].vocab"));
        assert!(!doc.has_key("sampling.device_counts"));
        let e = doc
            .refuse_renamed(&[("pairs[].verify_per_draft_s", "pairs[].verify_per_device_s")])
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "pairs[].verify_per_draft_s: renamed to pairs[].verify_per_device_s (docs/cli.md lists the names)"
        );
        let json = Document::parse(r#"{"a": {"b": 1}, "c": [{"d": 2}]}"#, Format::Json, "scenario").unwrap();
        assert!(json.has_key("a.b") && json.has_key("c[].d") && !json.has_key("a.d"));
    }

    #[test]
    fn syntax_errors_say_where_and_name_the_file() {
        let e = Document::parse("{\"a\": 1,,}", Format::Json, "scenario")
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .starts_with("scenario: malformed JSON at line 1, column "),
            "{e}"
        );
        let e = Document::parse("a = 1\nb = = 2\n", Format::Toml, "drop")
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .starts_with("drop: malformed TOML at line 2, column "),
            "{e}"
        );
        let e = Document::parse("a = \n", Format::Toml, "").err().unwrap();
        assert!(e.to_string().starts_with("malformed TOML at line 1"), "{e}");
    }
}
