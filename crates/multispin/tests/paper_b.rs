//! Command-line contract of the paper-B subcommands: `correct` and `plan` on paper-B scenarios, and their errors.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/examples/paper-b.json")
}

fn multispin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_multispin"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn json_ok(args: &[&str]) -> Value {
    let out = multispin(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

/// Asserts exit status 2 with exactly one line on stderr that starts with `error: FIELD`.
fn input_error(args: &[&str], field: &str) {
    let out = multispin(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(field), "{args:?}: {err:?} does not name {field}");
}

fn edited_example(dir: &tempfile::TempDir, edit: impl Fn(&mut Value)) -> String {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(example()).unwrap()).unwrap();
    edit(&mut v);
    let path = dir.path().join("scenario.json");
    std::fs::write(&path, v.to_string()).unwrap();
    path.to_string_lossy().into_owned()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn correct_prints_modes_powers_and_delay() {
    let path = example();
    let p = path.to_str().unwrap();
    let opt = json_ok(&["correct", "--scenario", p, "--rejected", "0,3,5"]);
    let modes: Vec<&str> = opt["modes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert_eq!(modes.len(), 3);
    let powers = floats(&opt["dl_power_w"]);
    for (m, pw) in modes.iter().zip(&powers) {
        assert!(*m == "ul" || *m == "dl");
        assert_eq!(*m == "ul", *pw == 0.0, "{modes:?} {powers:?}");
    }
    let total: f64 = powers.iter().sum();
    assert!(total <= 1.0 + 1e-9);
    let delay = opt["comm_delay_s"].as_f64().unwrap();
    assert!(delay > 0.0);
    let brute = json_ok(&[
        "correct",
        "--scenario",
        p,
        "--rejected",
        "0,3,5",
        "--scheme",
        "brute-force",
    ]);
    assert!((brute["comm_delay_s"].as_f64().unwrap() - delay).abs() <= 1e-12 * delay);
    for scheme in ["all-ul", "all-dl", "random"] {
        let other = json_ok(&[
            "correct",
            "--scenario",
            p,
            "--rejected",
            "0,3,5",
            "--scheme",
            scheme,
            "--seed",
            "3",
        ]);
        assert!(
            other["comm_delay_s"].as_f64().unwrap() >= delay * (1.0 - 1e-12),
            "{scheme}"
        );
    }
    let all_ul = json_ok(&[
        "correct",
        "--scenario",
        p,
        "--rejected",
        "5,0",
        "--scheme",
        "all-ul",
    ]);
    assert_eq!(all_ul["modes"], serde_json::json!(["ul", "ul"]));
    assert_eq!(floats(&all_ul["dl_power_w"]), vec![0.0, 0.0]);
    let none = json_ok(&["correct", "--scenario", p, "--rejected", ""]);
    assert_eq!(none["comm_delay_s"].as_f64(), Some(0.0));
}

#[test]
fn plan_schemes_print_lengths_and_goodput() {
    let path = example();
    let p = path.to_str().unwrap();
    let mut goodput = std::collections::HashMap::new();
    for scheme in ["greedy", "best", "uniform", "comp-only"] {
        let v = json_ok(&["plan", "--scenario", p, "--scheme", scheme]);
        let lengths: Vec<u64> = v["draft_lengths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(lengths.len(), 6);
        assert!(lengths.iter().all(|&g| g <= 20));
        let mean = lengths.iter().sum::<u64>() as f64 / 6.0;
        assert!((v["mean_draft_len"].as_f64().unwrap() - mean).abs() < 1e-12);
        let g = v["goodput_tokens_per_s"].as_f64().unwrap();
        assert!(g > 0.0 && g.is_finite());
        assert_eq!(v["objective"], "rate");
        goodput.insert(scheme, g);
    }
    assert!(
        goodput["best"] >= goodput["greedy"] && goodput["best"] >= goodput["uniform"],
        "{goodput:?}"
    );
    let mr = json_ok(&[
        "plan",
        "--scenario",
        p,
        "--scheme",
        "greedy",
        "--objective",
        "mean-ratio",
    ]);
    assert_eq!(mr["objective"], "mean-ratio");
    assert!(
        (mr["goodput_tokens_per_s"].as_f64().unwrap() - mr["mean_ratio_tokens_per_s"].as_f64().unwrap())
            .abs()
            < 1e-6
    );
    let table = multispin(&["plan", "--scenario", p, "--scheme", "greedy", "--format", "table"]);
    assert!(table.status.success());
    assert!(String::from_utf8_lossy(&table.stdout).contains("goodput"));
}

#[test]
fn exhaustive_plan_on_a_tiny_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let p = edited_example(&dir, |v| {
        v["devices"].as_array_mut().unwrap().truncate(2);
        v["max_draft_len"] = 6.into();
        v["saa_samples"] = 300.into();
    });
    let ex = json_ok(&["plan", "--scenario", &p, "--scheme", "exhaustive"]);
    let best = json_ok(&["plan", "--scenario", &p, "--scheme", "best"]);
    assert_eq!(ex["goodput_tokens_per_s"], best["goodput_tokens_per_s"]);
}

#[test]
fn invalid_input_exits_2_naming_the_field() {
    let path = example();
    let p = path.to_str().unwrap();
    input_error(&["correct", "--scenario", p, "--rejected", "0,9"], "rejected");
    input_error(&["correct", "--scenario", p, "--rejected", "1,1"], "rejected");
    input_error(&["correct", "--scenario", p, "--rejected", "x"], "rejected");
    input_error(
        &[
            "correct",
            "--scenario",
            p,
            "--rejected",
            "0",
            "--scheme",
            "sideways",
        ],
        "scheme",
    );
    input_error(&["plan", "--scenario", p, "--scheme", "magic"], "scheme");
    input_error(
        &[
            "plan",
            "--scenario",
            p,
            "--scheme",
            "greedy",
            "--objective",
            "speed",
        ],
        "objective",
    );
    input_error(&["plan", "--scenario", p, "--scheme", "exhaustive"], "devices");
    input_error(
        &["correct", "--scenario", "no-such-file.json", "--rejected", "0"],
        "scenario",
    );
    let dir = tempfile::tempdir().unwrap();
    let bad_alpha = edited_example(&dir, |v| v["devices"][3]["acceptance"] = 1.2.into());
    input_error(
        &["plan", "--scenario", &bad_alpha, "--scheme", "greedy"],
        "devices[3].acceptance",
    );
    input_error(
        &["correct", "--scenario", &bad_alpha, "--rejected", "0"],
        "devices[3].acceptance",
    );
    let no_bw = edited_example(&dir, |v| {
        v.as_object_mut().unwrap().remove("bandwidth_hz");
    });
    input_error(
        &["plan", "--scenario", &no_bw, "--scheme", "greedy"],
        "bandwidth_hz",
    );
    let neg_power = edited_example(&dir, |v| v["dl_power_w"] = (-1.0).into());
    input_error(
        &["correct", "--scenario", &neg_power, "--rejected", "0"],
        "dl_power_w",
    );
    let paper_a = edited_example(&dir, |v| v["model"] = "paper-a".into());
    input_error(&["correct", "--scenario", &paper_a, "--rejected", "0"], "model");
}
