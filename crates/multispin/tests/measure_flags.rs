//! `multispin measure` refuses unusable flags before it loads or allocates anything (issue 13): exit status 2 and
//! one line naming the flag. A target path that does not exist proves the order: a check made after loading would
//! report the file instead.

use std::process::Command;

fn refused(args: &[&str], flag: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_multispin"))
        .arg("measure")
        .args(args)
        .args(["--target", "/nonexistent/model.bin"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.starts_with(&format!("error: {flag}:")), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
}

#[test]
fn oversized_and_empty_settings_exit_2_naming_the_flag() {
    refused(&["verify-latency", "--max-k", "1000000"], "--max-k");
    refused(&["verify-latency", "--max-k", "1"], "--max-k");
    refused(&["verify-latency", "--prefix-len", "0"], "--prefix-len");
    refused(&["verify-latency", "--reps", "0"], "--reps");
    refused(&["pass-cost", "--positions", "0"], "--positions");
    refused(&["pass-cost", "--sequences", "0"], "--sequences");
    refused(&["pass-cost", "--sequences", "1000000"], "--sequences");
    refused(&["pass-cost", "--reps", "0"], "--reps");
    refused(
        &["goodput", "--prompts", "p.txt", "--devices", "1000000"],
        "--devices",
    );
    refused(&["goodput", "--prompts", "p.txt", "--devices", "0"], "--devices");
    refused(
        &["goodput", "--prompts", "p.txt", "--bandwidth-hz", "inf"],
        "--bandwidth-hz",
    );
    refused(
        &["goodput", "--prompts", "p.txt", "--bandwidth-hz", "NaN"],
        "--bandwidth-hz",
    );
    refused(
        &["goodput", "--prompts", "p.txt", "--spectral-efficiency", "0"],
        "--spectral-efficiency",
    );
    refused(
        &["goodput", "--prompts", "p.txt", "--new-tokens", "0"],
        "--new-tokens",
    );
    refused(
        &["goodput", "--prompts", "p.txt", "--max-draft-len", "0"],
        "--max-draft-len",
    );
    refused(&["acceptance", "--prompts", "p.txt", "--count", "0"], "--count");
    refused(
        &["acceptance", "--prompts", "p.txt", "--count", "1000000"],
        "--count",
    );
    refused(
        &["acceptance", "--prompts", "p.txt", "--draft-len", "0"],
        "--draft-len",
    );
    refused(
        &["acceptance", "--prompts", "p.txt", "--new-tokens", "0"],
        "--new-tokens",
    );
    refused(&["acceptance", "--prompts", "p.txt", "--words", "0"], "--words");
}

/// A run that would pass the context part-way (and lose what it measured) is refused before any work, with the
/// largest `--new-tokens` that fits. Uses the stories260K checkpoint committed under `models/`.
#[test]
fn acceptance_past_the_context_is_refused_before_any_work() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(
        &prompts,
        "Once upon a time there was a little dog who liked to run in the park.\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_multispin"))
        .args([
            "measure",
            "acceptance",
            "--count",
            "1",
            "--words",
            "8",
            "--new-tokens",
            "510",
        ])
        .arg("--target")
        .arg(root.join("models/stories260K.bin"))
        .arg("--tokenizer")
        .arg(root.join("models/tok512.bin"))
        .arg("--prompts")
        .arg(&prompts)
        .arg("--out")
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.starts_with("error: --new-tokens:"), "{err}");
    assert!(err.contains("above the context of 512"), "{err}");
}

/// A temperature outside the rule of every sampling command, or 0 (a measured acceptance is of sampled drafts), is
/// refused naming the flag before anything loads.
#[test]
fn temperatures_follow_the_sampling_rule_and_exclude_greedy() {
    for t in ["0", "-1", "1e-9", "nan", "inf"] {
        refused(
            &["acceptance", "--prompts", "p.txt", "--temperature", t],
            "--temperature",
        );
        refused(
            &["goodput", "--prompts", "p.txt", "--temperature", t],
            "--temperature",
        );
    }
}

/// A prompts file is read under a bound, before the models load: an endless or oversized one, a directory or a
/// file that is not text is refused naming `--prompts`, not read into memory.
#[test]
fn prompt_corpora_are_bounded_and_read_before_the_models() {
    let dir = std::env::temp_dir().join(format!("multispin-measure-prompts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big.txt");
    let file = std::fs::File::create(&big).unwrap();
    file.set_len((64 << 20) + 1).unwrap();
    let binary = dir.join("binary.txt");
    std::fs::write(&binary, [0xff, 0xfe, 0x00, 0x80]).unwrap();
    let dir_s = dir.to_str().unwrap();
    for bad in [
        big.to_str().unwrap(),
        binary.to_str().unwrap(),
        dir_s,
        "/dev/zero",
    ] {
        refused(&["acceptance", "--prompts", bad], "--prompts");
        refused(&["goodput", "--prompts", bad], "--prompts");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
