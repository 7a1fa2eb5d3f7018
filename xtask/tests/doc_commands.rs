//! Every shell command the README and docs/*.md show runs as written: the fenced command blocks are extracted, each
//! block runs as one script (in order, `set -e`) with a time bound, in a scratch folder that sees the repository's
//! `models/` and `scenarios/`; `cargo run … -p multispin --` and a bare `multispin` run the built binary, `cargo
//! xtask` runs this package's binary. Commands that need files outside the repository, the network, or minutes
//! of a release build (the paper-scale reproduction, the test command itself, benches) are skipped with a notice
//! naming them. New commands in the docs are picked up without changing this test.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Per-command share of a block's time bound (debug build, loaded 2-core machine).
const PER_COMMAND: Duration = Duration::from_secs(60);

/// One fenced command block: where it is and its commands (continuation lines joined, comments dropped).
#[derive(Debug)]
struct Block {
    place: String,
    commands: Vec<String>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Starts a command line that this test knows how to run (or to skip by name).
fn is_command(line: &str) -> bool {
    ["multispin ", "cargo ", "scripts/", "./", "MULTISPIN_"]
        .iter()
        .any(|p| line.starts_with(p))
}

/// The line without a trailing `# comment` (a `#` after whitespace, outside quotes).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let mut prev_space = true;
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev_space => return line[..i].trim_end(),
            _ => {}
        }
        prev_space = c.is_whitespace();
    }
    line.trim_end()
}

/// The command blocks of one Markdown text: fences tagged sh/bash/shell, and untagged fences whose first line is a
/// command.
fn blocks(file: &str, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let Some(tag) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let tag = tag.trim().to_owned();
        let mut body = Vec::new();
        for (_, l) in lines.by_ref() {
            if l.trim_start().starts_with("```") {
                break;
            }
            body.push(l);
        }
        let first = body.iter().find(|l| !l.trim().is_empty()).map(|l| l.trim_start());
        let shell = matches!(tag.as_str(), "sh" | "bash" | "shell")
            || (tag.is_empty() && first.is_some_and(is_command));
        if !shell {
            continue;
        }
        let mut commands = Vec::new();
        let mut current = String::new();
        for l in body {
            let l = strip_comment(l.trim());
            if l.is_empty() && current.is_empty() {
                continue;
            }
            match l.strip_suffix('\\') {
                Some(head) => {
                    current.push_str(head.trim_end());
                    current.push(' ');
                }
                None => {
                    current.push_str(l);
                    commands.push(std::mem::take(&mut current).trim().to_owned());
                }
            }
        }
        if !current.trim().is_empty() {
            commands.push(current.trim().to_owned());
        }
        commands.retain(|c| !c.is_empty());
        if !commands.is_empty() {
            out.push(Block {
                place: format!("{file}:{}", i + 1),
                commands,
            });
        }
    }
    out
}

/// Why a command is not run here, or `None` to run it.
fn skip_reason(c: &str) -> Option<&'static str> {
    if c.starts_with("sleep ") {
        return None;
    }
    let outside = [
        "~/",
        "$HOME",
        "$MULTISPIN_SHARED_DATA",
        "MULTISPIN_SHARED_DATA=",
        "/path/to",
        "$MULTISPIN_CACHE",
    ];
    if outside.iter().any(|p| c.contains(p)) {
        return Some("needs files outside the repository");
    }
    if c.starts_with("scripts/") || c.starts_with("./") {
        return Some("a script (downloads or long benchmarks)");
    }
    if c.starts_with("cargo xtask reproduce") && !c.contains("--quick") {
        return Some(
            "the paper-scale reproduction (about 30 s in release, minutes to build); the xtask snapshot tests cover its outputs",
        );
    }
    if c.starts_with("cargo fmt")
        || c.starts_with("cargo clippy")
        || c.starts_with("cargo test")
        || c.starts_with("cargo doc")
    {
        return Some("the test command itself");
    }
    if c.starts_with("cargo bench") || c.starts_with("cargo build") {
        return Some("a release build or benchmark");
    }
    let max_tokens = c
        .split_whitespace()
        .skip_while(|w| *w != "--max-tokens")
        .nth(1)
        .and_then(|n| n.parse::<u32>().ok());
    if max_tokens.is_some_and(|n| n > 64) {
        return Some("a long measurement run (more than 64 tokens per device; a release-build measurement)");
    }
    if c.starts_with("cargo xtask distill") && !c.contains("--help") {
        return Some("training (minutes)");
    }
    if c.starts_with("cargo") && !c.starts_with("cargo run") && !c.starts_with("cargo xtask") {
        return Some("a cargo command other than run");
    }
    if c.starts_with("cargo run") && !c.contains("-p multispin") {
        return Some("a cargo run of another package (a release build)");
    }
    None
}

/// The command with `cargo run [--release] -p multispin --`, a bare `multispin` and `cargo xtask` replaced by the
/// built binaries.
fn substitute(c: &str, multispin: &Path, xtask: &Path) -> String {
    let m = multispin.display().to_string();
    let x = xtask.display().to_string();
    let mut out = c.to_owned();
    for pattern in ["cargo run --release -p multispin --", "cargo run -p multispin --"] {
        out = out.replace(pattern, &m);
    }
    // A bare `multispin` at the start of a command (after `&&`, `;`, `&` or a pipe too).
    let mut rebuilt = String::new();
    for (i, word) in out.split(' ').enumerate() {
        if i > 0 {
            rebuilt.push(' ');
        }
        let starts = i == 0 || rebuilt.trim_end().ends_with(['&', ';', '|']);
        if word == "multispin" && starts {
            rebuilt.push_str(&m);
        } else {
            rebuilt.push_str(word);
        }
    }
    rebuilt.replace("cargo xtask", &x)
}

/// Runs `script` with `sh` in `dir` for at most `bound`; returns (success, output tail).
fn run(script: &str, dir: &Path, bound: Duration) -> (bool, String) {
    let mut child = Command::new("sh");
    // Its own process group, so a time-out ends the background jobs of the script too (a `serve &` left behind
    // would hold its port).
    std::os::unix::process::CommandExt::process_group(&mut child, 0);
    let mut child = child
        .arg("-c")
        // Every background job's status counts too (`wait` alone would always succeed).
        .arg(format!(
            "set -e\n{script}\nfor job in $(jobs -p); do wait \"$job\"; done"
        ))
        .current_dir(dir)
        .env("RAYON_NUM_THREADS", "2")
        .env("CANDLE_NUM_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting sh");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("waiting for sh") {
            // Whatever the script left running in its group (a server whose devices failed) ends with it.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .stderr(Stdio::null())
                .status();
            let out = child.wait_with_output().expect("collecting output");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let tail: String = text
                .lines()
                .rev()
                .take(12)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            return (status.success(), tail);
        }
        if start.elapsed() > bound {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.kill();
            let _ = child.wait();
            return (false, format!("ran past its bound of {} s", bound.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Says a line on the uncaptured stderr (a skip must show in a plain `cargo test`).
fn notice(text: &str) {
    let _ = writeln!(std::io::stderr(), "doc commands: {text}");
}

#[test]
fn every_documented_command_runs_as_written() {
    let root = root();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut all = Vec::new();
    for f in &files {
        let name = f.strip_prefix(&root).unwrap_or(f).display().to_string();
        all.extend(blocks(&name, &std::fs::read_to_string(f).unwrap()));
    }
    assert!(all.len() >= 5, "found only {} command blocks", all.len());
    // The built multispin binary sits beside this test's deps folder (`cargo test --workspace` builds it).
    let exe = std::env::current_exe().unwrap();
    let multispin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("multispin"))
        .filter(|p| p.is_file());
    let xtask = PathBuf::from(env!("CARGO_BIN_EXE_xtask"));
    let scratch = std::env::temp_dir().join(format!("doc-commands-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    for d in ["models", "scenarios"] {
        let link = scratch.join(d);
        if !link.exists() {
            std::os::unix::fs::symlink(root.join(d).canonicalize().unwrap(), &link).unwrap();
        }
    }
    let (mut ran, mut skipped, mut failures) = (0, 0, Vec::new());
    for b in &all {
        let mut runnable = Vec::new();
        for c in &b.commands {
            if let Some(why) = skip_reason(c) {
                notice(&format!("skipped ({why}): {}: {c}", b.place));
                skipped += 1;
            } else if multispin.is_none() && (c.contains("multispin")) {
                notice(&format!(
                    "skipped (the multispin binary is not built; `cargo build -p multispin`): {}: {c}",
                    b.place
                ));
                skipped += 1;
            } else {
                runnable.push(c.clone());
            }
        }
        if runnable.is_empty() {
            continue;
        }
        let m = multispin.clone().unwrap_or_else(|| PathBuf::from("multispin"));
        let script: Vec<String> = runnable.iter().map(|c| substitute(c, &m, &xtask)).collect();
        let bound = PER_COMMAND * runnable.len() as u32;
        let start = Instant::now();
        let (ok, tail) = run(&script.join("\n"), &scratch, bound);
        notice(&format!(
            "{} {}: {} command(s) in {:.1} s",
            if ok { "ran" } else { "FAILED" },
            b.place,
            runnable.len(),
            start.elapsed().as_secs_f64()
        ));
        ran += runnable.len();
        if !ok {
            failures.push(format!("{}:\n{}\n→ {tail}", b.place, runnable.join("\n")));
        }
    }
    notice(&format!("{ran} command(s) ran, {skipped} skipped"));
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(
        failures.is_empty(),
        "documented commands that fail as written:\n\n{}",
        failures.join("\n\n")
    );
}

#[test]
fn extraction_joins_continuations_and_drops_comments() {
    let text = "```sh\ncargo run -p multispin -- plan \\\n    --scheme best   # a comment\nmultispin --help\n```\n\n```\nscheme rounds\n```\n\n```\nmultispin simulate\n```\n";
    let b = blocks("x.md", text);
    assert_eq!(b.len(), 2, "{b:?}");
    assert_eq!(
        b[0].commands,
        vec!["cargo run -p multispin -- plan --scheme best", "multispin --help"]
    );
    assert_eq!(b[0].place, "x.md:1");
    assert_eq!(b[1].commands, vec!["multispin simulate"]);
    assert_eq!(strip_comment("echo \"a # b\" # c"), "echo \"a # b\"");
    let m = Path::new("/bin/ms");
    let x = Path::new("/bin/xt");
    assert_eq!(
        substitute("multispin serve & multispin device", m, x),
        "/bin/ms serve & /bin/ms device"
    );
    assert_eq!(
        substitute("cargo xtask distill -- --help", m, x),
        "/bin/xt distill -- --help"
    );
    assert!(skip_reason("scripts/fetch-smollm2.sh").is_some());
    assert!(skip_reason("cargo run --release -p multispin -- --help").is_none());
}
