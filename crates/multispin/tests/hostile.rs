//! Hostile and careless input to `multispin generate` (issue 13): output at the context limit is printed (exit 0),
//! bad files and arguments exit 2 with one line naming the field, tokenizer mismatches are reported as such.

mod common;

use spin_runtime::gguf::{self, GgmlDType, GgufVocab, WriteOptions};
use spin_runtime::head_vocab::HeadVocab;
use spin_runtime::llama2c::Llama2cTokenizer;
use spin_runtime::{Config, RopeStyle, model};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The context of the tiny model: small, so that reaching it is cheap in a debug build.
const CONTEXT: usize = 24;

fn tokenizer(extra: &[&str]) -> Llama2cTokenizer {
    let pieces: Vec<(&str, f32)> = extra.iter().enumerate().map(|(i, s)| (*s, -(i as f32))).collect();
    Llama2cTokenizer::from_pieces(&pieces)
}

fn write_tiny(dir: &Path) -> (PathBuf, PathBuf) {
    let (tok, t) = common::write_tokenizer(dir);
    let dims = common::Dims {
        dim: 16,
        hidden_dim: 24,
        n_layers: 2,
        n_heads: 2,
        n_kv_heads: 1,
        max_seq_len: CONTEXT,
    };
    (
        common::write_model(dir, "tiny.bin", tok.vocab_size(), &dims, 5),
        t,
    )
}

fn multispin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_multispin"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Exit status 2 and one stderr line `error: …` containing `field`.
fn assert_input_error(out: &Output, field: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err:?}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(field), "expected {field:?} in {err:?}");
}

#[test]
fn generation_past_the_context_prints_what_fits_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let (m, t) = write_tiny(dir.path());
    let (m, t) = (m.to_str().unwrap(), t.to_str().unwrap());
    let base = [
        "generate",
        "--target",
        m,
        "--tokenizer",
        t,
        "--prompt",
        "ab",
        "--max-tokens",
        "1000000000",
    ];
    for extra in [
        &[][..],
        &["--self-draft-layers", "1", "--draft-len", "8"][..],
        &["--temperature", "0.8"][..],
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let out = multispin(&args);
        let err = stderr(&out);
        assert!(out.status.success(), "{extra:?}: {err}");
        assert!(!out.stdout.is_empty(), "{extra:?}: nothing printed");
        assert!(
            err.contains("context limit") && err.contains(&format!("= {CONTEXT} tokens")),
            "{extra:?}: {err}"
        );
    }
    // Inside the context nothing is said.
    let out = multispin(&[
        "generate",
        "--target",
        m,
        "--tokenizer",
        t,
        "--prompt",
        "ab",
        "--max-tokens",
        "3",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
}

#[test]
fn invalid_generate_arguments_exit_2_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let (m, t) = write_tiny(dir.path());
    let (m, t) = (m.to_str().unwrap(), t.to_str().unwrap());
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "--target", m, "--tokenizer", t];
        args.extend_from_slice(extra);
        multispin(&args)
    };
    assert_input_error(&run(&["--temperature", "1e-320"]), "--temperature");
    assert_input_error(&run(&["--temperature", "-1"]), "--temperature");
    assert_input_error(&run(&["--temperature", "NaN"]), "--temperature");
    assert_input_error(
        &run(&["--draft-len", "0", "--self-draft-layers", "1"]),
        "--draft-len",
    );
    assert_input_error(&run(&["--max-tokens", "0"]), "--max-tokens");
    assert_input_error(&run(&["--self-draft-layers", "0"]), "--self-draft-layers");
    assert_input_error(&run(&["--self-draft-layers", "9"]), "--self-draft-layers");
    assert_input_error(&run(&["--max-tokens", "-3"]), "--max-tokens");
    assert_input_error(&run(&["--threads", "100000"]), "--threads");
    // A prompt longer than the context is refused before tokenising (a lower bound on its tokens).
    let long = "ab".repeat(20_000);
    assert_input_error(&run(&["--prompt", &long]), "--prompt");
    // One that fits by bytes but not by tokens is refused after.
    assert_input_error(&run(&["--prompt", &"ca".repeat(12)]), "tokens do not fit");
}

#[test]
fn drafting_flags_without_a_drafter_exit_2_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let (m, t) = write_tiny(dir.path());
    let (m, t) = (m.to_str().unwrap(), t.to_str().unwrap());
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(&prompts, "ab\nba\n").unwrap();
    let prompts = prompts.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "--target", m, "--tokenizer", t, "--max-tokens", "2"];
        args.extend_from_slice(extra);
        multispin(&args)
    };
    let needs = "needs a drafter, --draft or --self-draft-layers";
    for (extra, flag) in [
        (&["--draft-len", "3"][..], "--draft-len"),
        (&["--lookup", "2"][..], "--lookup"),
        (&["--lookup-stop", "2"][..], "--lookup-stop"),
        (&["--draft-stop-below", "0.5"][..], "--draft-stop-below"),
        (&["--prompts", prompts, "--lookup", "2"][..], "--lookup"),
    ] {
        assert_input_error(&run(extra), &format!("{flag}: {needs}"));
    }
    // A lookup weight without a lookup does nothing: refused in every command that takes it.
    assert_input_error(
        &run(&["--lookup-weight", "0.3"]),
        "--lookup-weight: needs --lookup N",
    );
    assert_input_error(
        &simulate(&["--lookup-weight", "0.3"]),
        "--lookup-weight: needs --lookup N",
    );
    // `--lookup 0` is the lookup off, not a request for one.
    assert!(run(&["--lookup", "0"]).status.success());
    let out = run(&[
        "--self-draft-layers",
        "1",
        "--draft-len",
        "2",
        "--lookup",
        "2",
        "--lookup-stop",
        "1",
        "--lookup-weight",
        "0.2",
        "--draft-stop-below",
        "0.1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn generate_refuses_its_flags_before_printing_the_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let (m, t) = write_tiny(dir.path());
    let (ms, ts) = (m.to_str().unwrap(), t.to_str().unwrap());
    let dims = common::Dims {
        dim: 16,
        hidden_dim: 24,
        n_layers: 1,
        n_heads: 2,
        n_kv_heads: 1,
        max_seq_len: CONTEXT,
    };
    let other = common::write_model(dir.path(), "other.bin", 300, &dims, 6);
    for (extra, field) in [
        (
            &["--self-draft-layers", "1", "--lookup", "2", "--lookup-stop", "3"][..],
            "--lookup-stop: 3 exceeds --lookup 2",
        ),
        (
            &["--draft", other.to_str().unwrap()][..],
            "--draft: vocabulary of 300 differs from the target's 266",
        ),
    ] {
        let mut args = vec!["generate", "--target", ms, "--tokenizer", ts, "--prompt", "ab"];
        args.extend_from_slice(extra);
        let out = multispin(&args);
        assert_input_error(&out, field);
        assert!(
            out.stdout.is_empty(),
            "{extra:?} printed {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

#[test]
fn prompt_files_are_bounded_and_name_their_lines() {
    let dir = tempfile::tempdir().unwrap();
    let (m, t) = write_tiny(dir.path());
    let (m, t) = (m.to_str().unwrap(), t.to_str().unwrap());
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let generate = |prompts: &str| {
        multispin(&[
            "generate",
            "--target",
            m,
            "--tokenizer",
            t,
            "--max-tokens",
            "1",
            "--prompts",
            prompts,
        ])
    };
    let sim = |prompts: &str| simulate(&["--devices", "2", "--prompts", prompts]);
    // A blank line is no prompt: refused by line, in both commands that read prompt files.
    let blank = file("blank.txt", "ab\n\nba\n");
    for out in [generate(&blank), sim(&blank)] {
        assert_input_error(&out, &format!("--prompts: {blank} line 2 is blank"));
    }
    // Both read at most 1 MiB.
    for out in [generate("/dev/zero"), sim("/dev/zero")] {
        assert_input_error(
            &out,
            "--prompts: /dev/zero: larger than the limit of 1048576 bytes",
        );
    }
    // A line that cannot fit the context is named by its line, not as --prompt.
    let long = file("long.txt", &format!("ab\n{}\n", "ca".repeat(12)));
    assert_input_error(
        &generate(&long),
        &format!("--prompts {long} line 2: 26 tokens do not fit the context of {CONTEXT} tokens"),
    );
    let long = file(
        "long-story.txt",
        &format!("Once\n{}\n", "Once upon a time ".repeat(200)),
    );
    assert_input_error(&sim(&long), &format!("--prompts {long} line 2: "));
    assert!(stderr(&sim(&long)).contains("exceed the target's context of 512 tokens"));
}

/// A one-token `simulate` of one device with `flag=value` added, each value into its own output folder.
fn simulate_with(flag: &str, value: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let flag = format!("{flag}={value}");
    multispin(&[
        "simulate",
        "--devices",
        "1",
        "--max-tokens",
        "1",
        "--out",
        out_dir,
        &flag,
    ])
}

/// A one-token `simulate` of one device with `extra` added (`--devices 1` and `--max-tokens 1` unless `extra`
/// gives them), into its own output folder.
fn simulate(extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["simulate", "--out", dir.path().to_str().unwrap()];
    for (flag, value) in [("--devices", "1"), ("--max-tokens", "1")] {
        if !extra.contains(&flag) {
            args.extend([flag, value]);
        }
    }
    args.extend_from_slice(extra);
    multispin(&args)
}

#[test]
fn simulate_refuses_counts_it_would_clamp_or_ignore() {
    assert_input_error(&simulate(&["--rounds", "0"]), "--rounds: must be at least 1");
    assert_input_error(
        &simulate(&["--max-tokens", "0"]),
        "--max-tokens: must be at least 1",
    );
    for bad in ["0", "9", "100"] {
        assert_input_error(
            &simulate(&["--scheme", "fixed", "--fixed-draft-len", bad]),
            &format!("--fixed-draft-len: {bad} is outside [1, --max-draft-len] = [1, 8]"),
        );
    }
    // Only a run of the fixed scheme takes a fixed length.
    assert_input_error(
        &simulate(&["--fixed-draft-len", "3"]),
        "--fixed-draft-len: only the fixed scheme takes it",
    );
    for good in [
        &["--compare", "fixed", "--fixed-draft-len", "3"][..],
        &["--scheme", "fixed", "--fixed-len", "8"][..],
        // The default length is lowered to a shorter --max-draft-len, as `plan` lowers it.
        &["--scheme", "fixed", "--max-draft-len", "4"][..],
    ] {
        let out = simulate(good);
        assert!(out.status.success(), "{good:?}: {}", stderr(&out));
    }
}

#[test]
fn simulate_and_generate_share_one_temperature_rule() {
    let rule = "is neither 0 (greedy) nor a finite number ≥ 1e-6";
    for bad in ["1e-9", "NaN", "inf", "-1"] {
        let flag = format!("--temperature={bad}");
        for out in [simulate(&[&flag]), multispin(&["generate", &flag])] {
            assert_input_error(&out, &format!("--temperature: {bad} {rule}"));
            // Said once, not as "temperature: temperature: …".
            assert_eq!(stderr(&out).matches("temperature").count(), 1, "{}", stderr(&out));
        }
    }
    let out = simulate(&["--temperature", "1e-6"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn negative_numbers_reach_the_check_that_names_the_flag() {
    for (extra, field) in [
        (&["--temperature", "-1"][..], "--temperature: -1 is neither 0"),
        (
            &["--alpha-memory", "-0.5"][..],
            "alpha_memory: -0.5 is outside (0, 1]",
        ),
        (
            &["--plan-budget-ms", "-1"][..],
            "--plan-budget-ms: \"-1\" is neither",
        ),
        (
            &["--rounds", "-1"][..],
            "invalid value '-1' for '--rounds <ROUNDS>'",
        ),
    ] {
        assert_input_error(&simulate(extra), field);
    }
    assert_input_error(
        &multispin(&[
            "measure",
            "goodput",
            "--target",
            "t",
            "--prompts",
            "p",
            "--bandwidth-hz",
            "-1",
        ]),
        "--bandwidth-hz: -1",
    );
    // A negative dBm is a power like any other.
    let out = simulate(&["--ul-power-dbm", "-10"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn numbers_in_messages_read_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let (m, t) = write_tiny(dir.path());
    let (m, t) = (m.to_str().unwrap(), t.to_str().unwrap());
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--target",
            m,
            "--tokenizer",
            t,
            "--self-draft-layers",
            "1",
        ];
        args.extend_from_slice(extra);
        multispin(&args)
    };
    // Below 1 as written, 1 in the gate's single precision: said so, not "1 is outside [0, 1)".
    assert_input_error(
        &run(&["--draft-stop-below", "0.99999999"]),
        "--draft-stop-below: 0.99999999 is 1 in single precision, outside [0, 1)",
    );
    assert_input_error(
        &run(&["--lookup", "2", "--lookup-weight", "1e-50"]),
        "--lookup-weight: 1e-50 is 0 in single precision, outside (0, 1]",
    );
    assert_input_error(&run(&["--top-p", "1e308"]), "--top-p: 1e308 is outside (0, 1]");
    // A library's message about an f64 of 1e308 says 1e308, not 309 digits.
    assert_input_error(
        &simulate(&["--bandwidth-hz", "-1e308"]),
        "bandwidth_hz: -1e308 is not a finite number > 0",
    );
    let a = std::fs::read_to_string(example("paper-a.json"))
        .unwrap()
        .replacen("\"bandwidth_hz\": 1.0e7", "\"bandwidth_hz\": -1e308", 1);
    let path = dir.path().join("a.json");
    std::fs::write(&path, a).unwrap();
    assert_input_error(
        &multispin(&["plan", "--scenario", path.to_str().unwrap(), "--scheme", "exact"]),
        "bandwidth_hz: -1e308 is outside (0, ∞)",
    );
}

#[test]
fn absurd_device_and_thread_counts_are_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let sim = |extra: &[&str]| {
        let mut args = vec!["simulate", "--max-tokens", "1", "--out", out_dir];
        args.extend_from_slice(extra);
        multispin(&args)
    };
    let started = std::time::Instant::now();
    let out = sim(&["--devices", "100000"]);
    assert_input_error(&out, "devices: 100000 exceeds 1024");
    let out = sim(&["--sweep-devices", "1,5000"]);
    assert_input_error(&out, "sweep_devices: 5000 exceeds 1024");
    assert!(
        started.elapsed().as_secs() < 20,
        "refused only after {:?}",
        started.elapsed()
    );
    assert_input_error(&sim(&["--devices", "1", "--threads", "257"]), "--threads");
}

#[test]
fn a_bad_planning_budget_is_refused_naming_the_flag() {
    for bad in ["-1", "NaN", "inf", "2ms", ""] {
        assert_input_error(&simulate_with("--plan-budget-ms", bad), "--plan-budget-ms");
    }
    for good in ["0", "2.5", "none"] {
        let out = simulate_with("--plan-budget-ms", good);
        assert!(out.status.success(), "{good}: {}", stderr(&out));
    }
}

#[test]
fn a_bad_price_per_drafted_token_is_refused_naming_it() {
    for bad in ["-0.001", "NaN", "inf"] {
        assert_input_error(
            &simulate_with("--verify-per-draft-token-s", bad),
            "verify_per_draft_token_s",
        );
    }
    let out = simulate_with("--verify-per-draft-token-s", "0.0006");
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_bad_acceptance_memory_is_refused_naming_it() {
    for bad in ["0", "-0.5", "1.5", "NaN"] {
        assert_input_error(&simulate_with("--alpha-memory", bad), "alpha_memory");
    }
    for good in ["1", "0.5"] {
        let out = simulate_with("--alpha-memory", good);
        assert!(out.status.success(), "{good}: {}", stderr(&out));
    }
}

#[test]
fn bad_model_and_tokenizer_files_exit_2_with_a_clear_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (m, t) = write_tiny(dir.path());
    let (ms, ts) = (m.to_str().unwrap(), t.to_str().unwrap());
    // /dev/zero as a tokenizer: refused after reading the limit, not after filling the memory.
    let out = multispin(&["generate", "--target", ms, "--tokenizer", "/dev/zero"]);
    assert_input_error(&out, "larger than the limit");
    // /dev/zero as a model: the header (all zeros) is refused before any weight is read.
    let out = multispin(&["generate", "--target", "/dev/zero", "--tokenizer", ts]);
    assert_input_error(&out, "header.dim");
    // A tokenizer of another vocabulary is named as such, not as a truncation.
    let other = dir.path().join("other.bin");
    std::fs::write(&other, tokenizer(&["x", "y"]).to_bytes()).unwrap();
    let out = multispin(&["generate", "--target", ms, "--tokenizer", other.to_str().unwrap()]);
    assert_input_error(&out, "holds 261 tokens but the model's vocabulary has 266");
    // A NaN weight names its tensor.
    let mut bytes = std::fs::read(&m).unwrap();
    let at = 28 + 4 * (266 * 16 + 3);
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let nan = dir.path().join("nan.bin");
    std::fs::write(&nan, &bytes).unwrap();
    let out = multispin(&["generate", "--target", nan.to_str().unwrap(), "--tokenizer", ts]);
    assert_input_error(&out, "model.layers.0.input_layernorm.weight");
    // A header asking for 2^26 positions is refused by the documented limit, before the file size is looked at.
    let mut bytes = std::fs::read(&m).unwrap();
    bytes[24..28].copy_from_slice(&(1i32 << 26).to_le_bytes());
    let long = dir.path().join("long.bin");
    std::fs::write(&long, &bytes).unwrap();
    let out = multispin(&["generate", "--target", long.to_str().unwrap(), "--tokenizer", ts]);
    assert_input_error(&out, "max_seq_len");
}

/// A GGUF file cut short or of an unsupported version exits 2 saying what is wrong with it (where candle's parser
/// said "failed to fill whole buffer").
#[test]
fn a_broken_gguf_exits_2_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let (tok, t) = common::write_tokenizer(dir.path());
    let cfg = spin_runtime::Config {
        vocab_size: tok.vocab_size(),
        dim: 32,
        hidden_dim: 32,
        n_layers: 1,
        n_heads: 2,
        n_kv_heads: 1,
        max_seq_len: CONTEXT,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: spin_runtime::RopeStyle::Interleaved,
        qkv_bias: false,
        tied_embeddings: true,
    };
    let device = spin_runtime::select_device().unwrap();
    let w = spin_runtime::model::random_tensors(&cfg, 0.3, 5, &device).unwrap();
    let path = dir.path().join("m.gguf");
    spin_runtime::gguf::write(&path, &cfg, &w, spin_runtime::gguf::GgmlDType::Q8_0).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let ts = t.to_str().unwrap();
    let run = |name: &str, b: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, b).unwrap();
        multispin(&[
            "generate",
            "--target",
            p.to_str().unwrap(),
            "--tokenizer",
            ts,
            "--prompt",
            "ab",
        ])
    };
    let out = run("sound.gguf", &bytes);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_input_error(
        &run("cut.gguf", &bytes[..20]),
        "header: the file is truncated: it ends at byte 20, reading this needs bytes 16..24",
    );
    let mut v1 = bytes.clone();
    v1[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert_input_error(&run("v1.gguf", &v1), "GGUF version 1 is not supported");
}

/// `RAYON_NUM_THREADS` is bounded as `--threads` is (1 to 256), and refused naming it otherwise.
#[test]
fn a_bad_rayon_num_threads_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let sim = |threads: &str| {
        Command::new(env!("CARGO_BIN_EXE_multispin"))
            .args([
                "simulate",
                "--devices",
                "1",
                "--max-tokens",
                "1",
                "--out",
                out_dir,
            ])
            .env("RAYON_NUM_THREADS", threads)
            .env_remove("RUST_BACKTRACE")
            .output()
            .unwrap()
    };
    for bad in ["100000", "257", "0", "-1", "two"] {
        assert_input_error(&sim(bad), "RAYON_NUM_THREADS");
    }
    for good in ["1", "3", ""] {
        let out = sim(good);
        assert!(out.status.success(), "{good:?}: {}", stderr(&out));
    }
}

#[test]
fn errors_stay_on_one_line_when_backtraces_are_on() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = write_tiny(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_multispin"))
        .args([
            "generate",
            "--target",
            m.to_str().unwrap(),
            "--tokenizer",
            "/nonexistent/tok.bin",
        ])
        .env("RUST_BACKTRACE", "full")
        .env("RUST_LIB_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_input_error(&out, "/nonexistent/tok.bin");
    // Usage errors from the argument parser follow the same one-line contract.
    assert_input_error(&multispin(&["generate", "--no-such-flag"]), "--no-such-flag");
    assert_input_error(&multispin(&["plan", "--scheme", "exact"]), "--scenario");
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios/examples")
        .join(name)
}

#[test]
fn correct_rejected_lists_are_parsed_strictly() {
    let b = example("paper-b.json");
    let b = b.to_str().unwrap();
    for bad in ["1,,2", "1,", "+1", " 1", "1,1", "6", "-1", "0x1", "1;2"] {
        let out = multispin(&["correct", "--scenario", b, "--rejected", bad]);
        assert_input_error(&out, "--rejected");
    }
    let out = multispin(&[
        "correct",
        "--scenario",
        b,
        "--rejected",
        "0,5",
        "--format",
        "table",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("DL power (mW)"));
}

#[test]
fn plan_schemes_and_the_fixed_draft_length() {
    let dir = tempfile::tempdir().unwrap();
    let a = example("paper-a.json");
    let a = a.to_str().unwrap();
    // Unknown schemes and schemes of the other paper exit 2; --help lists the schemes.
    assert_input_error(
        &multispin(&["plan", "--scenario", a, "--scheme", "fastest"]),
        "--scheme",
    );
    assert_input_error(
        &multispin(&["plan", "--scenario", a, "--scheme", "greedy"]),
        "--scheme",
    );
    // A fixed length under another scheme would change nothing: refused, as for paper-B and unified scenarios.
    assert_input_error(
        &multispin(&[
            "plan",
            "--scenario",
            a,
            "--scheme",
            "exact",
            "--fixed-draft-len",
            "3",
        ]),
        "--fixed-draft-len: only --scheme fixed takes it",
    );
    let help = String::from_utf8(multispin(&["plan", "--help"]).stdout).unwrap();
    assert!(
        help.contains("paper-alg1") && help.contains("comp-only"),
        "{help}"
    );
    // max_draft_len < 8: the default fixed length is lowered to it, an explicit one outside the range is an error.
    let text = std::fs::read_to_string(a)
        .unwrap()
        .replace("\"max_draft_len\": 25", "\"max_draft_len\": 5");
    let path = dir.path().join("short.json");
    std::fs::write(&path, &text).unwrap();
    let p = path.to_str().unwrap();
    let out = multispin(&["plan", "--scenario", p, "--scheme", "fixed"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["draft_lengths"], serde_json::json!([5, 5, 5, 5]));
    let out = multispin(&[
        "plan",
        "--scenario",
        p,
        "--scheme",
        "fixed",
        "--fixed-draft-len",
        "3",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["draft_lengths"], serde_json::json!([3, 3, 3, 3]));
    assert_input_error(
        &multispin(&[
            "plan",
            "--scenario",
            p,
            "--scheme",
            "fixed",
            "--fixed-draft-len",
            "9",
        ]),
        "--fixed-draft-len: 9 is outside",
    );
    let with_field = text.replacen(
        "\"max_draft_len\": 5",
        "\"max_draft_len\": 5, \"fixed_draft_len\": 7",
        1,
    );
    std::fs::write(&path, with_field).unwrap();
    assert_input_error(
        &multispin(&["plan", "--scenario", p, "--scheme", "fixed"]),
        "fixed_draft_len: 7 is outside",
    );
}

#[test]
fn scenario_files_reject_misspelt_duplicate_and_defaulted_fields() {
    let dir = tempfile::tempdir().unwrap();
    let a = std::fs::read_to_string(example("paper-a.json")).unwrap();
    let b = std::fs::read_to_string(example("paper-b.json")).unwrap();
    let cases = [
        (
            a.replacen("\"bandwidth_hz\"", "\"bandwith_hz\": 1, \"bandwidth_hz\"", 1),
            "a",
            "bandwith_hz",
        ),
        (
            a.replacen(
                "\"max_draft_len\": 25",
                "\"max_draft_len\": 25, \"max_draft_len\": 2",
                1,
            ),
            "a",
            "max_draft_len",
        ),
        (b.replacen("\"saa_samples\": 1000,", "", 1), "b", "saa_samples"),
        (b.replacen("\"seed\": 7,", "", 1), "b", "seed"),
        (
            b.replacen(
                "\"ul_power_w\": 0.0316",
                "\"ul_power_w\": 0.0316, \"ul_power_dbm\": 15",
                1,
            ),
            "b",
            "ul_power_w, ul_power_dbm",
        ),
    ];
    for (text, kind, field) in cases {
        let path = dir.path().join("s.json");
        std::fs::write(&path, &text).unwrap();
        let scheme = if kind == "a" { "exact" } else { "greedy" };
        assert_input_error(
            &multispin(&["plan", "--scenario", path.to_str().unwrap(), "--scheme", scheme]),
            field,
        );
    }
    // The units radio engineers use give the same plan as the SI fields.
    let si = multispin(&[
        "plan",
        "--scenario",
        example("paper-b.json").to_str().unwrap(),
        "--scheme",
        "uniform",
    ]);
    let db = b
        .replacen("\"bandwidth_hz\": 1.0e7", "\"bandwidth_mhz\": 10", 1)
        .replacen("\"dl_power_w\": 1.0", "\"dl_power_dbm\": 30", 1);
    let path = dir.path().join("db.json");
    std::fs::write(&path, db).unwrap();
    let out = multispin(&[
        "plan",
        "--scenario",
        path.to_str().unwrap(),
        "--scheme",
        "uniform",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, si.stdout);
    // A scenario file of /dev/zero size is refused by the limit.
    assert_input_error(
        &multispin(&["plan", "--scenario", "/dev/zero", "--scheme", "exact"]),
        "larger than the limit",
    );
}

#[test]
fn drop_files_are_strict_and_seeded() {
    let dir = tempfile::tempdir().unwrap();
    let drop = std::fs::read_to_string(example("drop-paper-b.toml")).unwrap();
    let run = |text: &str, extra: &[&str]| {
        let path = dir.path().join("drop.toml");
        std::fs::write(&path, text).unwrap();
        let mut args = vec!["scenario", "--drop", path.to_str().unwrap()];
        args.extend_from_slice(extra);
        multispin(&args)
    };
    let a = run(&drop, &[]);
    let again = run(&drop, &[]);
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(a.stdout, again.stdout);
    let other = run(&drop, &["--seed", "8"]);
    assert_ne!(a.stdout, other.stdout);
    assert_input_error(
        &run(
            &drop.replace("ul_power_dbm = 15.0", "ul_power_dbm = 15.0\nul_power_w = 0.03"),
            &[],
        ),
        "ul_power_w, ul_power_dbm",
    );
    assert_input_error(
        &run(&drop.replace("fading = \"rayleigh\"", "fading = \"rician\""), &[]),
        "fading",
    );
    assert_input_error(
        &run(&drop.replace("devices = 6", "devices = 6\ndevicez = 1"), &[]),
        "devicez",
    );
    assert_input_error(&run(&drop.replace("seed = 7\n", ""), &[]), "seed");
    assert_input_error(
        &run(&drop, &["--model", "paper-a"]),
        "not used by a paper-a scenario",
    );
    assert_input_error(
        &run(
            &drop.replace(
                "acceptance = [0.95, 0.9, 0.8, 0.6, 0.5, 0.4]",
                "acceptance = [0.9]",
            ),
            &[],
        ),
        "acceptance: 1 values for 6 devices",
    );
}

/// Errors about a file name the field the file wrote, not one derived from it, and a value that would overflow a
/// result is refused instead of printed as `null`.
#[test]
fn scenario_and_drop_errors_name_the_fields_the_file_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let plan = |name: &str, text: &str, scheme: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        multispin(&["plan", "--scenario", path.to_str().unwrap(), "--scheme", scheme])
    };
    let a = std::fs::read_to_string(example("paper-a.json")).unwrap();
    let b = std::fs::read_to_string(example("paper-b.json")).unwrap();
    // Every device's upload time is absurd: the shared fields are at fault, not device 0's spectral efficiency.
    assert_input_error(
        &plan(
            "a.json",
            &a.replacen("\"bandwidth_hz\": 1.0e7", "\"bandwidth_hz\": 1e308", 1),
            "exact",
        ),
        "bandwidth_hz, distribution_bits: one token takes",
    );
    assert_input_error(
        &plan(
            "a.json",
            &a.replacen(
                "\"max_draft_len\": 25",
                "\"max_draft_len\": 25, \"alg1_lambda_points\": 0",
                1,
            ),
            "paper-alg1",
        ),
        "alg1_lambda_points: must be at least 1",
    );
    // A paper-B verification time of 1e308 s made the latency ∞ (printed `null`, exit 0).
    assert_input_error(
        &plan(
            "b.json",
            &b.replacen("\"verify_fixed_s\": 0.0428", "\"verify_fixed_s\": 1e308", 1),
            "greedy",
        ),
        "verify_fixed_s: 1e308 s is above the limit of 1e100 s",
    );
    let drop = std::fs::read_to_string(example("drop-paper-b.toml")).unwrap();
    let scenario = |text: &str| {
        let path = dir.path().join("drop.toml");
        std::fs::write(&path, text).unwrap();
        multispin(&["scenario", "--drop", path.to_str().unwrap()])
    };
    for (from, to, field) in [
        (
            "acceptance = [0.95, 0.9,",
            "acceptance = [0.95, nan,",
            "acceptance: NaN (device 1) is not a finite number",
        ),
        (
            "verify_fixed_s = 0.0428",
            "verify_fixed_s = inf",
            "verify_fixed_s: inf is not a finite number",
        ),
        (
            "reference_distance_m = 1.0",
            "reference_distance_m = 0.0",
            "reference_distance_m: 0 is outside (0, ∞)",
        ),
        (
            "path_loss_exponent = 3.5",
            "path_loss_exponent = 1e308",
            "reference_gain_db, reference_distance_m, path_loss_exponent, min_distance_m, max_distance_m: \
             the path loss gives a device a mean power gain of 0",
        ),
    ] {
        assert!(drop.contains(from), "{from}");
        assert_input_error(&scenario(&drop.replacen(from, to, 1)), field);
    }
}

/// A unified scenario takes every quantity in either unit of its pair, as paper-A and paper-B files do: the same
/// file with `bandwidth_mhz` and `dl_power_dbm` (exact conversions) plans the same, and both spellings at once exit 2
/// naming the pair.
#[test]
fn unified_scenarios_take_unit_pairs() {
    let dir = tempfile::tempdir().unwrap();
    let si = std::fs::read_to_string(example("unified.json")).unwrap();
    let plan = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        multispin(&[
            "plan",
            "--scenario",
            path.to_str().unwrap(),
            "--scheme",
            "unified",
            "--format",
            "json",
        ])
    };
    let db = si
        .replacen("\"bandwidth_hz\": 1.0e7", "\"bandwidth_mhz\": 10", 1)
        .replacen("\"dl_power_w\": 1.0", "\"dl_power_dbm\": 30", 1);
    assert_ne!(db, si);
    let (a, b) = (plan("si.json", &si), plan("db.json", &db));
    assert!(a.status.success(), "{}", stderr(&a));
    assert!(b.status.success(), "{}", stderr(&b));
    assert_eq!(a.stdout, b.stdout);
    let both = si.replacen(
        "\"bandwidth_hz\": 1.0e7",
        "\"bandwidth_hz\": 1.0e7, \"bandwidth_mhz\": 10",
        1,
    );
    assert_input_error(
        &plan("both.json", &both),
        "bandwidth_hz, bandwidth_mhz: give exactly one",
    );
}

/// The limit on `serve --tokens`, `device --token-file` and the TLS PEM files: 1 MiB each (`serve::MAX_TOKEN_FILE_BYTES`,
/// `spin_net::tls::MAX_PEM_BYTES`).
const SMALL_FILE_LIMIT: u64 = 1 << 20;

/// A sparse file of `len` bytes (it takes no disk).
fn sparse(dir: &Path, name: &str, len: u64) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().set_len(len).unwrap();
    p
}

/// Token, certificate, key and CA files over their limit are refused naming the flag and the limit, before a model
/// loads or a connection is made; `/dev/zero` is read only up to the limit.
#[test]
fn oversized_token_and_certificate_files_exit_2_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let big = sparse(dir.path(), "big", SMALL_FILE_LIMIT + 1);
    let big = big.to_str().unwrap();
    let small = dir.path().join("small.pem");
    std::fs::write(&small, "not a certificate").unwrap();
    let small = small.to_str().unwrap();
    let limit = format!("limit of {SMALL_FILE_LIMIT} bytes");
    let serve = |extra: &[&str]| {
        let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        multispin(&args)
    };
    let device = |extra: &[&str]| {
        let mut args = vec!["device", "--connect", "127.0.0.1:1"];
        args.extend_from_slice(extra);
        multispin(&args)
    };
    for (out, field) in [
        (serve(&["--tokens", big]), "tokens:"),
        (serve(&["--tokens", "/dev/zero"]), "tokens:"),
        (serve(&["--tls-cert", big, "--tls-key", small]), "tls_cert:"),
        (serve(&["--tls-cert", small, "--tls-key", big]), "tls_key:"),
        (device(&["--token-file", big]), "token_file:"),
        (device(&["--token-file", "/dev/zero"]), "token_file:"),
        (device(&["--tls-ca", big]), "tls_ca:"),
    ] {
        assert_input_error(&out, field);
        assert!(stderr(&out).contains(&limit), "{}", stderr(&out));
    }
}

/// A listener on 127.0.0.1 whose connections get `reply` (raw bytes) once the device's first bytes arrived, and
/// are then held open for 20 s.
fn fake_server(reply: Vec<u8>) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let reply = reply.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = s.write_all(&reply);
                std::thread::sleep(std::time::Duration::from_secs(20));
            });
        }
    });
    addr
}

/// `device` against a server that accepts and never answers gives up after `--handshake-timeout-s` (exit 1, one
/// line naming the address once and what it waited for); a timeout of 0 is refused naming the flag.
#[test]
fn a_device_gives_up_on_a_silent_server_naming_the_address() {
    let addr = fake_server(Vec::new());
    // The address is said once, by the flag that gave it.
    device_gives_up(
        &addr,
        &["--handshake-timeout-s", "0.3"],
        "handshake: the server accepted the connection but sent no Welcome within 0.3 s",
    );
    let out = multispin(&["device", "--connect", &addr, "--handshake-timeout-s", "0"]);
    assert_input_error(&out, "handshake_timeout_s:");
}

/// Runs `device --connect addr ARGS` against a server that fails it, and checks that it gave up well within 15 s
/// with exit 1 and the one line `error: --connect ADDR: WANT`.
fn device_gives_up(addr: &str, args: &[&str], want: &str) {
    let start = std::time::Instant::now();
    let out = multispin(&[&["device", "--connect", addr][..], args].concat());
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end(), format!("error: --connect {addr}: {want}"));
    assert!(
        start.elapsed() < std::time::Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
}

/// `device` against a server that welcomes it and then says nothing, not even a keepalive, gives up after
/// `--silence-timeout-s` (exit 1, one line naming the address once); a timeout of 0 is refused naming the flag.
#[test]
fn a_device_gives_up_on_a_server_that_welcomes_and_then_says_nothing() {
    use spin_net::proto::{Exchange, Identity, PROTOCOL_VERSION, SECRET_BYTES, ServerMsg, SessionParams};
    let body = spin_net::proto::encode(&ServerMsg::Welcome {
        version: PROTOCOL_VERSION,
        session: 7,
        secret: [3; SECRET_BYTES],
        device: 0,
        // The embedded draft's vocabulary; a tokenizer fingerprint of 0 is not compared.
        identity: Identity {
            vocab: 512,
            tokenizer: 0,
            model: 0,
        },
        committed: vec![1],
        prompt_len: 1,
        params: SessionParams {
            temperature: 0.0,
            exchange: Exchange::ProbsOnly,
            v_eff: 64,
            q_bits: 8,
            seed: 0,
            max_new_tokens: 8,
        },
    })
    .unwrap();
    let addr = fake_server(spin_net::wire::frame_bytes(&body));
    device_gives_up(
        &addr,
        &["--silence-timeout-s", "0.5", "--reconnect-s", "0"],
        "silence: the server sent nothing for 0.5 s after the handshake, not even a keepalive",
    );
    let out = multispin(&["device", "--connect", &addr, "--silence-timeout-s", "0"]);
    assert_input_error(&out, "silence_timeout_s:");
    let out = multispin(&["device", "--connect", &addr, "--progress-timeout-s", "0"]);
    assert_input_error(&out, "progress_timeout_s:");
}

/// A hostile server's `Error` text reaches the terminal escaped: no escape sequence, no second line.
#[test]
fn a_device_prints_a_hostile_servers_error_escaped_on_one_line() {
    let body = spin_net::proto::encode(&spin_net::proto::ServerMsg::Error {
        code: spin_net::proto::ErrorCode::Protocol,
        message: "\u{1b}[2J\u{1b}[31mowned\nsecond line".into(),
    })
    .unwrap();
    let addr = fake_server(spin_net::wire::frame_bytes(&body));
    let out = multispin(&["device", "--connect", &addr]);
    let err = stderr(&out);
    assert_input_error(&out, r"\u{1b}[2J\u{1b}[31mowned\nsecond line");
    assert!(!err.trim_end().chars().any(char::is_control), "{err:?}");
}

/// `serve` checks every flag before its target loads (a missing target file is not what a bad flag reports), and
/// refuses a `--max-tokens` that leaves no room for a prompt in the target's context at start, naming the flag,
/// instead of refusing every device when it joins.
#[test]
fn serve_checks_its_flags_before_the_target_loads_and_its_token_budget_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.bin");
    let missing = missing.to_str().unwrap();
    for (flag, value, field) in [
        ("--temperature", "-1", "--temperature:"),
        ("--max-tokens", "0", "--max-tokens:"),
        ("--wall-deadline-s", "0", "wall_deadline_s:"),
        ("--resume-window-s", "0", "resume_window_s:"),
        ("--max-connections", "0", "max_connections:"),
        ("--alpha-prior", "2", "alpha_prior:"),
        ("--listen", "0.0.0.0:0", "listen:"),
    ] {
        let out = multispin(&["serve", "--target", missing, flag, value]);
        assert_input_error(&out, field);
        assert!(!stderr(&out).contains("missing.bin"), "{}", stderr(&out));
    }
    let (model, tok) = write_tiny(dir.path());
    let context = CONTEXT.to_string();
    let out = multispin(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--target",
        model.to_str().unwrap(),
        "--tokenizer",
        tok.to_str().unwrap(),
        "--max-tokens",
        &context,
    ]);
    assert_input_error(
        &out,
        &format!(
            "--max-tokens: {CONTEXT} leaves no room for a prompt in the target's context of {CONTEXT} tokens"
        ),
    );
}

/// `serve --listen 127.0.0.1:0 ARGS` started by a test (`RUST_LOG` unset), its stderr read line by line from a
/// thread of its own, and the address from its first line (`listening on ADDR`).
fn serve_with_stderr_lines(
    args: &[&str],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>, String) {
    use std::io::{BufRead, BufReader};
    let mut server = Command::new(env!("CARGO_BIN_EXE_multispin"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = server.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let wait = std::time::Duration::from_secs(60);
    let first = rx.recv_timeout(wait).unwrap();
    let addr = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{first:?}"))
        .to_owned();
    (server, rx, addr)
}

/// `serve` says on stderr, one line each, whom it refused and why (here a frame of no known message).
#[test]
fn serve_says_on_stderr_whom_it_refused_and_why() {
    use std::io::Write;
    let (mut server, rx, addr) = serve_with_stderr_lines(&["--handshake-timeout-s", "0.5"]);
    let wait = std::time::Duration::from_secs(60);
    let mut peer = std::net::TcpStream::connect(&addr).unwrap();
    let me = peer.local_addr().unwrap();
    peer.write_all(&[0, 0, 0, 2, 9, 0]).unwrap();
    let want = format!("refused {me}: frame: DeviceMsg: variant 9 does not exist");
    let mut seen = Vec::new();
    let found = loop {
        match rx.recv_timeout(wait) {
            Ok(line) if line.starts_with(&want) => break true,
            Ok(line) => seen.push(line),
            Err(_) => break false,
        }
    };
    // The server was started by this test; it is stopped by its own handle.
    let _ = server.kill();
    let _ = server.wait();
    assert!(found, "no {want:?} in {seen:#?}");
}

/// The listener's warning when accepting fails reaches `serve`'s stderr through the command's `tracing` subscriber
/// (here the server's descriptors run out under a limit lowered with `prlimit`, while clients connect); a
/// `RUST_LOG` that does not parse is refused naming it.
#[test]
fn serve_writes_the_listeners_warnings_on_stderr() {
    let (mut server, rx, addr) = serve_with_stderr_lines(&[]);
    let pid = server.id().to_string();
    let open = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let lowered = Command::new("prlimit")
        .args(["--pid", &pid, &format!("--nofile={}", open + 4)])
        .status()
        .is_ok_and(|s| s.success());
    let mut clients = Vec::new();
    let mut seen = Vec::new();
    let found = lowered && {
        for _ in 0..32 {
            if let Ok(c) = std::net::TcpStream::connect(&addr) {
                clients.push(c);
            }
        }
        // Other lines come meanwhile (whom the server waits for, every 5 s): the wait has one deadline.
        let by = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            match rx.recv_timeout(by.saturating_duration_since(std::time::Instant::now())) {
                Ok(line)
                    if line.contains("WARN") && line.contains("listener: file descriptors exhausted") =>
                {
                    break true;
                }
                Ok(line) => seen.push(line),
                Err(_) => break false,
            }
        }
    };
    // The server was started by this test; it is stopped by its own handle.
    let _ = server.kill();
    let _ = server.wait();
    if !lowered {
        eprintln!("skipped: `prlimit` could not lower the server's descriptor limit");
    } else {
        assert!(found, "no listener warning in {seen:#?}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_multispin"))
        .args(["plan", "--help"])
        .env("RUST_LOG", "spin_net=loud")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "--help is printed whatever RUST_LOG says"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_multispin"))
        .args(["device", "--connect", "127.0.0.1:1"])
        .env("RUST_LOG", "spin_net=loud")
        .output()
        .unwrap();
    assert_input_error(&out, "RUST_LOG: \"spin_net=loud\" is not a tracing filter");
}

/// `serve` whose stderr nobody reads (a full pipe) still serves: its lines (the address, the notices, the log) are
/// written by a thread of their own, never by the runtime that runs the rounds.
#[test]
fn serve_serves_while_nobody_reads_its_stderr() {
    use std::io::Write;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (reader, writer) = std::io::pipe().unwrap();
    // Fill the pipe from a thread of this test: once the count stops growing, the pipe is full.
    let mut filler = writer.try_clone().unwrap();
    let written = Arc::new(AtomicUsize::new(0));
    let w = written.clone();
    std::thread::spawn(move || {
        let chunk = [b'x'; 512];
        while filler.write_all(&chunk).is_ok() {
            w.fetch_add(1, Ordering::SeqCst);
        }
    });
    let by = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut last = usize::MAX;
    while written.load(Ordering::SeqCst) != last && std::time::Instant::now() < by {
        last = written.load(Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut server = Command::new(env!("CARGO_BIN_EXE_multispin"))
        .args(["serve", "--listen", &addr])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(writer))
        .spawn()
        .unwrap();
    // The server listens once its target loaded (a probe that connects and closes is not refused).
    while std::net::TcpStream::connect(&addr).is_err() && std::time::Instant::now() < by {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = multispin(&[
        "device",
        "--connect",
        &addr,
        "--handshake-timeout-s",
        "10",
        "--prompt",
        "Once upon a time",
    ]);
    // The server was started by this test; it is stopped by its own handle.
    let _ = server.kill();
    let _ = server.wait();
    drop(reader);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("Once upon a time"),
        "{out:?}"
    );
}

/// A wait no clock can hold as a deadline is refused naming the flag (such values used to panic on the first
/// connection or the first cut one).
#[test]
fn waits_beyond_a_year_are_refused_naming_the_flag() {
    let serve = |extra: &[&str]| {
        let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        multispin(&args)
    };
    for (flag, field) in [
        ("--handshake-timeout-s", "handshake_timeout_s:"),
        ("--resume-window-s", "resume_window_s:"),
        ("--wall-deadline-s", "wall_deadline_s:"),
    ] {
        assert_input_error(&serve(&[flag, "1e19"]), field);
    }
    assert_input_error(&serve(&["--plan-budget-ms", "1e22"]), "plan_budget:");
    for (flag, field) in [
        ("--handshake-timeout-s", "handshake_timeout_s:"),
        ("--silence-timeout-s", "silence_timeout_s:"),
        ("--progress-timeout-s", "progress_timeout_s:"),
        ("--reconnect-s", "reconnect_s:"),
    ] {
        assert_input_error(
            &multispin(&["device", "--connect", "127.0.0.1:1", flag, "1e19"]),
            field,
        );
    }
}

/// A `tokenizer.json` (a whitespace-split word-level pipeline) with the words and ids of `vocab`, at `dir/name`.
fn word_tokenizer(dir: &Path, name: &str, vocab: &[(&str, u32)]) -> PathBuf {
    let words: serde_json::Map<String, serde_json::Value> =
        vocab.iter().map(|&(w, id)| (w.to_string(), id.into())).collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": words, "unk_token": "<unk>"}
    });
    let path = dir.join(name);
    std::fs::write(&path, json.to_string()).unwrap();
    path
}

/// A GGUF model with `rows` embedding rows carrying a vocabulary of `tokens` tokens (BOS 1, EOS 2), at `dir/name`.
fn gguf_with_vocab(dir: &Path, name: &str, rows: usize, tokens: usize) -> PathBuf {
    let cfg = Config {
        vocab_size: rows,
        dim: 32,
        hidden_dim: 32,
        n_layers: 1,
        n_heads: 2,
        n_kv_heads: 1,
        max_seq_len: CONTEXT,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: RopeStyle::Interleaved,
        qkv_bias: false,
        tied_embeddings: true,
    };
    let w = model::random_tensors(&cfg, 0.3, 4, &spin_runtime::select_device().unwrap()).unwrap();
    let vocab = GgufVocab {
        tokens: (0..tokens).map(|i| format!("t{i}")).collect(),
        bos: Some(1),
        eos: Some(2),
        ..Default::default()
    };
    let opts = WriteOptions {
        dtype: GgmlDType::Q8_0,
        overrides: &[],
        vocab: Some(&vocab),
        head_vocab: None,
    };
    let path = dir.join(name);
    gguf::write_with(&path, &cfg, &w, &opts).unwrap();
    path
}

/// A draft with a restricted output head (six scored tokens of a target vocabulary of `full_vocab`): its folder
/// and the same draft as GGUF.
fn write_restricted(dir: &Path, full_vocab: usize) -> (PathBuf, PathBuf) {
    let hv = HeadVocab::new(vec![3, 1, 7, 0, 12, 5], full_vocab).unwrap();
    let cfg = Config {
        vocab_size: hv.compact_vocab(),
        dim: 32,
        hidden_dim: 32,
        n_layers: 1,
        n_heads: 2,
        n_kv_heads: 1,
        max_seq_len: CONTEXT,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: RopeStyle::Halves,
        qkv_bias: false,
        tied_embeddings: true,
    };
    let w = model::random_tensors(&cfg, 0.3, 8, &spin_runtime::select_device().unwrap()).unwrap();
    let folder = dir.join("restricted");
    spin_runtime::hf::write_draft_dir(&folder, &cfg, &w, &hv).unwrap();
    let file = dir.join("restricted.gguf");
    gguf::write_from_dir(&folder, &file, GgmlDType::Q8_0).unwrap();
    (folder, file)
}

/// A tokenizer with ids the model does not have (here a vocabulary of 266) is refused where tokenizer and model
/// meet, by every command that pairs them, exit 2 naming `--tokenizer` and both sizes, before any output: the
/// ids counted are the largest one's (a `tokenizer.json` of three words may reach id 299), not the entries. A
/// GGUF model whose own vocabulary outgrows its embedding rows is refused naming `--target`.
#[test]
fn a_tokenizer_with_ids_the_model_lacks_is_refused_by_every_command_that_pairs_them() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = write_tiny(dir.path());
    let ms = m.to_str().unwrap();
    let sparse = word_tokenizer(dir.path(), "sparse.json", &[("<unk>", 0), ("a", 1), ("b", 299)]);
    let big_gguf = gguf_with_vocab(dir.path(), "big.gguf", 300, 300);
    for tok in [&sparse, &big_gguf] {
        let ts = tok.to_str().unwrap();
        let want = format!(
            "--tokenizer: {ts} has 300 token ids (0 to 299) but the vocabulary of --target {ms} has 266"
        );
        let out = multispin(&["generate", "--target", ms, "--tokenizer", ts, "--prompt", "a"]);
        assert_input_error(&out, &want);
        assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    }
    let ts = sparse.to_str().unwrap();
    let out_dir = dir.path().join("out");
    let od = out_dir.to_str().unwrap();
    let runs: [&[&str]; 4] = [
        &[
            "simulate",
            "--target",
            ms,
            "--tokenizer",
            ts,
            "--self-draft-layers",
            "1",
            "--out",
            od,
        ],
        &[
            "measure",
            "pass-cost",
            "--target",
            ms,
            "--tokenizer",
            ts,
            "--out",
            od,
        ],
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--target",
            ms,
            "--tokenizer",
            ts,
        ],
        &[
            "device",
            "--connect",
            "127.0.0.1:9",
            "--draft",
            ms,
            "--tokenizer",
            ts,
        ],
    ];
    for args in runs {
        let flag = if args[0] == "device" {
            "--draft"
        } else {
            "--target"
        };
        let out = multispin(args);
        assert_input_error(
            &out,
            &format!(
                "--tokenizer: {ts} has 300 token ids (0 to 299) but the vocabulary of {flag} {ms} has 266"
            ),
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    assert!(!out_dir.exists(), "a refused command wrote its output folder");
    // The vocabulary a GGUF file carries, beyond its own embedding rows.
    let carried = gguf_with_vocab(dir.path(), "carried.gguf", 266, 300);
    let cs = carried.to_str().unwrap();
    let out = multispin(&["generate", "--target", cs, "--prompt", "t5"]);
    assert_input_error(
        &out,
        &format!(
            "--target {cs}: the tokenizer it carries has 300 token ids (0 to 299) but its vocabulary has 266"
        ),
    );
    // A tokenizer with fewer ids than the model's rows (padded embeddings) fits.
    let small = word_tokenizer(dir.path(), "small.json", &[("<unk>", 0), ("a", 1), ("b", 265)]);
    let out = multispin(&[
        "generate",
        "--target",
        ms,
        "--tokenizer",
        small.to_str().unwrap(),
        "--prompt",
        "a b",
        "--max-tokens",
        "2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A draft with a restricted output head is refused as the target (its logits are over its compact ids, so it
/// failed mid-generation at the first prompt token past them, exit 1), as a folder or a GGUF file, by every
/// command that loads a target, naming `--target` and why; beside a target of its vocabulary it drafts, with a
/// tokenizer of the target's ids (more than the draft's rows: the check is against the vocabulary it maps to).
#[test]
fn a_restricted_draft_is_refused_as_the_target_and_drafts_beside_one() {
    let dir = tempfile::tempdir().unwrap();
    let (m, t) = write_tiny(dir.path());
    let (ms, ts) = (m.to_str().unwrap(), t.to_str().unwrap());
    let (folder, file) = write_restricted(dir.path(), 266);
    let od = dir.path().join("out");
    let od = od.to_str().unwrap();
    for draft in [&folder, &file] {
        let ds = draft.to_str().unwrap();
        let want =
            format!("--target: {ds} is a draft with a restricted output head (it scores 6 of the 266 tokens");
        let runs: [&[&str]; 4] = [
            &["generate", "--target", ds, "--tokenizer", ts, "--prompt", "ab"],
            &[
                "simulate",
                "--target",
                ds,
                "--tokenizer",
                ts,
                "--draft",
                ds,
                "--out",
                od,
            ],
            &[
                "measure",
                "pass-cost",
                "--target",
                ds,
                "--tokenizer",
                ts,
                "--out",
                od,
            ],
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--target",
                ds,
                "--tokenizer",
                ts,
            ],
        ];
        for args in runs {
            let out = multispin(args);
            assert_input_error(&out, &want);
            assert!(out.stdout.is_empty(), "{args:?}");
        }
        let out = multispin(&[
            "generate",
            "--target",
            ms,
            "--tokenizer",
            ts,
            "--draft",
            ds,
            "--prompt",
            "ab",
            "--max-tokens",
            "4",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    // A device drafts with the folder alone: the folder carries no tokenizer, and the error says to pass the
    // target's (it was the missing tokenizer.json's bare "No such file or directory", exit 1).
    let fs = folder.to_str().unwrap();
    let out = multispin(&["device", "--connect", "127.0.0.1:1", "--draft", fs]);
    assert_input_error(&out, "holds no tokenizer.json: pass --tokenizer");
}

/// A draft over another vocabulary than the target's is refused by every command that pairs them, naming
/// `--draft` and both sizes, before any work (`measure` used to load it and go on).
#[test]
fn a_draft_of_another_vocabulary_is_refused_by_every_command_that_pairs_them() {
    let dir = tempfile::tempdir().unwrap();
    let (m, t) = write_tiny(dir.path());
    let (ms, ts) = (m.to_str().unwrap(), t.to_str().unwrap());
    let (_, restricted) = write_restricted(dir.path(), 300);
    let dims = common::Dims {
        dim: 16,
        hidden_dim: 24,
        n_layers: 1,
        n_heads: 2,
        n_kv_heads: 1,
        max_seq_len: CONTEXT,
    };
    let other = common::write_model(dir.path(), "other.bin", 300, &dims, 6);
    let od = dir.path().join("out");
    let od = od.to_str().unwrap();
    for draft in [&other, &restricted] {
        let ds = draft.to_str().unwrap();
        let runs: [&[&str]; 3] = [
            &[
                "generate",
                "--target",
                ms,
                "--tokenizer",
                ts,
                "--draft",
                ds,
                "--prompt",
                "ab",
            ],
            &[
                "simulate",
                "--target",
                ms,
                "--tokenizer",
                ts,
                "--draft",
                ds,
                "--out",
                od,
            ],
            &[
                "measure",
                "pass-cost",
                "--target",
                ms,
                "--tokenizer",
                ts,
                "--draft",
                ds,
                "--out",
                od,
            ],
        ];
        for args in runs {
            let out = multispin(args);
            assert_input_error(&out, "--draft: vocabulary of 300 differs from the target's 266");
            assert!(out.stdout.is_empty(), "{args:?}");
        }
    }
}

/// `serve` tries its trace file and its address before the target loads: a path it cannot create or a port in
/// use is named at once (a target path that does not exist proves the order: a check made after loading would
/// report the target instead).
#[test]
fn serve_names_a_bad_trace_path_or_a_busy_port_before_the_target_loads() {
    let out = multispin(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--trace",
        "/nonexistent/dir/trace.jsonl",
        "--target",
        "/nonexistent/model.bin",
    ]);
    assert_input_error(&out, "--trace: cannot create /nonexistent/dir/trace.jsonl");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = multispin(&["serve", "--listen", &addr, "--target", "/nonexistent/model.bin"]);
    assert_input_error(&out, &format!("--listen: cannot listen on {addr}"));
}
