//! `multispin generate` and `multispin measure` end to end on a tiny random-weight llama2.c model written to a
//! temporary folder: speculative greedy output equals plain greedy output, measurements write CSV, SVG and a
//! scenario file, bad input exits with status 2.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn write_tiny(dir: &Path) -> (PathBuf, PathBuf) {
    let (tok, t) = common::write_tokenizer(dir);
    let dims = common::Dims {
        dim: 32,
        hidden_dim: 48,
        n_layers: 3,
        n_heads: 4,
        n_kv_heads: 2,
        max_seq_len: 128,
    };
    (
        common::write_model(dir, "tiny.bin", tok.vocab_size(), &dims, 11),
        t,
    )
}

fn multispin(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_multispin"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn speculative_greedy_generation_equals_plain_greedy_generation() {
    let dir = tempfile::tempdir().unwrap();
    let (m, t) = write_tiny(dir.path());
    let (m, t) = (m.to_str().unwrap(), t.to_str().unwrap());
    let common = [
        "generate",
        "--target",
        m,
        "--tokenizer",
        t,
        "--prompt",
        "ab c",
        "--max-tokens",
        "40",
    ];
    let plain = multispin(&common);
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let mut spec_args = common.to_vec();
    spec_args.extend(["--self-draft-layers", "1", "--draft-len", "5", "--stats"]);
    let spec = multispin(&spec_args);
    assert!(spec.status.success(), "{}", String::from_utf8_lossy(&spec.stderr));
    assert_eq!(plain.stdout, spec.stdout);
    let err = String::from_utf8_lossy(&spec.stderr);
    assert!(err.contains("acceptance"));
    // The split of --stats: prompt and first commit, then the rest, adding up to what was generated.
    let number_after = |key: &str| -> usize {
        let at = err.find(key).unwrap_or_else(|| panic!("{key:?} in {err}")) + key.len();
        err[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(
        number_after("prompt of "),
        5,
        "BOS and the four tokens of \"ab c\": {err}"
    );
    assert_eq!(
        number_after("and first ") + number_after("then "),
        number_after("generated "),
        "{err}"
    );
    let mut draft_args = common.to_vec();
    draft_args.extend(["--draft", m]);
    assert_eq!(multispin(&draft_args).stdout, plain.stdout);
    // Prompt lookup changes the drafts, never the greedy text; --stats counts the looked-up drafts.
    let mut lookup_args: Vec<&str> = common
        .iter()
        .map(|&a| if a == "ab c" { "ab c ab c ab" } else { a })
        .collect();
    lookup_args.extend(["--self-draft-layers", "1", "--stats"]);
    let without = multispin(&lookup_args);
    lookup_args.extend(["--lookup", "3"]);
    let with = multispin(&lookup_args);
    assert!(with.status.success(), "{}", String::from_utf8_lossy(&with.stderr));
    assert_eq!(with.stdout, without.stdout);
    let err = String::from_utf8_lossy(&with.stderr);
    let looked = err
        .split("(looked up ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("a looked-up count in {err}"));
    assert!(looked > 0, "{err}");
    for bad in ["0", "1.5", "NaN"] {
        let mut args = lookup_args.clone();
        args.extend(["--lookup-weight", bad]);
        let out = multispin(&args);
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("--lookup-weight"));
    }
    // Lookup-gated lengths: the same text with the gate off and at every length it may take.
    for stop in ["0", "1", "3"] {
        let mut args = lookup_args.clone();
        args.extend(["--lookup-stop", stop, "--draft-len", "6"]);
        let out = multispin(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.stdout, without.stdout, "--lookup-stop {stop}");
    }
    let mut too_long = lookup_args.clone();
    too_long.extend(["--lookup-stop", "4"]);
    let mut no_lookup = common.to_vec();
    no_lookup.extend(["--self-draft-layers", "1", "--lookup-stop", "2"]);
    for args in [too_long, no_lookup] {
        let out = multispin(&args);
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("--lookup-stop"));
    }
}

#[test]
fn bad_input_exits_with_status_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let (m, t) = write_tiny(dir.path());
    let (m, t) = (m.to_str().unwrap(), t.to_str().unwrap());
    let out = multispin(&[
        "generate",
        "--target",
        m,
        "--tokenizer",
        t,
        "--self-draft-layers",
        "9",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("self_draft_layers"));
    let bytes = std::fs::read(m).unwrap();
    std::fs::write(m, &bytes[..bytes.len() - 8]).unwrap();
    let out = multispin(&["generate", "--target", m, "--tokenizer", t]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("truncated"));
}

#[test]
fn measurements_write_csv_svg_and_a_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let (m, t) = write_tiny(dir.path());
    let (m, t) = (m.to_str().unwrap(), t.to_str().unwrap());
    let out_dir = dir.path().join("measure");
    let out = out_dir.to_str().unwrap();
    let corpus = dir.path().join("corpus.txt");
    std::fs::write(
        &corpus,
        "ab c ab a bc c a b c ab\nc a b ab bc ab a c b a\nbc bc a a b c ab c a b\n",
    )
    .unwrap();
    let c = corpus.to_str().unwrap();
    let base = [
        "--target",
        m,
        "--tokenizer",
        t,
        "--self-draft-layers",
        "2",
        "--out",
        out,
    ];
    let run = |sub: &str, extra: &[&str]| {
        let mut a = vec!["measure", sub];
        a.extend_from_slice(&base);
        a.extend_from_slice(extra);
        let o = multispin(&a);
        assert!(
            o.status.success(),
            "{sub}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    run(
        "acceptance",
        &[
            "--prompts",
            c,
            "--count",
            "3",
            "--words",
            "4",
            "--new-tokens",
            "12",
        ],
    );
    run(
        "verify-latency",
        &[
            "--max-k",
            "4",
            "--draft-len",
            "3",
            "--prefix-len",
            "8",
            "--reps",
            "2",
        ],
    );
    // The pass cost prints its median, min and max (scripts/bench-llama-cpp.sh reads the median).
    let mut a = vec!["measure", "pass-cost"];
    a.extend_from_slice(&base);
    a.extend_from_slice(&[
        "--positions",
        "3",
        "--sequences",
        "2",
        "--prefix-len",
        "5",
        "--reps",
        "3",
    ]);
    let o = multispin(&a);
    assert!(
        o.status.success(),
        "pass-cost: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let line = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        line.starts_with("pass of 2 × 3 positions after a prefix of 5: median ")
            && line.contains(" over 3 passes"),
        "{line}"
    );
    run(
        "goodput",
        &[
            "--prompts",
            c,
            "--devices",
            "3",
            "--max-draft-len",
            "3",
            "--new-tokens",
            "10",
        ],
    );
    for f in [
        "acceptance.csv",
        "acceptance.svg",
        "verify_latency.csv",
        "verify_latency.svg",
        "goodput.csv",
    ] {
        assert!(out_dir.join(f).is_file(), "{f} missing");
    }
    let csv = std::fs::read_to_string(out_dir.join("verify_latency.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5);
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("scenario.json")).unwrap()).unwrap();
    assert_eq!(s["devices"].as_array().unwrap().len(), 3);
    let a = s["devices"][0]["acceptance"].as_f64().unwrap();
    assert!(a > 0.0 && a < 1.0, "{a}");
    assert!(s["verify_per_device_s"].as_f64().unwrap() >= 0.0);
    assert!(
        std::fs::read_to_string(out_dir.join("goodput.svg"))
            .unwrap()
            .contains("<svg")
    );
}

#[test]
fn ignore_eos_makes_every_run_max_tokens_long() {
    let dir = tempfile::tempdir().unwrap();
    let (m, t) = write_tiny(dir.path());
    let (m, t) = (m.to_str().unwrap(), t.to_str().unwrap());
    let run = |seed: &str, extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--target",
            m,
            "--tokenizer",
            t,
            "--prompt",
            "ab",
            "--max-tokens",
            "60",
            "--temperature",
            "3",
            "--seed",
            seed,
            "--stats",
        ];
        args.extend_from_slice(extra);
        let out = multispin(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let n: usize = err
            .split("generated ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a token count in {err}"));
        (n, out.stdout)
    };
    // A seed whose sampled text reaches the end-of-sequence token early.
    let (seed, short, short_text) = (0..200)
        .map(|s| s.to_string())
        .find_map(|s| {
            let (n, text) = run(&s, &[]);
            (n < 60).then_some((s, n, text))
        })
        .expect("a seed that samples the end-of-sequence token within 60 tokens");
    let (n, text) = run(&seed, &["--ignore-eos"]);
    assert_eq!(n, 60, "seed {seed}: stopped at {short} without the flag");
    // Plain sampling draws once per token: the same text up to the token that used to end it.
    let stem = &short_text[..short_text.len() - 1];
    assert!(text.starts_with(stem), "seed {seed}");
    assert!(text.len() > short_text.len(), "seed {seed}");
    let (n, _) = run(
        &seed,
        &["--ignore-eos", "--self-draft-layers", "1", "--draft-len", "3"],
    );
    assert_eq!(n, 60, "speculative, seed {seed}");
}
