//! Command-line contract of `multispin plan` on unified scenarios: every scheme of either paper plans inside the
//! scenario's draft-length range and payload policy, and prints the unified model's value at its plan, exact where
//! the outcomes are enumerated and otherwise an SAA estimate with its sample count and 95 % interval.

use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;

const SCHEMES: [&str; 10] = [
    "exact",
    "paper-alg1",
    "homo",
    "uni-bw",
    "fixed",
    "best",
    "greedy",
    "uniform",
    "comp-only",
    "unified",
];

fn scenario(payload: &str, devices: usize, max_draft_len: u32) -> Value {
    let all = [
        json!({"acceptance": 0.85, "draft_token_s": 0.0152, "uplink_gain": 2.1e-10}),
        json!({"acceptance": 0.72, "draft_token_s": 0.0158, "uplink_gain": 9.5e-12, "downlink_gain": 2.0e-11}),
        json!({"acceptance": 0.80, "draft_token_s": 0.0154, "uplink_gain": 6.0e-13}),
        json!({"acceptance": 0.70, "draft_token_s": 0.0170, "uplink_gain": 3.3e-12}),
    ];
    json!({
        "model": "unified", "bandwidth_hz": 2.0e6, "verify_fixed_s": 0.0428, "verify_per_device_s": 0.0076,
        "min_draft_len": 0, "max_draft_len": max_draft_len, "ul_power_w": 0.0316, "dl_power_w": 1.0,
        "noise_psd_server_w_per_hz": 1.26e-20, "noise_psd_device_w_per_hz": 2.0e-20, "payload": payload,
        "effective_support": 1024, "vocabulary": 151665, "quant_bits": 16, "saa_samples": 300, "seed": 7,
        "devices": all[..devices]
    })
}

fn plan(dir: &Path, s: &Value, scheme: &str, format: &str) -> String {
    let path = dir.join("unified.json");
    std::fs::write(&path, s.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_multispin"))
        .args(["plan", "--scenario"])
        .arg(&path)
        .args(["--scheme", scheme, "--format", format])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{scheme}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn every_scheme_plans_inside_the_range_and_policy_and_prints_the_exact_value() {
    let dir = tempfile::tempdir().unwrap();
    for payload in ["pair", "distribution", "choose"] {
        // 4^3 = 64 outcomes: every value is the exact expectation.
        let s = scenario(payload, 3, 3);
        let optimum = {
            let v: Value = serde_json::from_str(&plan(dir.path(), &s, "unified", "json")).unwrap();
            assert_eq!(v["proven_optimal"], true);
            v["goodput_tokens_per_s"].as_f64().unwrap()
        };
        for scheme in SCHEMES {
            let v: Value = serde_json::from_str(&plan(dir.path(), &s, scheme, "json")).unwrap();
            assert_eq!(
                v["estimate"],
                json!({"expectation": "exact"}),
                "{scheme} {payload}"
            );
            for (l, d) in v["draft_lengths"]
                .as_array()
                .unwrap()
                .iter()
                .zip(v["sends_distributions"].as_array().unwrap())
            {
                assert!(l.as_u64().unwrap() <= 3, "{scheme} {payload}");
                let d = d.as_bool().unwrap();
                match payload {
                    "pair" => assert!(!d, "{scheme} sends distributions under payload: pair"),
                    "distribution" => assert!(d, "{scheme} sends pairs under payload: distribution"),
                    _ => {}
                }
            }
            let g = v["goodput_tokens_per_s"].as_f64().unwrap();
            assert!(
                g <= optimum * (1.0 + 1e-12),
                "{scheme} {payload}: {g} above the optimum {optimum}"
            );
            let table = plan(dir.path(), &s, scheme, "table");
            assert!(table.contains("\nexpectation: exact\n"), "{table}");
        }
    }
}

#[test]
fn sampled_values_print_their_sample_count_and_interval() {
    // 9^4 outcomes: above the enumeration limit, so the value is the SAA estimate on the scenario's 300 samples.
    let dir = tempfile::tempdir().unwrap();
    let s = scenario("choose", 4, 8);
    for scheme in ["best", "exact", "unified"] {
        let v: Value = serde_json::from_str(&plan(dir.path(), &s, scheme, "json")).unwrap();
        assert_eq!(v["estimate"]["expectation"], "saa", "{scheme}");
        assert_eq!(v["estimate"]["samples"], 300, "{scheme}");
        assert!(v["estimate"]["rate_ci95_tokens_per_s"].as_f64().unwrap() >= 0.0);
        let table = plan(dir.path(), &s, scheme, "table");
        assert!(
            table.contains("expectation: SAA estimate over 300 samples, 95 % CI ± "),
            "{table}"
        );
    }
}
