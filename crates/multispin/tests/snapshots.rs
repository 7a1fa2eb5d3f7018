//! insta snapshots of the command-line surface: every `--help` (one snapshot per command, so a new subcommand is
//! one more entry in [`COMMANDS`]) and the JSON and table output of `plan` and `correct` on the example scenarios.
//!
//! After an intended change: `INSTA_UPDATE=always cargo test -p multispin --test snapshots` (or `cargo insta
//! review`), then read the diff of `tests/snapshots/` before committing it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every command whose `--help` is part of the contract, as the words after `multispin`.
const COMMANDS: &[&[&str]] = &[
    &[],
    &["plan"],
    &["correct"],
    &["generate"],
    &["scenario"],
    &["measure"],
    &["measure", "acceptance"],
    &["measure", "verify-latency"],
    &["measure", "goodput"],
    &["simulate"],
    &["serve"],
    &["device"],
    &["gen-cert"],
];

fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_multispin"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios/examples")
        .join(name)
}

/// A snapshot name from words: `plan paper-a.json exact table` → `plan__paper-a__exact__table`.
fn name(parts: &[&str]) -> String {
    parts
        .iter()
        .map(|p| p.trim_end_matches(".json").replace(',', "-"))
        .collect::<Vec<_>>()
        .join("__")
}

#[test]
fn help_of_every_command() {
    for words in COMMANDS {
        let mut args = words.to_vec();
        args.push("--help");
        let text = run(&args);
        let snap = if words.is_empty() {
            "help".to_string()
        } else {
            format!("help__{}", words.join("__"))
        };
        insta::assert_snapshot!(snap, text);
    }
}

#[test]
fn plan_output_on_the_examples() {
    let cases: &[(&str, &[&str])] = &[
        (
            "paper-a.json",
            &["exact", "paper-alg1", "homo", "uni-bw", "fixed"],
        ),
        (
            "paper-a-drop.json",
            &["exact", "paper-alg1", "homo", "uni-bw", "fixed", "brute-force"],
        ),
        ("paper-b.json", &["greedy", "best", "uniform", "comp-only"]),
        ("paper-b-drop.json", &["greedy", "best", "uniform", "comp-only"]),
    ];
    for (file, schemes) in cases {
        let path = example(file);
        for scheme in *schemes {
            for format in ["json", "table"] {
                let text = run(&[
                    "plan",
                    "--scenario",
                    path.to_str().unwrap(),
                    "--scheme",
                    scheme,
                    "--format",
                    format,
                ]);
                insta::assert_snapshot!(name(&["plan", file, scheme, format]), text);
            }
        }
    }
}

#[test]
fn correct_output_on_the_examples() {
    for (file, rejected) in [("paper-b.json", "0,2,5"), ("paper-b-drop.json", "1,3,4,5")] {
        let path = example(file);
        for scheme in ["optimal", "all-ul", "all-dl", "random", "brute-force"] {
            for format in ["json", "table"] {
                let text = run(&[
                    "correct",
                    "--scenario",
                    path.to_str().unwrap(),
                    "--rejected",
                    rejected,
                    "--scheme",
                    scheme,
                    "--format",
                    format,
                ]);
                insta::assert_snapshot!(name(&["correct", file, rejected, scheme, format]), text);
            }
        }
    }
}

#[test]
fn scenario_from_the_example_drops_is_the_committed_example() {
    // The committed scenarios are exactly what `multispin scenario` writes from the committed drops.
    for (drop, json) in [
        ("drop-paper-a.toml", "paper-a-drop.json"),
        ("drop-paper-b.toml", "paper-b-drop.json"),
    ] {
        let text = run(&["scenario", "--drop", example(drop).to_str().unwrap()]);
        let committed = std::fs::read_to_string(example(json)).unwrap();
        assert_eq!(text, committed, "{drop}");
    }
}
