//! Reading scenario files (JSON, or TOML for `*.toml`) strictly: unknown or misspelt fields, duplicate keys and
//! missing fields are errors naming the field path (`devices[2].acceptance: …`), and every quantity users write in
//! logarithmic units may be given in either unit (`ul_power_w` or `ul_power_dbm`, exactly one of each pair).
//!
//! The file-side structs live here; they convert to the SI specs of `spin-optimize` (docs/cli.md lists the fields).

use crate::failure::Failure;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use spin_channel::units::{self, Conversion};
use spin_optimize::paper_a::heterogeneous::Alg1Params;
use spin_optimize::{paper_a, paper_b};
use std::io::Read;
use std::path::Path;

/// The largest scenario file read: 16 MiB (checked before and while reading).
pub const MAX_SCENARIO_BYTES: u64 = 16 << 20;

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

/// A paper-A scenario with the planner settings a file may carry.
#[derive(Debug, Clone)]
pub struct PaperA {
    /// The SI spec.
    pub spec: paper_a::ScenarioSpec,
    /// `fixed_draft_len`, when given.
    pub fixed_draft_len: Option<u32>,
    /// Algorithm 1's grid (documented defaults 100, 100, 1e-6).
    pub alg1: Alg1Params,
}

/// A parsed scenario file.
#[derive(Debug, Clone)]
pub enum Loaded {
    /// `"model": "paper-a"` (or no model field).
    PaperA(PaperA),
    /// `"model": "paper-b"`.
    PaperB(paper_b::ScenarioSpec),
    /// `"model": "unified"` (docs/unified.md).
    Unified(spin_optimize::round::ScenarioSpec),
}

/// Both units of one quantity: exactly one must be given (`spin_channel::units::one_of`, the rule of every file).
fn one_of(
    si: Option<f64>,
    alt: Option<f64>,
    si_name: &str,
    alt_name: &str,
    conversion: Conversion,
) -> Result<f64, Failure> {
    units::one_of((si_name, si), (alt_name, alt), conversion).map_err(|e| Failure::Input(e.to_string()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PaperADeviceFile {
    acceptance: f64,
    draft_token_s: f64,
    spectral_efficiency: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PaperAFile {
    #[serde(rename = "model")]
    _model: Option<String>,
    bandwidth_hz: Option<f64>,
    bandwidth_mhz: Option<f64>,
    // One name per quantity across both papers; the names paper-A files had before stay accepted.
    #[serde(alias = "bits_per_draft_token")]
    distribution_bits: f64,
    verify_fixed_s: f64,
    #[serde(alias = "verify_per_draft_s")]
    verify_per_device_s: f64,
    max_draft_len: u32,
    min_draft_len: Option<u32>,
    fixed_draft_len: Option<u32>,
    alg1_phi_points: Option<usize>,
    alg1_lambda_points: Option<usize>,
    alg1_lambda_lo_ratio: Option<f64>,
    devices: Vec<PaperADeviceFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PaperBDeviceFile {
    acceptance: f64,
    draft_token_s: f64,
    channel_gain: Option<f64>,
    channel_gain_db: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PaperBFile {
    #[serde(rename = "model")]
    _model: String,
    bandwidth_hz: Option<f64>,
    bandwidth_mhz: Option<f64>,
    distribution_bits: f64,
    verify_fixed_s: f64,
    verify_per_device_s: f64,
    max_draft_len: u32,
    ul_power_w: Option<f64>,
    ul_power_dbm: Option<f64>,
    dl_power_w: Option<f64>,
    dl_power_dbm: Option<f64>,
    noise_psd_server_w_per_hz: Option<f64>,
    noise_psd_server_dbm_per_hz: Option<f64>,
    noise_psd_device_w_per_hz: Option<f64>,
    noise_psd_device_dbm_per_hz: Option<f64>,
    saa_samples: u32,
    seed: u64,
    devices: Vec<PaperBDeviceFile>,
}

/// A scenario file parsed once: its `model` field chooses the struct, which is then deserialised from this value
/// (not from the text a second time). JSON duplicate keys are refused while parsing, named by their path, as the
/// struct deserialiser did; TOML refuses them itself.
enum Document {
    Json(serde_json::Value),
    Toml(toml::Value),
}

/// Names an error by its field path (`devices[2].acceptance: …`), or `scenario` at the top level; the first line of
/// the message only (a TOML error's Display is a multi-line excerpt of the file).
fn report(path: &serde_path_to_error::Path, inner: &dyn std::fmt::Display) -> Failure {
    let path = path.to_string();
    let inner = inner.to_string();
    let inner = inner.lines().next().unwrap_or("").trim();
    if path == "." || path == "?" || path.is_empty() {
        Failure::Input(format!("scenario: {inner}"))
    } else {
        Failure::Input(format!("{path}: {inner}"))
    }
}

impl Document {
    fn parse(text: &str, toml: bool) -> Result<Document, Failure> {
        if toml {
            let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
                let at = e
                    .span()
                    .map(|s| format!(" at {}", crate::failure::line_column(text, s.start)))
                    .unwrap_or_default();
                Failure::Input(format!("scenario: malformed TOML{at}: {}", e.message().trim()))
            })?;
            Ok(Document::Toml(toml::Value::Table(table)))
        } else {
            let mut de = serde_json::Deserializer::from_str(text);
            let value: StrictJson = serde_path_to_error::deserialize(&mut de).map_err(|e| {
                // A syntax error has no field to name: say where in the file it is instead.
                if e.inner().is_syntax() || e.inner().is_eof() {
                    let inner = e.inner();
                    let msg = inner.to_string();
                    let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
                    Failure::Input(format!(
                        "scenario: malformed JSON at line {}, column {}: {msg}",
                        inner.line(),
                        inner.column()
                    ))
                } else {
                    report(e.path(), e.inner())
                }
            })?;
            de.end()
                .map_err(|e| Failure::Input(format!("scenario: trailing characters: {e}")))?;
            Ok(Document::Json(value.0))
        }
    }

    /// The `model` field, as JSON (for the message naming an unknown one).
    fn model(&self) -> Option<serde_json::Value> {
        match self {
            Document::Json(v) => v.get("model").cloned(),
            Document::Toml(v) => v.get("model").and_then(|m| serde_json::to_value(m).ok()),
        }
    }

    /// Deserialises the parsed value into `T`, the error naming the field path.
    fn into_struct<T: DeserializeOwned>(self) -> Result<T, Failure> {
        match self {
            Document::Json(v) => serde_path_to_error::deserialize(v).map_err(|e| report(e.path(), e.inner())),
            Document::Toml(v) => {
                serde_path_to_error::deserialize(v).map_err(|e| report(e.path(), &e.inner().message()))
            }
        }
    }
}

/// A JSON value whose objects refuse a repeated key (serde_json's own `Value` keeps the last one silently). The
/// error is raised while deserialising the repeated key's value, so serde_path_to_error names it by its path.
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

/// Reads a scenario file of at most [`MAX_SCENARIO_BYTES`]; `*.toml` is TOML, anything else JSON.
pub fn load(path: &Path) -> Result<Loaded, Failure> {
    load_expecting(path, None)
}

/// [`load`] for a command that takes only `expect` scenarios: a file of the other model is refused by its `model`
/// field before its other fields are checked.
pub fn load_expecting(path: &Path, expect: Option<Model>) -> Result<Loaded, Failure> {
    let text = read_text(path, "scenario")?;
    parse_expecting(&text, path.extension().is_some_and(|e| e == "toml"), expect)
}

/// Reads a UTF-8 text file of at most [`MAX_SCENARIO_BYTES`] (checked before and while reading); errors name
/// `what`.
pub fn read_text(path: &Path, what: &str) -> Result<String, Failure> {
    let cannot = |e: std::io::Error| Failure::Input(format!("{what}: cannot read {}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    let too_large = || {
        Failure::Input(format!(
            "{what}: {} is larger than the limit of {MAX_SCENARIO_BYTES} bytes",
            path.display()
        ))
    };
    if meta.is_dir() {
        return Err(Failure::Input(format!(
            "{what}: {} is a directory",
            path.display()
        )));
    }
    if meta.len() > MAX_SCENARIO_BYTES {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    file.take(MAX_SCENARIO_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_SCENARIO_BYTES {
        return Err(too_large());
    }
    String::from_utf8(bytes)
        .map_err(|e| Failure::Input(format!("{what}: {} is not UTF-8: {e}", path.display())))
}

/// Parses scenario text (JSON, or TOML when `toml`).
pub fn parse(text: &str, toml: bool) -> Result<Loaded, Failure> {
    parse_expecting(text, toml, None)
}

fn parse_expecting(text: &str, toml: bool, expect: Option<Model>) -> Result<Loaded, Failure> {
    let doc = Document::parse(text, toml)?;
    let model = match doc.model() {
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
    if let Some(want) = expect
        && want != model
    {
        let name = |m: Model| match m {
            Model::PaperA => "paper-a",
            Model::PaperB => "paper-b",
            Model::Unified => "unified",
        };
        return Err(Failure::Input(format!(
            "model: this command needs a {} scenario (\"model\": \"{}\"), the file is {}",
            name(want),
            name(want),
            name(model)
        )));
    }
    match model {
        Model::PaperA => paper_a_from(doc.into_struct()?).map(Loaded::PaperA),
        Model::PaperB => paper_b_from(doc.into_struct()?).map(Loaded::PaperB),
        Model::Unified => doc.into_struct().map(Loaded::Unified),
    }
}

fn paper_a_from(f: PaperAFile) -> Result<PaperA, Failure> {
    let defaults = Alg1Params::default();
    Ok(PaperA {
        spec: paper_a::ScenarioSpec {
            bandwidth_hz: one_of(
                f.bandwidth_hz,
                f.bandwidth_mhz,
                "bandwidth_hz",
                "bandwidth_mhz",
                Conversion::MhzToHz,
            )?,
            distribution_bits: f.distribution_bits,
            verify_fixed_s: f.verify_fixed_s,
            verify_per_device_s: f.verify_per_device_s,
            max_draft_len: f.max_draft_len,
            min_draft_len: f.min_draft_len.unwrap_or(1),
            devices: f
                .devices
                .into_iter()
                .map(|d| paper_a::DeviceSpec {
                    acceptance: d.acceptance,
                    draft_token_s: d.draft_token_s,
                    spectral_efficiency: d.spectral_efficiency,
                })
                .collect(),
        },
        fixed_draft_len: f.fixed_draft_len,
        alg1: Alg1Params {
            phi_points: f.alg1_phi_points.unwrap_or(defaults.phi_points),
            lambda_points: f.alg1_lambda_points.unwrap_or(defaults.lambda_points),
            lambda_lo_ratio: f.alg1_lambda_lo_ratio.unwrap_or(defaults.lambda_lo_ratio),
        },
    })
}

fn paper_b_from(f: PaperBFile) -> Result<paper_b::ScenarioSpec, Failure> {
    let devices = f
        .devices
        .into_iter()
        .enumerate()
        .map(|(k, d)| {
            Ok(paper_b::DeviceSpec {
                acceptance: d.acceptance,
                draft_token_s: d.draft_token_s,
                channel_gain: one_of(
                    d.channel_gain,
                    d.channel_gain_db,
                    &format!("devices[{k}].channel_gain"),
                    &format!("devices[{k}].channel_gain_db"),
                    Conversion::DbToLinear,
                )?,
            })
        })
        .collect::<Result<Vec<_>, Failure>>()?;
    Ok(paper_b::ScenarioSpec {
        bandwidth_hz: one_of(
            f.bandwidth_hz,
            f.bandwidth_mhz,
            "bandwidth_hz",
            "bandwidth_mhz",
            Conversion::MhzToHz,
        )?,
        distribution_bits: f.distribution_bits,
        verify_fixed_s: f.verify_fixed_s,
        verify_per_device_s: f.verify_per_device_s,
        max_draft_len: f.max_draft_len,
        ul_power_w: one_of(
            f.ul_power_w,
            f.ul_power_dbm,
            "ul_power_w",
            "ul_power_dbm",
            Conversion::DbmToW,
        )?,
        dl_power_w: one_of(
            f.dl_power_w,
            f.dl_power_dbm,
            "dl_power_w",
            "dl_power_dbm",
            Conversion::DbmToW,
        )?,
        noise_psd_server_w_per_hz: one_of(
            f.noise_psd_server_w_per_hz,
            f.noise_psd_server_dbm_per_hz,
            "noise_psd_server_w_per_hz",
            "noise_psd_server_dbm_per_hz",
            Conversion::DbmPerHzToWPerHz,
        )?,
        noise_psd_device_w_per_hz: one_of(
            f.noise_psd_device_w_per_hz,
            f.noise_psd_device_dbm_per_hz,
            "noise_psd_device_w_per_hz",
            "noise_psd_device_dbm_per_hz",
            Conversion::DbmPerHzToWPerHz,
        )?,
        saa_samples: f.saa_samples,
        seed: f.seed,
        devices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const A: &str = include_str!("../../../scenarios/examples/paper-a.json");
    const B: &str = include_str!("../../../scenarios/examples/paper-b.json");

    fn err(text: &str) -> String {
        match parse(text, false) {
            Err(Failure::Input(m)) => m,
            Err(Failure::Runtime(e)) => panic!("runtime error {e}"),
            Ok(_) => panic!("accepted: {text}"),
        }
    }

    #[test]
    fn examples_parse() {
        assert!(matches!(parse(A, false).unwrap(), Loaded::PaperA(_)));
        assert!(matches!(parse(B, false).unwrap(), Loaded::PaperB(_)));
    }

    #[test]
    fn unknown_misspelt_duplicate_and_missing_fields_are_named() {
        let e = err(&A.replacen("\"bandwidth_hz\"", "\"bandwith_hz\": 1, \"bandwidth_hz\"", 1));
        assert!(e.starts_with("bandwith_hz: unknown field `bandwith_hz`"), "{e}");
        let e = err(&A.replacen(
            "\"acceptance\": 0.7390",
            "\"acceptance\": 0.7390, \"acceptence\": 1",
            1,
        ));
        assert!(
            e.starts_with("devices[1].acceptence: unknown field `acceptence`"),
            "{e}"
        );
        let e = err(&A.replacen(
            "\"max_draft_len\": 25",
            "\"max_draft_len\": 25, \"max_draft_len\": 3",
            1,
        ));
        assert!(e.contains("duplicate field `max_draft_len`"), "{e}");
        // Parsed once into a value: a repeated key is still refused, named by its path, also inside a device.
        let e = err(&A.replacen(
            "\"acceptance\": 0.7390",
            "\"acceptance\": 0.7390, \"acceptance\": 0.5",
            1,
        ));
        assert!(
            e.starts_with("devices[1].acceptance: duplicate field `acceptance`"),
            "{e}"
        );
        let e = err(&A.replacen("\"acceptance\": 0.7390", "\"acceptance\": \"high\"", 1));
        assert!(e.starts_with("devices[1].acceptance: invalid type"), "{e}");
        // saa_samples and seed change results: required, never defaulted silently.
        let e = err(&B.replacen("\"saa_samples\": 1000,", "", 1));
        assert!(e.contains("missing field `saa_samples`"), "{e}");
        let e = err(&B.replacen("\"seed\": 7,", "", 1));
        assert!(e.contains("missing field `seed`"), "{e}");
        let e = err(&A.replacen("\"model\": \"paper-a\"", "\"model\": \"paper-c\"", 1));
        assert!(e.starts_with("model: expected"), "{e}");
        let e = err(&format!("{A} {{}}"));
        assert!(e.starts_with("scenario: trailing characters"), "{e}");
    }

    #[test]
    fn toml_errors_name_the_field_and_the_problem() {
        let e = match parse("model = \"paper-a\"\nbandwith_hz = 1\n", true) {
            Err(Failure::Input(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(e.starts_with("bandwith_hz: unknown field `bandwith_hz`"), "{e}");
        let e = match parse("model = \"paper-b\"\nbandwidth_hz = \"x\"\n", true) {
            Err(Failure::Input(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(e.starts_with("bandwidth_hz: invalid type"), "{e}");
    }

    #[test]
    fn unit_pairs_take_exactly_one_and_convert() {
        let Loaded::PaperB(si) = parse(B, false).unwrap() else {
            panic!()
        };
        let db = B
            .replacen("\"ul_power_w\": 0.0316", "\"ul_power_dbm\": 15", 1)
            .replacen("\"bandwidth_hz\": 1.0e7", "\"bandwidth_mhz\": 10", 1)
            .replacen(
                "\"noise_psd_server_w_per_hz\": 1.26e-20",
                "\"noise_psd_server_dbm_per_hz\": -169",
                1,
            )
            .replacen("\"channel_gain\": 2.1e-10", "\"channel_gain_db\": -96.78", 1);
        let Loaded::PaperB(b) = parse(&db, false).unwrap() else {
            panic!()
        };
        assert_eq!(b.bandwidth_hz, 1e7);
        assert!((b.ul_power_w - 0.031_622_776_601_683_79).abs() < 1e-15);
        assert!((b.noise_psd_server_w_per_hz / si.noise_psd_server_w_per_hz - 1.0).abs() < 1e-3);
        assert!((b.devices[0].channel_gain / si.devices[0].channel_gain - 1.0).abs() < 1e-3);
        let both = B.replacen(
            "\"ul_power_w\": 0.0316",
            "\"ul_power_w\": 0.0316, \"ul_power_dbm\": 15",
            1,
        );
        assert_eq!(
            err(&both),
            "ul_power_w, ul_power_dbm: give exactly one of the pair, not both"
        );
        let neither = B.replacen("\"dl_power_w\": 1.0,", "", 1);
        assert_eq!(
            err(&neither),
            "dl_power_w, dl_power_dbm: missing (give exactly one of the pair)"
        );
        let gain = B.replacen("\"channel_gain\": 4.0e-11", "\"channel_gain_db\": 9999", 1);
        assert!(
            err(&gain).starts_with("devices[1].channel_gain_db: 9999 converts to inf"),
            "{}",
            err(&gain)
        );
    }

    #[test]
    fn toml_scenarios_parse_with_the_same_rules() {
        let toml = r#"
            model = "paper-b"
            bandwidth_mhz = 10
            distribution_bits = 34816
            verify_fixed_s = 0.0428
            verify_per_device_s = 0.0076
            max_draft_len = 20
            ul_power_dbm = 15.0
            dl_power_dbm = 30.0
            noise_psd_server_dbm_per_hz = -169.0
            noise_psd_device_dbm_per_hz = -167.0
            saa_samples = 100
            seed = 1
            [[devices]]
            acceptance = 0.8
            draft_token_s = 0.015
            channel_gain_db = -100.0
        "#;
        let Loaded::PaperB(b) = parse(toml, true).unwrap() else {
            panic!()
        };
        assert!((b.dl_power_w - 1.0).abs() < 1e-12);
        let e = match parse(&toml.replace("seed = 1", "seed = 1\nseed = 2"), true) {
            Err(Failure::Input(m)) => m,
            _ => panic!(),
        };
        assert!(e.contains("duplicate"), "{e}");
    }

    /// A seeded mutation loop over both example scenarios (JSON and TOML): byte flips, insertions, deletions and
    /// splices. No input may panic, and every failure is an input error (exit 2), never a runtime error.
    #[test]
    fn fuzzed_scenarios_never_panic_and_fail_as_input_errors() {
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        let toml_b = toml::to_string(&serde_json::from_str::<toml::Value>(B).unwrap()).unwrap();
        let seeds: [(&str, bool); 3] = [(A, false), (B, false), (&toml_b, true)];
        let alphabet = b"{}[]\",:.-+eE0123456789 \n=_abcdefghijklmnopqrstuvwxyz";
        let mut accepted = 0;
        for i in 0..3000 {
            let (seed, toml) = seeds[i % seeds.len()];
            let mut bytes = seed.as_bytes().to_vec();
            for _ in 0..rng.random_range(1..6) {
                let at = rng.random_range(0..bytes.len());
                match rng.random_range(0..4) {
                    0 => bytes[at] = alphabet[rng.random_range(0..alphabet.len())],
                    1 => bytes.insert(at, alphabet[rng.random_range(0..alphabet.len())]),
                    2 => {
                        bytes.remove(at);
                    }
                    _ => {
                        let from = rng.random_range(0..bytes.len());
                        let len = rng.random_range(0..32).min(bytes.len() - from);
                        let piece = bytes[from..from + len].to_vec();
                        bytes.splice(at..at, piece);
                    }
                }
            }
            let text = String::from_utf8_lossy(&bytes);
            match parse(&text, toml) {
                Ok(_) => accepted += 1,
                Err(Failure::Input(m)) => assert!(!m.is_empty() && !m.contains('\n'), "{m:?}"),
                Err(Failure::Runtime(e)) => panic!("runtime error on input: {e}"),
            }
        }
        // Some mutations (inside numbers, whitespace) keep the file valid: the loop reaches the converters.
        assert!(accepted > 0);
    }
}
