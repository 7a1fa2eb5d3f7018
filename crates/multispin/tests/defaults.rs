//! The commands on a fresh clone with no model flag: `simulate` and `generate` fall back to the models embedded in
//! the binary (models/stories260K.bin, models/tok512.bin, models/draft-2x32.bin).

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_multispin"))
}

#[test]
fn simulate_without_model_flags_runs_the_embedded_models() {
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .args([
            "simulate",
            "--rounds",
            "2",
            "--devices",
            "2",
            "--max-tokens",
            "8",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.lines().any(|l| l.starts_with("best")), "{stdout}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("summary-best.json")).unwrap())
            .unwrap();
    assert_eq!(summary["rounds"], 2);
    assert!(summary["tokens"].as_u64().is_some_and(|t| t > 0), "{summary}");
    assert!(dir.path().join("summary.csv").is_file());
}

#[test]
fn generate_without_model_flags_prints_the_stories260k_greedy_text() {
    let out = bin()
        .args(["generate", "--max-tokens", "8", "--temperature", "0"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.trim_start().starts_with("Once upon a time"), "{text:?}");
}
