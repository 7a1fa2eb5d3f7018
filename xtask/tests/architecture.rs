//! Architecture invariants of ARCHITECTURE.md, checked against `cargo metadata` and the source tree.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace root")
        .to_path_buf()
}

/// Package name → the names of its normal (non-dev, non-build) dependencies.
fn normal_dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let meta: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let mut graph = BTreeMap::new();
    for package in meta["packages"].as_array().expect("packages array") {
        let deps = package["dependencies"]
            .as_array()
            .expect("dependencies array")
            .iter()
            .filter(|d| d["kind"].is_null())
            .map(|d| d["name"].as_str().expect("dependency name").to_owned())
            .collect();
        graph.insert(package["name"].as_str().expect("package name").to_owned(), deps);
    }
    graph
}

const OURS: [&str; 9] = [
    "spin-core",
    "spin-channel",
    "spin-optimize",
    "spin-scenario",
    "spin-runtime",
    "spin-net",
    "multispin",
    "xtask",
    "multispin-benches",
];

/// The workspace edges we allow (normal dependencies only; dev-dependencies of benches are free).
fn allowed(from: &str) -> &'static [&'static str] {
    match from {
        "spin-core" | "spin-channel" => &[],
        "spin-optimize" => &["spin-core", "spin-channel"],
        "spin-scenario" => &["spin-core", "spin-channel", "spin-optimize"],
        "spin-runtime" => &["spin-core"],
        "spin-net" => &["spin-runtime", "spin-optimize", "spin-core", "spin-channel"],
        "multispin" => &[
            "spin-core",
            "spin-channel",
            "spin-optimize",
            "spin-scenario",
            "spin-runtime",
            "spin-net",
        ],
        "xtask" => &["spin-core", "spin-channel", "spin-optimize", "spin-scenario"],
        _ => &[],
    }
}

#[test]
fn workspace_edges_point_down_only() {
    let graph = normal_dependencies();
    for name in OURS {
        let deps = graph
            .get(name)
            .unwrap_or_else(|| panic!("workspace package {name} is missing"));
        for dep in deps.iter().filter(|d| OURS.contains(&d.as_str())) {
            assert!(
                allowed(name).contains(&dep.as_str()),
                "{name} must not depend on {dep}"
            );
        }
    }
}

#[test]
fn only_spin_runtime_owns_candle_and_cuda() {
    let graph = normal_dependencies();
    for (name, deps) in &graph {
        let candle: Vec<_> = deps
            .iter()
            .filter(|d| d.starts_with("candle") || *d == "tokenizers")
            .collect();
        if name != "spin-runtime" {
            assert!(
                candle.is_empty(),
                "{name} depends on {candle:?}; only spin-runtime may"
            );
        }
        assert!(
            !deps.contains("tokio") || name == "spin-net",
            "{name} depends on tokio; only spin-net may"
        );
    }
    let manifest = std::fs::read_to_string(workspace_root().join("crates/spin-runtime/Cargo.toml")).unwrap();
    assert!(
        manifest.contains("default = []"),
        "the cuda feature must stay off by default"
    );
}

#[test]
fn leaf_crates_do_no_io() {
    for krate in ["spin-core", "spin-channel", "spin-optimize", "spin-scenario"] {
        for file in rust_files(&workspace_root().join("crates").join(krate).join("src")) {
            let text = std::fs::read_to_string(&file).unwrap();
            for banned in ["std::fs", "std::net", "std::process", "tokio", "candle"] {
                assert!(
                    !text.contains(banned),
                    "{} uses {banned}; IO belongs to the binaries",
                    file.display()
                );
            }
        }
    }
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path
                    .file_name()
                    .is_some_and(|n| n != "target" && !n.to_string_lossy().starts_with('.'))
                {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn every_file_says_why_it_exists_and_nothing_is_left_unfinished() {
    let root = workspace_root();
    let mut files = Vec::new();
    for dir in ["crates", "xtask", "benches"] {
        files.extend(rust_files(&root.join(dir)));
    }
    assert!(files.len() > 20, "found only {} Rust files", files.len());
    // Split so that this file does not match itself.
    let banned = [
        concat!("#[", "ignore"),
        concat!("should", "_panic"),
        concat!("todo", "!("),
        concat!("dbg", "!("),
    ];
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let rel = file.strip_prefix(&root).unwrap().display().to_string();
        assert!(
            text.starts_with("//!"),
            "{rel} must open with a `//!` line saying why it exists"
        );
        for b in banned {
            assert!(!text.contains(b), "{rel} contains {b}");
        }
    }
}

/// The one module allowed to hold `unsafe` kernels (ARCHITECTURE.md, "the only module with unsafe").
const UNSAFE_KERNELS: &str = "crates/spin-runtime/src/quant/simd.rs";

#[test]
fn only_the_simd_kernels_module_allows_unsafe_code_and_it_argues_every_block() {
    let root = workspace_root();
    let inner = concat!("#![allow(", "unsafe_code)]");
    for dir in ["crates", "xtask", "benches"] {
        for file in rust_files(&root.join(dir)) {
            let rel = file.strip_prefix(&root).unwrap().display().to_string();
            let text = std::fs::read_to_string(&file).unwrap();
            assert!(
                !text.contains(inner) || rel == UNSAFE_KERNELS,
                "{rel} allows unsafe code module-wide; only {UNSAFE_KERNELS} may"
            );
        }
    }
    let text = std::fs::read_to_string(root.join(UNSAFE_KERNELS)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = 0;
    for (k, line) in lines.iter().enumerate() {
        if line.contains(concat!("unsafe", " {")) {
            blocks += 1;
            let argued = lines[k.saturating_sub(4)..k]
                .iter()
                .chain(std::iter::once(line))
                .any(|l| l.contains("// SAFETY:"));
            assert!(
                argued,
                "{UNSAFE_KERNELS}:{}: an unsafe block without a `// SAFETY:` argument",
                k + 1
            );
        }
    }
    assert!(
        blocks > 0,
        "{UNSAFE_KERNELS} has no unsafe block: drop its allow instead"
    );
}
