//! Command-line contract of `multispin plan` on paper-A scenarios: the JSON output fields, the schemes, and every
//! input error exiting with status 2 and one line that names the field.

use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Output};

fn example() -> Value {
    json!({
        "bandwidth_hz": 1.0e7, "distribution_bits": 31744,
        "verify_fixed_s": 0.02268, "verify_per_device_s": 0.01272, "max_draft_len": 25,
        "devices": [
            {"acceptance": 0.86, "draft_token_s": 0.021, "spectral_efficiency": 12.5},
            {"acceptance": 0.74, "draft_token_s": 0.018, "spectral_efficiency": 7.0},
            {"acceptance": 0.71, "draft_token_s": 0.024, "spectral_efficiency": 15.0}
        ]
    })
}

fn plan(dir: &Path, text: &str, scheme: &str, format: &str) -> Output {
    let path = dir.join("scenario.json");
    std::fs::write(&path, text).unwrap();
    Command::new(env!("CARGO_BIN_EXE_multispin"))
        .args(["plan", "--scenario"])
        .arg(&path)
        .args(["--scheme", scheme, "--format", format])
        .output()
        .unwrap()
}

fn stderr_line(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(
        text.trim_end().lines().count(),
        1,
        "expected one line, got {text:?}"
    );
    text
}

#[test]
fn every_scheme_prints_the_json_contract() {
    let dir = tempfile::tempdir().unwrap();
    let mut goodputs = Vec::new();
    for scheme in ["exact", "paper-alg1", "homo", "uni-bw", "fixed", "brute-force"] {
        let out = plan(dir.path(), &example().to_string(), scheme, "json");
        assert!(
            out.status.success(),
            "{scheme}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["scheme"], scheme);
        assert_eq!(v["draft_lengths"].as_array().unwrap().len(), 3);
        assert!(
            v["draft_lengths"]
                .as_array()
                .unwrap()
                .iter()
                .all(|l| l.as_u64().is_some_and(|l| (1..=25).contains(&l)))
        );
        // Each device's share of the band (the key was `bandwidth_hz` before, which elsewhere means the total).
        assert!(v.get("bandwidth_hz").is_none());
        let bw: f64 = v["uplink_share_hz"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_f64().unwrap())
            .sum();
        assert!(bw <= 1.0e7 * (1.0 + 1e-9));
        assert!(v["round_latency_s"].as_f64().unwrap() > 0.0);
        goodputs.push((scheme, v["goodput_tokens_per_s"].as_f64().unwrap()));
    }
    let exact = goodputs[0].1;
    // The exact planner equals brute force and is never below any other scheme.
    assert!((exact - goodputs[5].1).abs() <= 1e-9 * exact);
    assert!(
        goodputs.iter().all(|&(_, g)| g <= exact * (1.0 + 1e-12)),
        "{goodputs:?}"
    );
    if let Some(&(_, fixed)) = goodputs.iter().find(|(s, _)| *s == "fixed") {
        assert!(fixed < exact);
    }
}

#[test]
fn table_format_is_readable() {
    let dir = tempfile::tempdir().unwrap();
    let out = plan(dir.path(), &example().to_string(), "exact", "table");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("tokens/s") && text.contains("B_k (kHz)"), "{text}");
    assert_eq!(
        text.lines()
            .filter(|l| l.trim_start().starts_with(char::is_numeric))
            .count(),
        3
    );
}

#[test]
fn input_errors_exit_2_with_one_line_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let mutate = |f: &dyn Fn(&mut Value)| {
        let mut v = example();
        f(&mut v);
        v.to_string()
    };
    let cases: Vec<(String, &str, &str)> = vec![
        (
            mutate(&|v| v["devices"][1]["acceptance"] = json!(1.2)),
            "exact",
            "devices[1].acceptance",
        ),
        (
            mutate(&|v| v["devices"][0]["acceptance"] = json!(0.0)),
            "exact",
            "devices[0].acceptance",
        ),
        (
            mutate(&|v| v["bandwidth_hz"] = json!(-5.0)),
            "exact",
            "bandwidth_hz",
        ),
        (
            mutate(&|v| v["bandwidth_hz"] = json!("ten")),
            "exact",
            "bandwidth_hz",
        ),
        (mutate(&|v| v["devices"] = json!([])), "homo", "devices"),
        (
            mutate(&|v| v["devices"][2]["draft_token_s"] = json!(0)),
            "fixed",
            "devices[2].draft_token_s",
        ),
        (
            mutate(&|v| {
                v.as_object_mut()
                    .unwrap()
                    .remove("verify_fixed_s")
                    .map(|_| ())
                    .unwrap_or(())
            }),
            "exact",
            "verify_fixed_s",
        ),
        (
            mutate(&|v| v["max_draft_len"] = json!(0)),
            "exact",
            "max_draft_len",
        ),
        (
            mutate(&|v| v["fixed_draft_len"] = json!(30)),
            "fixed",
            "fixed_draft_len",
        ),
        ("{ \"bandwidth_hz\": 1e7, ".to_string(), "exact", "scenario"),
        (example().to_string(), "greedy", "scheme"),
    ];
    for (text, scheme, field) in cases {
        let out = plan(dir.path(), &text, scheme, "json");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{field}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stderr_line(&out);
        assert!(line.contains(field), "{line:?} should name {field}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn brute_force_refuses_large_instances() {
    let dir = tempfile::tempdir().unwrap();
    let mut v = example();
    let device = v["devices"][0].clone();
    v["devices"] = json!(vec![device; 8]);
    let out = plan(dir.path(), &v.to_string(), "brute-force", "json");
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_line(&out).contains("devices"));
}

#[test]
fn the_example_scenario_file_plans() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/examples/paper-a.json");
    let text = std::fs::read_to_string(root).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = plan(dir.path(), &text, "exact", "json");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Paper A's scenario keys share paper B's names (`distribution_bits`, `verify_per_device_s`); a file written with
/// the names paper-A files had before plans the same, and giving both names of one quantity is an error.
#[test]
fn paper_a_files_with_the_earlier_key_names_plan_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let new = example();
    let mut old = new.clone();
    let o = old.as_object_mut().unwrap();
    let bits = o.remove("distribution_bits").unwrap();
    let slope = o.remove("verify_per_device_s").unwrap();
    o.insert("bits_per_draft_token".into(), bits);
    o.insert("verify_per_draft_s".into(), slope.clone());
    let a = plan(dir.path(), &new.to_string(), "exact", "json");
    let b = plan(dir.path(), &old.to_string(), "exact", "json");
    assert!(a.status.success() && b.status.success());
    assert_eq!(a.stdout, b.stdout);
    let mut both = old.clone();
    both["verify_per_device_s"] = slope;
    let out = plan(dir.path(), &both.to_string(), "exact", "json");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr_line(&out).contains("verify_per_device_s"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
