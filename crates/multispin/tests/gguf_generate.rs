//! `multispin generate` on tiny random GGUF models carrying their own byte-level vocabulary, written to a
//! temporary folder: BOS as the file's metadata says, `--chat` through the file's template, the sampling flags
//! and `--threads`, the quantised host route's greedy text equal to the speculative loop's.

use spin_runtime::gguf::{self, GgmlDType, GgufVocab, WriteOptions};
use spin_runtime::{Config, RopeStyle, model};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// GPT-2's byte-level alphabet: the character standing for each byte.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut extra = 0;
    let mut map = vec!['\0'; 256];
    for b in 0..256u32 {
        if printable.contains(&b) {
            map[b as usize] = char::from_u32(b).unwrap();
        } else {
            map[b as usize] = char::from_u32(256 + extra).unwrap();
            extra += 1;
            printable.push(b);
        }
    }
    map
}

/// Three control tokens (ids 0, 1, 2: `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`), the 256 byte tokens and
/// a few merges; BOS 1, EOS 2 (SmolLM2's layout).
fn vocab(add_bos: Option<bool>, pre: &str, template: Option<&str>) -> GgufVocab {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    tokens.extend(byte_chars().iter().map(|c| c.to_string()));
    let merges = vec!["a b".to_string(), "Ġ a".to_string()];
    tokens.extend(["ab".to_string(), "Ġa".to_string()]);
    let mut token_types = vec![3, 3, 3];
    token_types.resize(tokens.len(), 1);
    GgufVocab {
        tokens,
        token_types,
        merges,
        bos: Some(1),
        eos: Some(2),
        add_bos,
        pre: Some(pre.into()),
        chat_template: template.map(str::to_string),
    }
}

const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n\
                        {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn write(dir: &Path, name: &str, v: &GgufVocab, dtype: GgmlDType) -> PathBuf {
    let cfg = Config {
        vocab_size: v.tokens.len(),
        dim: 64,
        hidden_dim: 128,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        max_seq_len: 128,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: RopeStyle::Interleaved,
        qkv_bias: false,
        tied_embeddings: true,
    };
    let w = model::random_tensors(&cfg, 0.25, 7, &spin_runtime::select_device().unwrap()).unwrap();
    let path = dir.join(name);
    let opts = WriteOptions {
        head_vocab: None,
        dtype,
        overrides: &[],
        vocab: Some(v),
    };
    gguf::write_with(&path, &cfg, &w, &opts).unwrap();
    path
}

fn multispin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_multispin"))
        .args(args)
        .output()
        .unwrap()
}

/// The prompt token ids `--verbose-prompt` lists on stderr.
fn prompt_ids(out: &Output) -> Vec<u32> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| l.split_once(" -> ").and_then(|(id, _)| id.trim().parse().ok()))
        .collect()
}

fn ok(out: &Output) -> &Output {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn bos_follows_the_file_metadata_and_llama_cpp_defaults() {
    let dir = tempfile::tempdir().unwrap();
    // 'a' is byte 97: token 3 + 97 = 100 (no merge applies to a lone "a").
    let a = 100;
    for (add_bos, pre, want_bos) in [
        (Some(false), "smollm", false),
        (Some(true), "smollm", true),
        (None, "smollm", false),   // llama.cpp: byte-level BPE starts without BOS…
        (None, "llama-bpe", true), // …except for the Llama 3 family
    ] {
        let m = write(dir.path(), "m.gguf", &vocab(add_bos, pre, None), GgmlDType::Q8_0);
        let out = multispin(&[
            "generate",
            "--target",
            m.to_str().unwrap(),
            "--prompt",
            "a",
            "--max-tokens",
            "2",
            "--verbose-prompt",
        ]);
        let ids = prompt_ids(ok(&out));
        let want = if want_bos { vec![1, a] } else { vec![a] };
        assert_eq!(ids, want, "add_bos {add_bos:?}, pre {pre}");
    }
}

#[test]
fn chat_renders_the_file_template_with_special_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "chat.gguf",
        &vocab(Some(false), "smollm", Some(TEMPLATE)),
        GgmlDType::Q4_0,
    );
    let m = m.to_str().unwrap();
    let out = multispin(&[
        "generate",
        "--target",
        m,
        "--prompt",
        "a",
        "--chat",
        "--max-tokens",
        "3",
        "--verbose-prompt",
    ]);
    let ids = prompt_ids(ok(&out));
    // <|im_start|> "user" \n "a" <|im_end|> \n <|im_start|> "assistant" \n: control tokens matched whole.
    let byte = |c: u8| 3 + u32::from(c);
    let mut want = vec![1];
    want.extend(b"user\n".iter().map(|&c| byte(c)));
    want.extend([byte(b'a'), 2, byte(b'\n'), 1]);
    want.extend(b"assistant\n".iter().map(|&c| byte(c)));
    assert_eq!(ids, want);
    // A file without a template: a clear input error.
    let plain = write(
        dir.path(),
        "plain.gguf",
        &vocab(Some(false), "smollm", None),
        GgmlDType::Q4_0,
    );
    let out = multispin(&[
        "generate",
        "--target",
        plain.to_str().unwrap(),
        "--prompt",
        "a",
        "--chat",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--chat: the model file has no chat template"));
}

#[test]
fn sampling_flags_threads_and_the_host_route() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "m.gguf",
        &vocab(Some(false), "smollm", None),
        GgmlDType::Q4_1,
    );
    let m = m.to_str().unwrap();
    let base = [
        "generate",
        "--target",
        m,
        "--prompt",
        "ab a",
        "--max-tokens",
        "20",
    ];
    // Greedy: plain decoding and the speculative loop give the same text, on 1 and 2 threads.
    let plain = ok(&multispin(&base)).stdout.clone();
    for threads in ["1", "2"] {
        let mut args = base.to_vec();
        args.extend([
            "--threads",
            threads,
            "--self-draft-layers",
            "1",
            "--draft-len",
            "4",
        ]);
        assert_eq!(ok(&multispin(&args)).stdout, plain, "--threads {threads}");
    }
    // Sampling with every cut runs; the same seed gives the same text; top-k 1 is greedy.
    let mut s = base.to_vec();
    s.extend([
        "--temperature",
        "0.8",
        "--top-k",
        "40",
        "--top-p",
        "0.9",
        "--min-p",
        "0.05",
        "--seed",
        "3",
    ]);
    let first = ok(&multispin(&s)).stdout.clone();
    assert_eq!(ok(&multispin(&s)).stdout, first);
    let mut k1 = base.to_vec();
    k1.extend(["--temperature", "1.5", "--top-k", "1"]);
    assert_eq!(ok(&multispin(&k1)).stdout, plain);
    // Bad values name their flag and exit 2.
    for (flag, value) in [
        ("--top-k", "0"),
        ("--top-p", "0"),
        ("--top-p", "1.5"),
        ("--min-p", "-0.1"),
        ("--threads", "0"),
    ] {
        let mut args = base.to_vec();
        args.extend([flag, value]);
        let out = multispin(&args);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(flag),
            "{flag} {value}"
        );
    }
}

/// `--prompts FILE` decodes every line in one batch per step: the output is each prompt's own run, in order,
/// greedy and sampled (the same seed per prompt); a file with no line is an input error.
#[test]
fn batched_prompts_equal_one_by_one_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "m.gguf",
        &vocab(Some(true), "smollm", None),
        GgmlDType::Q8_0,
    );
    let m = m.to_str().unwrap();
    let lines = ["ab a", "b", "a ab ba ab"];
    let file = dir.path().join("prompts.txt");
    std::fs::write(&file, lines.join("\n")).unwrap();
    for extra in [
        &[][..],
        &["--temperature", "0.9", "--top-p", "0.95", "--seed", "4"][..],
    ] {
        let mut batch = vec![
            "generate",
            "--target",
            m,
            "--max-tokens",
            "12",
            "--prompts",
            file.to_str().unwrap(),
        ];
        batch.extend_from_slice(extra);
        let got = ok(&multispin(&batch)).stdout.clone();
        let mut want = Vec::new();
        for l in lines {
            let mut one = vec!["generate", "--target", m, "--max-tokens", "12", "--prompt", l];
            one.extend_from_slice(extra);
            want.extend(ok(&multispin(&one)).stdout.clone());
        }
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want),
            "{extra:?}"
        );
    }
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let out = multispin(&["generate", "--target", m, "--prompts", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--prompts"));
}
