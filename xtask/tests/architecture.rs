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
fn the_planners_know_nothing_of_serialisation() {
    // Plans, rounds and schemes are printed and read at the edge (multispin's plan_output.rs, spin-scenario's file
    // types); spin-optimize itself serialises nothing, not even for its tests.
    let meta = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata runs");
    let meta: Value = serde_json::from_slice(&meta.stdout).expect("cargo metadata prints JSON");
    let optimize = meta["packages"]
        .as_array()
        .expect("packages array")
        .iter()
        .find(|p| p["name"] == "spin-optimize")
        .expect("spin-optimize is a workspace package");
    let serialising: Vec<&str> = optimize["dependencies"]
        .as_array()
        .expect("dependencies array")
        .iter()
        .filter_map(|d| d["name"].as_str())
        .filter(|d| d.starts_with("serde") || ["postcard", "toml"].contains(d))
        .collect();
    assert!(serialising.is_empty(), "spin-optimize depends on {serialising:?}");
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

#[path = "architecture/module_graph.rs"]
mod module_graph;

/// Every workspace crate's `src` folder, by package name (tests, examples and benches are crates of one file or a
/// few and are not scanned).
fn crate_sources() -> Vec<(String, Vec<module_graph::Source>)> {
    let root = workspace_root();
    let mut dirs: Vec<(String, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        dirs.push((name, entry.path().join("src")));
    }
    dirs.push(("xtask".to_owned(), root.join("xtask/src")));
    dirs.push(("multispin-benches".to_owned(), root.join("benches/src")));
    dirs.sort();
    dirs.into_iter()
        .map(|(name, src)| {
            let sources = rust_files(&src)
                .into_iter()
                .map(|file| {
                    let relative = file
                        .strip_prefix(&src)
                        .unwrap()
                        .to_string_lossy()
                        .replace('\\', "/");
                    module_graph::Source {
                        module: module_graph::module_of(&relative),
                        text: std::fs::read_to_string(&file).unwrap(),
                    }
                })
                .collect();
            (name, sources)
        })
        .collect()
}

/// Import circles that exist today and are being taken apart, each a pair of modules that import each other
/// directly: (crate, module, module). The test ignores the two edges of a listed pair and fails when a listed pair
/// no longer imports both ways, so this list only shrinks; it is to be empty.
const KNOWN_CIRCLES: &[(&str, &str, &str)] = &[];

/// A module path as the reports write it.
fn shown(module: &str) -> &str {
    if module.is_empty() { "crate" } else { module }
}

#[test]
fn no_crate_has_an_import_circle() {
    let mut failures = Vec::new();
    for (krate, sources) in crate_sources() {
        let edges = module_graph::edges(&sources);
        if sources.len() > 2 {
            // A scan that reads nothing would pass vacuously.
            assert!(
                !edges.is_empty(),
                "{krate}: the scan found no edge between its {} modules",
                sources.len()
            );
        }
        let known: Vec<(&str, &str)> = KNOWN_CIRCLES
            .iter()
            .filter(|k| k.0 == krate)
            .map(|k| (k.1, k.2))
            .collect();
        let has = |from: &str, to: &str| edges.iter().any(|e| e.from == from && e.to == to);
        for &(a, b) in &known {
            if !(has(a, b) && has(b, a)) {
                failures.push(format!(
                    "{krate}: {a} <-> {b} no longer import each other: remove the pair from KNOWN_CIRCLES"
                ));
            }
        }
        let rest: Vec<module_graph::Edge> = edges
            .iter()
            .filter(|e| {
                !known
                    .iter()
                    .any(|&(a, b)| (e.from == a && e.to == b) || (e.from == b && e.to == a))
            })
            .cloned()
            .collect();
        for circle in module_graph::circles(&rest) {
            let steps: Vec<String> = circle
                .cycle
                .windows(2)
                .map(|w| {
                    let e = rest
                        .iter()
                        .find(|e| e.from == w[0] && e.to == w[1])
                        .expect("a cycle step is an edge");
                    format!(
                        "  {0} -> {1}: {0}, line {2}, names `{3}`",
                        shown(&e.from),
                        shown(&e.to),
                        e.line,
                        e.path
                    )
                })
                .collect();
            failures.push(format!(
                "{krate}: import circle {} (among {}):\n{}",
                circle
                    .cycle
                    .iter()
                    .map(|m| shown(m))
                    .collect::<Vec<_>>()
                    .join(" -> "),
                circle
                    .modules
                    .iter()
                    .map(|m| shown(m))
                    .collect::<Vec<_>>()
                    .join(", "),
                steps.join("\n")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn sources(files: &[(&str, &str)]) -> Vec<module_graph::Source> {
    files
        .iter()
        .map(|(path, text)| module_graph::Source {
            module: module_graph::module_of(path),
            text: (*text).to_owned(),
        })
        .collect()
}

#[test]
fn the_circle_scan_finds_a_circle_through_three_modules() {
    let crate_files = sources(&[
        ("lib.rs", "//! root\nmod a;\nmod b;\nmod c;\n"),
        ("a.rs", "//! a\nuse crate::b::{self, X};\npub struct Y;\n"),
        (
            "b.rs",
            "//! b\npub struct X;\npub fn f() -> u32 { super::c::g() }\n",
        ),
        ("c.rs", "//! c\npub fn g() -> u32 { let _ = crate::a::Y; 1 }\n"),
    ]);
    let edges = module_graph::edges(&crate_files);
    let circles = module_graph::circles(&edges);
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert_eq!(circles[0].modules, ["a", "b", "c"]);
    assert_eq!(circles[0].cycle, ["a", "b", "c", "a"]);
}

#[test]
fn the_circle_scan_counts_imports_only() {
    let crate_files = sources(&[
        // A re-export is no edge, and a path through it leads to the module that defines the item.
        ("lib.rs", "//! root\nmod a;\nmod b;\nmod m;\npub use a::X;\n"),
        (
            "a.rs",
            "//! a\n// use crate::b::Z;\npub struct X;\nconst S: &str = \"crate::b::Z\";\nconst C: char = '{';\n\
             pub fn f() -> X { crate::X }\n#[cfg(test)]\nmod tests {\n    use super::*;\n    fn t() { let _ = super::f(); }\n}\n",
        ),
        ("b.rs", "//! b\npub struct Z(crate::X);\n"),
        // A folder's mod.rs and its own files are one unit; siblings are not.
        (
            "m/mod.rs",
            "//! m\nmod child;\nmod x;\nmod y;\nuse child::T;\npub struct U(T);\n",
        ),
        (
            "m/child.rs",
            "//! child\npub struct T;\npub fn u(_: super::U) {}\n",
        ),
        (
            "m/x.rs",
            "//! x\npub struct P;\npub fn q() -> super::y::Q { super::y::Q }\n",
        ),
        ("m/y.rs", "//! y\nuse super::x::P;\npub struct Q;\n"),
    ]);
    let edges = module_graph::edges(&crate_files);
    let pairs: BTreeSet<(String, String)> = edges.iter().map(|e| (e.from.clone(), e.to.clone())).collect();
    let want: BTreeSet<(String, String)> =
        [("b", "a"), ("m::child", "m"), ("m::x", "m::y"), ("m::y", "m::x")]
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect();
    assert_eq!(pairs, want);
    let circles = module_graph::circles(&edges);
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert_eq!(circles[0].cycle, ["m::x", "m::y", "m::x"]);
}
