//! Scenario files of every model: strict fields named by their path, unit pairs, TOML by the same rules, and a
//! seeded mutation loop that no input survives as a panic.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spin_scenario::{Format, Loaded, parse};
const A: &str = include_str!("../../../scenarios/examples/paper-a.json");
const B: &str = include_str!("../../../scenarios/examples/paper-b.json");

fn err(text: &str) -> String {
    match parse(text, Format::Json) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted: {text}"),
    }
}

#[test]
fn examples_parse() {
    assert!(matches!(parse(A, Format::Json).unwrap(), Loaded::PaperA(_)));
    assert!(matches!(parse(B, Format::Json).unwrap(), Loaded::PaperB(_)));
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
    let e = match parse("model = \"paper-a\"\nbandwith_hz = 1\n", Format::Toml) {
        Err(e) => e.to_string(),
        other => panic!("{other:?}"),
    };
    assert!(e.starts_with("bandwith_hz: unknown field `bandwith_hz`"), "{e}");
    let e = match parse("model = \"paper-b\"\nbandwidth_hz = \"x\"\n", Format::Toml) {
        Err(e) => e.to_string(),
        other => panic!("{other:?}"),
    };
    assert!(e.starts_with("bandwidth_hz: invalid type"), "{e}");
}

#[test]
fn unit_pairs_take_exactly_one_and_convert() {
    let Loaded::PaperB(si) = parse(B, Format::Json).unwrap() else {
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
    let Loaded::PaperB(b) = parse(&db, Format::Json).unwrap() else {
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
    let Loaded::PaperB(b) = parse(toml, Format::Toml).unwrap() else {
        panic!()
    };
    assert!((b.dl_power_w - 1.0).abs() < 1e-12);
    let e = match parse(&toml.replace("seed = 1", "seed = 1\nseed = 2"), Format::Toml) {
        Err(e) => e.to_string(),
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
    let seeds: [(&str, Format); 3] = [(A, Format::Json), (B, Format::Json), (&toml_b, Format::Toml)];
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
            Err(e) => {
                let m = e.to_string();
                assert!(!m.is_empty() && !m.contains('\n'), "{m:?}");
            }
        }
    }
    // Some mutations (inside numbers, whitespace) keep the file valid: the loop reaches the converters.
    assert!(accepted > 0);
}

#[test]
fn paper_a_optional_fields_take_their_documented_defaults() {
    let json = r#"{ "model": "paper-a", "bandwidth_mhz": 10, "distribution_bits": 31744,
      "verify_fixed_s": 0.02268, "verify_per_draft_s": 0.01272, "max_draft_len": 25,
      "devices": [ {"acceptance": 0.86, "draft_token_s": 0.021, "spectral_efficiency": 12.5} ] }"#;
    let Loaded::PaperA(a) = parse(json, Format::Json).unwrap() else {
        panic!()
    };
    assert_eq!(a.spec.bandwidth_hz, 1e7);
    assert_eq!(a.spec.min_draft_len, 1);
    assert_eq!(a.spec.verify_per_device_s, 0.01272);
    assert_eq!(a.fixed_draft_len, None);
    assert_eq!(
        a.alg1,
        spin_optimize::paper_a::heterogeneous::Alg1Params::default()
    );
    // The old name and the new one of one quantity together are refused.
    let both = json.replace(
        "\"verify_per_draft_s\": 0.01272",
        "\"verify_per_draft_s\": 0.01272, \"verify_per_device_s\": 0.01272",
    );
    assert!(
        err(&both).contains("duplicate field `verify_per_device_s`"),
        "{}",
        err(&both)
    );
}

#[test]
fn a_command_that_needs_one_model_names_the_other() {
    let e = spin_scenario::parse_expecting(A, Format::Json, Some(spin_optimize::round::Family::PaperB))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "model: this command needs a paper-b scenario (\"model\": \"paper-b\"), the file is paper-a"
    );
    let e = err(&A.replacen("\"model\": \"paper-a\"", "\"model\": 3", 1));
    assert_eq!(
        e,
        "model: expected \"paper-a\", \"paper-b\" or \"unified\", found 3"
    );
}
