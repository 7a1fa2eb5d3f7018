//! `multispin simulate`, `serve` and `device` end to end on tiny random-weight llama2.c models written to a
//! temporary folder: the greedy text of every device equals `multispin generate`'s, the outputs are written, and
//! bad input exits with status 2.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Writes a tokenizer and two models (target 3 layers, draft 1 layer) sharing it.
fn write_tiny(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (tok, t) = common::write_tokenizer(dir);
    let dims = |n_layers| common::Dims {
        dim: 32,
        hidden_dim: 48,
        n_layers,
        n_heads: 4,
        n_kv_heads: 2,
        max_seq_len: 128,
    };
    let target = common::write_model(dir, "target.bin", tok.vocab_size(), &dims(3), 11);
    let draft = common::write_model(dir, "draft.bin", tok.vocab_size(), &dims(1), 12);
    (target, draft, t)
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_multispin"))
}

fn generate(target: &Path, draft: &Path, tok: &Path, prompt: &str) -> String {
    let out = bin()
        .args(["generate", "--max-tokens", "16", "--prompt", prompt])
        .arg("--target")
        .arg(target)
        .arg("--draft")
        .arg(draft)
        .arg("--tokenizer")
        .arg(tok)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .trim_end_matches('\n')
        .to_owned()
}

const PROMPTS: [&str; 3] = ["ab", "c a", "bc bc"];

/// `--sweep-devices 1,2` runs the comparison once per K into K1/ and K2/ and joins their Fig. 6 rows.
#[test]
fn a_device_sweep_joins_the_fig6_rows_of_every_k() {
    let dir = tempfile::tempdir().unwrap();
    let (target, draft, tok) = write_tiny(dir.path());
    let out_dir = dir.path().join("out");
    let out = bin()
        .args([
            "simulate",
            "--sweep-devices",
            "1,2",
            "--max-tokens",
            "8",
            "--compare",
            "plain,cen-spin",
        ])
        .arg("--target")
        .arg(&target)
        .arg("--draft")
        .arg(&draft)
        .arg("--tokenizer")
        .arg(&tok)
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let csv = std::fs::read_to_string(out_dir.join("fig6.csv")).unwrap();
    let rows: Vec<(&str, &str)> = csv
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0], f[1])
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("1", "best"),
            ("1", "plain"),
            ("1", "cen-spin"),
            ("2", "best"),
            ("2", "plain"),
            ("2", "cen-spin")
        ]
    );
    for f in ["fig6-sweep.svg", "K1/fig6.svg", "K2/summary-plain.json"] {
        assert!(out_dir.join(f).is_file(), "{f}");
    }
}

/// `multispin generate` without a draft: plain greedy decoding of `prompt`.
fn generate_plain(target: &Path, tok: &Path, prompt: &str) -> String {
    let out = bin()
        .args(["generate", "--max-tokens", "16", "--prompt", prompt])
        .arg("--target")
        .arg(target)
        .arg("--tokenizer")
        .arg(tok)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .trim_end_matches('\n')
        .to_owned()
}

/// Paper A's baselines in `--compare` (measured compute, so the devices draft one at a time): Cen-SPIN, P2P-SPIN
/// and plain decoding each give every device the text of plain greedy decoding, and fig6.csv / fig6.svg set each
/// scheme beside the first, with a prediction for every scheme but plain decoding.
#[test]
fn compare_runs_paper_a_baselines_whose_texts_equal_plain_greedy_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let (target, draft, tok) = write_tiny(dir.path());
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(&prompts, PROMPTS.join("\n")).unwrap();
    let out_dir = dir.path().join("out");
    let out = bin()
        .args([
            "simulate",
            "--devices",
            "3",
            "--max-tokens",
            "16",
            "--scheme",
            "exact",
            "--compute",
            "measured",
            "--compare",
            "cen-spin,p2p-spin,plain",
        ])
        .arg("--target")
        .arg(&target)
        .arg("--draft")
        .arg(&draft)
        .arg("--tokenizer")
        .arg(&tok)
        .arg("--prompts")
        .arg(&prompts)
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("Fig. 6 (K = 3)"), "{stdout}");
    let want: Vec<String> = PROMPTS.iter().map(|p| generate_plain(&target, &tok, p)).collect();
    for s in ["exact", "cen-spin", "p2p-spin", "plain"] {
        let summary: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out_dir.join(format!("summary-{s}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(summary["tokens"], 48, "{s}");
        assert!(summary["goodput"].as_f64().unwrap() > 0.0, "{s}");
        for (k, w) in want.iter().enumerate() {
            assert_eq!(&summary["texts"][k], w, "{s}: device {k}");
        }
        let trace = std::fs::read_to_string(out_dir.join(format!("trace-{s}.jsonl"))).unwrap();
        assert_eq!(
            trace.lines().count() as u64,
            summary["rounds"].as_u64().unwrap(),
            "{s}"
        );
        for line in trace.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["scheme"], s);
        }
    }
    let fig6 = std::fs::read_to_string(out_dir.join("fig6.csv")).unwrap();
    let rows: Vec<Vec<&str>> = fig6.lines().skip(1).map(|l| l.split(',').collect()).collect();
    let names: Vec<&str> = rows.iter().map(|r| r[1]).collect();
    assert_eq!(names, ["exact", "cen-spin", "p2p-spin", "plain"]);
    assert!(rows.iter().all(|r| r[0] == "3"));
    assert_eq!(
        rows[0][4].parse::<f64>().unwrap(),
        1.0,
        "the first scheme over itself"
    );
    for r in &rows {
        let predicted: f64 = r[3].parse().unwrap();
        assert_eq!(predicted.is_nan(), r[1] == "plain", "{r:?}");
    }
    assert!(out_dir.join("fig6.svg").is_file());
    // The prediction check covers the planner only.
    let check = std::fs::read_to_string(out_dir.join("prediction.csv")).unwrap();
    assert_eq!(check.lines().count(), 2, "{check}");
}

#[test]
fn simulate_writes_its_outputs_and_each_device_text_equals_generate() {
    let dir = tempfile::tempdir().unwrap();
    let (target, draft, tok) = write_tiny(dir.path());
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(&prompts, PROMPTS.join("\n")).unwrap();
    let out_dir = dir.path().join("out");
    let out = bin()
        .args([
            "simulate",
            "--devices",
            "3",
            "--max-tokens",
            "16",
            "--compare",
            "exact,fixed,unified",
        ])
        .arg("--target")
        .arg(&target)
        .arg("--draft")
        .arg(&draft)
        .arg("--tokenizer")
        .arg(&tok)
        .arg("--prompts")
        .arg(&prompts)
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let schemes = ["best", "exact", "fixed", "unified"];
    for s in schemes {
        assert!(
            stdout.lines().any(|l| l.starts_with(s)),
            "{s} missing from\n{stdout}"
        );
        let summary: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out_dir.join(format!("summary-{s}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(summary["tokens"], 48, "{s}");
        for (k, p) in PROMPTS.iter().enumerate() {
            assert_eq!(
                summary["texts"][k],
                generate(&target, &draft, &tok, p),
                "{s}: device {k}"
            );
        }
        let trace = std::fs::read_to_string(out_dir.join(format!("trace-{s}.jsonl"))).unwrap();
        let rounds = summary["rounds"].as_u64().unwrap() as usize;
        assert_eq!(trace.lines().count(), rounds);
        for line in trace.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert!(v["devices"].as_array().is_some_and(|d| !d.is_empty()));
            assert_eq!(v["scheme"], s, "every trace line names its scheme");
        }
        assert!(out_dir.join(format!("rounds-{s}.csv")).is_file());
    }
    for f in [
        "summary.csv",
        "goodput.svg",
        "latency.svg",
        "prediction.csv",
        "prediction.svg",
    ] {
        assert!(out_dir.join(f).is_file(), "{f}");
    }
    // One prediction-check row per scheme, in run order, measured goodput as in the summary.
    let check = std::fs::read_to_string(out_dir.join("prediction.csv")).unwrap();
    let rows: Vec<&str> = check.lines().skip(1).collect();
    assert_eq!(rows.len(), schemes.len(), "{check}");
    for (row, s) in rows.iter().zip(schemes) {
        let cols: Vec<&str> = row.split(',').collect();
        assert_eq!(cols[0], s);
        let summary: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out_dir.join(format!("summary-{s}.json"))).unwrap(),
        )
        .unwrap();
        let measured: f64 = cols[1].parse().unwrap();
        assert_eq!(measured, summary["goodput"].as_f64().unwrap(), "{s}");
    }
}

#[test]
fn serve_and_device_processes_produce_the_generate_text() {
    let dir = tempfile::tempdir().unwrap();
    let (target, draft, tok) = write_tiny(dir.path());
    let mut server = bin()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--devices",
            "2",
            "--max-tokens",
            "16",
            "--scheme",
            "greedy",
        ])
        .arg("--target")
        .arg(&target)
        .arg("--tokenizer")
        .arg(&tok)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_owned();
    let devices: Vec<_> = PROMPTS[..2]
        .iter()
        .map(|p| {
            bin()
                .args(["device", "--connect", &addr, "--prompt", p])
                .arg("--draft")
                .arg(&draft)
                .arg("--tokenizer")
                .arg(&tok)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (d, p) in devices.into_iter().zip(PROMPTS) {
        let out = d.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(text.trim_end_matches('\n'), generate(&target, &draft, &tok, p));
    }
    let status = server.wait().unwrap();
    assert!(status.success());
}

/// `multispin device` with a restricted-head draft folder (a compact vocabulary of its own, which carries no
/// tokenizer: `--tokenizer` gives the target's) quantised at load (`--draft-format q8_0`) joins a server of the
/// full vocabulary, and its text is the target's plain greedy text.
#[test]
fn a_device_with_a_restricted_head_draft_quantised_at_load_joins_and_prints_plain_greedy_text() {
    use spin_runtime::head_vocab::HeadVocab;
    let dir = tempfile::tempdir().unwrap();
    let (target, _, tok) = write_tiny(dir.path());
    let vocab = common::write_tokenizer(dir.path()).0.vocab_size();
    let head: Vec<u32> = (0..vocab as u32).step_by(2).collect();
    let hv = HeadVocab::new(head, vocab).unwrap();
    let cfg = spin_runtime::Config {
        vocab_size: hv.compact_vocab(),
        dim: 32,
        hidden_dim: 64,
        n_layers: 1,
        n_heads: 4,
        n_kv_heads: 2,
        max_seq_len: 128,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: spin_runtime::RopeStyle::Halves,
        qkv_bias: false,
        tied_embeddings: true,
    };
    let device = spin_runtime::select_device().unwrap();
    let w = spin_runtime::model::random_tensors(&cfg, 0.3, 5, &device).unwrap();
    let draft = dir.path().join("draft-head");
    spin_runtime::hf::write_draft_dir(&draft, &cfg, &w, &hv).unwrap();
    let mut server = bin()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--devices",
            "1",
            "--max-tokens",
            "16",
        ])
        .arg("--target")
        .arg(&target)
        .arg("--tokenizer")
        .arg(&tok)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_owned();
    let out = bin()
        .args([
            "device",
            "--connect",
            &addr,
            "--prompt",
            PROMPTS[1],
            "--draft-format",
            "q8_0",
        ])
        .arg("--draft")
        .arg(&draft)
        .arg("--tokenizer")
        .arg(&tok)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text.trim_end_matches('\n'),
        generate_plain(&target, &tok, PROMPTS[1])
    );
    assert!(server.wait().unwrap().success());
}

#[test]
fn bad_input_exits_with_status_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let (target, draft, tok) = write_tiny(dir.path());
    for (args, field) in [
        (vec!["--scheme", "nope"], "scheme:"),
        (vec!["--devices", "0"], "devices:"),
        (vec!["--q-bits", "30"], "q_bits:"),
        (vec!["--bandwidth-hz=-1"], "bandwidth_hz:"),
        (vec!["--modes", "sideways"], "modes:"),
        (vec!["--compare", "exact,cen"], "compare:"),
        (vec!["--scheme", "cen-spin"], "scheme:"),
    ] {
        let out = bin()
            .arg("simulate")
            .args(&args)
            .arg("--target")
            .arg(&target)
            .arg("--draft")
            .arg(&draft)
            .arg("--tokenizer")
            .arg(&tok)
            .arg("--out")
            .arg(dir.path().join("o"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.starts_with(&format!("error: {field}")), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    // Self-drafting with more layers than the target has (3) names the flag.
    let out = bin()
        .args(["simulate", "--self-draft-layers", "9"])
        .arg("--target")
        .arg(&target)
        .arg("--tokenizer")
        .arg(&tok)
        .arg("--out")
        .arg(dir.path().join("o"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.starts_with("error: self_draft_layers: 9 is outside 1..=3"),
        "{err}"
    );
    // A device that cannot reach a server fails with status 1 and one line.
    let out = bin()
        .args(["device", "--connect", "127.0.0.1:1"])
        .arg("--draft")
        .arg(&draft)
        .arg("--tokenizer")
        .arg(&tok)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

/// A proxy on 127.0.0.1 forwarding to `server` that cuts its first connection once `cut_after` bytes went to the
/// client (later connections pass through); returns its address.
fn cutting_proxy(server: String, cut_after: usize) -> String {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for (i, dev) in l.incoming().enumerate() {
            let Ok(mut dev) = dev else { return };
            let mut up = std::net::TcpStream::connect(&server).unwrap();
            let (mut dev_r, mut up_w) = (dev.try_clone().unwrap(), up.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut dev_r, &mut up_w);
                let _ = up_w.shutdown(std::net::Shutdown::Both);
            });
            std::thread::spawn(move || {
                let mut buf = [0u8; 256];
                let mut sent = 0;
                loop {
                    let n = match up.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if dev.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    sent += n;
                    if i == 0 && sent >= cut_after {
                        break;
                    }
                }
                let _ = dev.shutdown(std::net::Shutdown::Both);
                let _ = up.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    addr
}

/// `multispin device` over TLS with an admission token, its connection cut mid-run by a proxy: it reconnects,
/// resumes, and prints the text of the run without the fault (issue 22: it used to exit 1 with "server shut down").
#[test]
fn a_tls_device_whose_connection_is_cut_resumes_and_prints_the_generate_text() {
    let dir = tempfile::tempdir().unwrap();
    let (target, draft, tok) = write_tiny(dir.path());
    let tls = dir.path().join("tls");
    let out = bin().args(["gen-cert", "--out"]).arg(&tls).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, "# devices\nthe-device-token-0123456789\n").unwrap();
    let mut server = bin()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--max-tokens",
            "16",
            "--scheme",
            "greedy",
        ])
        .arg("--target")
        .arg(&target)
        .arg("--tokenizer")
        .arg(&tok)
        .arg("--tls-cert")
        .arg(tls.join("cert.pem"))
        .arg("--tls-key")
        .arg(tls.join("key.pem"))
        .arg("--tokens")
        .arg(&tokens)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_owned();
    // Past the TLS handshake (about 1 kB from the server) and into the rounds.
    let proxy = cutting_proxy(addr, 1600);
    let token = dir.path().join("token.txt");
    std::fs::write(&token, "the-device-token-0123456789\n").unwrap();
    let out = bin()
        .args([
            "device",
            "--connect",
            &proxy,
            "--prompt",
            PROMPTS[0],
            "--server-name",
            "localhost",
        ])
        .arg("--tls-ca")
        .arg(tls.join("cert.pem"))
        .arg("--token-file")
        .arg(&token)
        .arg("--draft")
        .arg(&draft)
        .arg("--tokenizer")
        .arg(&tok)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("resumed the session"),
        "the connection was cut: {stderr}"
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text.trim_end_matches('\n'),
        generate(&target, &draft, &tok, PROMPTS[0])
    );
    assert!(server.wait().unwrap().success());
}

/// Paper A's baselines on real models: SmolLM2-135M-Instruct (Q4_1) with its distilled draft
/// (scripts/build-smollm2-draft.sh), both from the cache ($MULTISPIN_CACHE, default ~/.cache/multispin), two devices
/// and four tokens each: every baseline runs and gives each device the text of plain decoding. Skips, saying so on
/// the uncaptured stderr, when either file is absent.
#[test]
fn smollm2_with_its_distilled_draft_runs_every_baseline_with_plain_decodings_text() {
    use std::io::Write as _;
    let name = "smollm2_with_its_distilled_draft_runs_every_baseline_with_plain_decodings_text";
    let cache = std::env::var_os("MULTISPIN_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/multispin")));
    let files = cache.map(|c| (c.join("SmolLM2-135M-Instruct.Q4_1.gguf"), c.join("smollm2-draft")));
    let Some((target, draft)) = files.filter(|(t, d)| t.is_file() && d.exists()) else {
        let _ = std::io::stderr().write_all(
            format!(
                "real-model test {name}: skipped (SmolLM2-135M-Instruct.Q4_1.gguf or smollm2-draft absent from the cache)\n"
            )
            .as_bytes(),
        );
        return;
    };
    // One write of the whole line (`.ci/run` counts these lines; one written in pieces interleaves with others).
    let _ = std::io::stderr().write_all(format!("real-model test {name}: ran\n").as_bytes());
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let out = bin()
        .args([
            "simulate",
            "--devices",
            "2",
            "--max-tokens",
            "4",
            "--compare",
            "cen-spin,p2p-spin,plain",
        ])
        .arg("--target")
        .arg(&target)
        .arg("--draft")
        .arg(&draft)
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let texts = |s: &str| -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out_dir.join(format!("summary-{s}.json"))).unwrap(),
        )
        .unwrap();
        v["texts"].clone()
    };
    let plain = texts("plain");
    for s in ["best", "cen-spin", "p2p-spin"] {
        assert_eq!(texts(s), plain, "{s}");
    }
}
