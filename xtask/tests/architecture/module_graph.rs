//! The module graph of one crate, read from its sources by a text scan, and the circles in it.
//!
//! A module is a file (`lib.rs`/`main.rs` is the crate root, `a/mod.rs` and `a.rs` are `a`, `a/b.rs` is `a::b`);
//! an inline module (`mod tests { … }`) belongs to its file. Module A has an edge to module B when A names an item
//! of B (or B itself) through a path that resolves to B: `crate::…`, `super::…`, `self::…`, a child module's name,
//! or a name that a `use` brought into scope; in a `use` or anywhere in the code. A path resolves to the longest
//! prefix that is a module, and a name that module only re-exports (`pub use b::Item`) resolves on to the module
//! that defines it. A `pub use` is itself an edge only when its module also uses the name; a `mod x;` declaration
//! is never one. Comments and string and character literals are blanked before the scan.

use std::collections::{BTreeMap, BTreeSet};

/// One module path inside a crate, `""` for the root, `"a::b"` below it.
pub type Module = String;

/// One source file of a crate: its module path and its text.
pub struct Source {
    pub module: Module,
    pub text: String,
}

/// A directed edge and the evidence for it: the file's module, the target and the path as written, with its line.
#[derive(Debug, Clone)]
pub struct Edge {
    pub from: Module,
    pub to: Module,
    pub line: usize,
    pub path: String,
}

/// The module path of a file given its path relative to the crate's `src` (with `/` separators).
pub fn module_of(relative: &str) -> Module {
    let stem = relative.strip_suffix(".rs").unwrap_or(relative);
    let stem = stem.strip_suffix("/mod").unwrap_or(stem);
    if stem == "lib" || stem == "main" {
        return String::new();
    }
    stem.replace('/', "::")
}

/// Whether `module` is `owner` or one of its descendants (every module is within the root).
fn is_within(module: &str, owner: &str) -> bool {
    owner.is_empty()
        || module == owner
        || module
            .strip_prefix(owner)
            .is_some_and(|rest| rest.starts_with("::"))
}

/// A module path's segments (none for the root).
fn segments_of(module: &str) -> Vec<String> {
    module
        .split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Every edge between two different modules of one crate.
pub fn edges(sources: &[Source]) -> Vec<Edge> {
    let modules: BTreeSet<Module> = sources.iter().map(|s| s.module.clone()).collect();
    let scans: Vec<Scan> = sources
        .iter()
        .map(|s| scan(&s.module, &code_only(&s.text)))
        .collect();
    let mut reexports: BTreeMap<Module, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for (source, file) in sources.iter().zip(&scans) {
        let resolver = Resolver {
            file: &source.module,
            modules: &modules,
            aliases: &file.aliases(),
            reexports: &BTreeMap::new(),
        };
        for leaf in file.uses.iter().filter(|u| u.public && !u.glob) {
            if let Some(path) = resolver.absolute(&leaf.context, &leaf.segments) {
                reexports
                    .entry(source.module.clone())
                    .or_default()
                    .insert(leaf.name.clone(), path);
            }
        }
    }
    let mut out = Vec::new();
    for (source, file) in sources.iter().zip(&scans) {
        let aliases = file.aliases();
        let resolver = Resolver {
            file: &source.module,
            modules: &modules,
            aliases: &aliases,
            reexports: &reexports,
        };
        let mut add = |context: &[String], segments: &[String], line: usize| {
            if let Some(to) = resolver.target(context, segments)
                && !is_within(&to, &source.module)
            {
                out.push(Edge {
                    from: source.module.clone(),
                    to,
                    line,
                    path: segments.join("::"),
                });
            }
        };
        for leaf in &file.uses {
            if !leaf.public || file.idents.contains(&leaf.name) {
                add(&leaf.context, &leaf.segments, leaf.line);
            }
        }
        for path in &file.paths {
            add(&path.context, &path.segments, path.line);
        }
    }
    out
}

/// One circle: a strongly connected set of two or more modules (each reaches every other) and the shortest cycle
/// through its first module.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Circle {
    pub modules: Vec<Module>,
    pub cycle: Vec<Module>,
}

/// Every circle of the graph, sorted, so the report is stable.
pub fn circles(edges: &[Edge]) -> Vec<Circle> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for e in edges {
        next.entry(&e.from).or_default().insert(&e.to);
        next.entry(&e.to).or_default();
    }
    let mut out = Vec::new();
    for component in strongly_connected(&next) {
        if component.len() < 2 {
            continue;
        }
        let start = component[0];
        // Breadth-first from `start` inside the component, back to `start`: the shortest cycle through it.
        let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut closing = None;
        while let Some(node) = queue.pop_front() {
            for &n in &next[node] {
                if !component.contains(&n) {
                    continue;
                }
                if n == start {
                    closing = Some(node);
                    break;
                }
                if !parent.contains_key(n) {
                    parent.insert(n, node);
                    queue.push_back(n);
                }
            }
            if closing.is_some() {
                break;
            }
        }
        let mut back = Vec::new();
        let mut node = closing.expect("a strongly connected set of two modules has a cycle through each");
        while node != start {
            back.push(node.to_owned());
            node = parent[node];
        }
        let mut cycle = vec![start.to_owned()];
        cycle.extend(back.into_iter().rev());
        cycle.push(start.to_owned());
        out.push(Circle {
            modules: component.iter().map(|m| (*m).to_owned()).collect(),
            cycle,
        });
    }
    out.sort();
    out
}

/// Tarjan's strongly connected components, each sorted.
fn strongly_connected<'a>(next: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(v: &'a str, next: &BTreeMap<&'a str, BTreeSet<&'a str>>, s: &mut State<'a>) {
        let k = s.index.len();
        s.index.insert(v, k);
        s.low.insert(v, k);
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in &next[v] {
            if !s.index.contains_key(w) {
                visit(w, next, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            component.sort();
            s.out.push(component);
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in next.keys() {
        if !s.index.contains_key(v) {
            visit(v, next, &mut s);
        }
    }
    s.out
}

/// Resolves paths written in one file against the crate's modules.
struct Resolver<'a> {
    file: &'a str,
    modules: &'a BTreeSet<Module>,
    aliases: &'a BTreeMap<String, (Vec<String>, Vec<String>)>,
    reexports: &'a BTreeMap<Module, BTreeMap<String, Vec<String>>>,
}

impl Resolver<'_> {
    /// The absolute segments (below the crate root) of a path written in `context` (the file's module followed
    /// by the inline modules around it), or `None` when it leaves the crate.
    fn absolute(&self, context: &[String], segments: &[String]) -> Option<Vec<String>> {
        self.absolute_depth(context, segments, 0)
    }

    fn absolute_depth(&self, context: &[String], segments: &[String], depth: usize) -> Option<Vec<String>> {
        let (first, rest) = segments.split_first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => context.to_vec(),
            "super" => {
                let mut base = context.to_vec();
                base.pop()?;
                let mut rest = rest;
                while let Some(("super", tail)) = rest.split_first().map(|(h, t)| (h.as_str(), t)) {
                    base.pop()?;
                    rest = tail;
                }
                base.extend(rest.iter().cloned());
                return Some(base);
            }
            name => {
                let mut child = context.to_vec();
                child.push(name.to_owned());
                let mut sibling = segments_of(self.file);
                sibling.push(name.to_owned());
                if self.modules.contains(&child.join("::")) {
                    child
                } else if self.modules.contains(&sibling.join("::")) {
                    sibling
                } else if let Some((alias_context, alias)) = self.aliases.get(name)
                    && depth < 8
                {
                    self.absolute_depth(alias_context, alias, depth + 1)?
                } else {
                    return None;
                }
            }
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The module a path names: its longest module prefix, followed through re-exports.
    fn target(&self, context: &[String], segments: &[String]) -> Option<Module> {
        let mut path = self.absolute(context, segments)?;
        for _ in 0..8 {
            let prefix = (0..=path.len())
                .rev()
                .find(|&n| self.modules.contains(&path[..n].join("::")))?;
            let module = path[..prefix].join("::");
            let Some(to) = path
                .get(prefix)
                .and_then(|name| self.reexports.get(&module)?.get(name))
            else {
                return Some(module);
            };
            let mut to = to.clone();
            to.extend(path[prefix + 1..].iter().cloned());
            if to == path {
                return Some(module);
            }
            path = to;
        }
        None
    }
}

/// What one file's scan found.
#[derive(Default)]
struct Scan {
    uses: Vec<UseLeaf>,
    paths: Vec<Path>,
    /// Every identifier outside `use` items.
    idents: BTreeSet<String>,
}

impl Scan {
    /// Name → (context, segments) of every non-glob `use` leaf.
    fn aliases(&self) -> BTreeMap<String, (Vec<String>, Vec<String>)> {
        self.uses
            .iter()
            .filter(|u| !u.glob)
            .map(|u| (u.name.clone(), (u.context.clone(), u.segments.clone())))
            .collect()
    }
}

/// One imported path of a `use` tree.
struct UseLeaf {
    context: Vec<String>,
    segments: Vec<String>,
    /// The name it is imported as (empty for a glob).
    name: String,
    glob: bool,
    public: bool,
    line: usize,
}

/// A path in code whose first segment is followed by `::`.
struct Path {
    context: Vec<String>,
    segments: Vec<String>,
    line: usize,
}

/// Tokens of blanked code: identifiers, `::` and single punctuation characters, each with its line.
fn tokens(code: &str) -> Vec<(String, usize)> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            // `r#ident` is the identifier itself.
            let word: String = chars[start..i].iter().collect();
            out.push((word, line));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push(("::".to_owned(), line));
            i += 2;
        } else {
            out.push((c.to_string(), line));
            i += 1;
        }
    }
    out
}

fn is_ident(token: &str) -> bool {
    token
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Walks the tokens of one file: inline modules, `use` trees and paths.
fn scan(module: &str, code: &str) -> Scan {
    let toks = tokens(code);
    let tok = |i: usize| toks.get(i).map_or("", |t| t.0.as_str());
    let mut out = Scan::default();
    let mut context: Vec<String> = segments_of(module);
    // The brace depth inside which each open inline module's body lies.
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let t = tok(i);
        match t {
            "{" => depth += 1,
            "}" => {
                if inline.last() == Some(&depth) {
                    inline.pop();
                    context.pop();
                }
                depth = depth.saturating_sub(1);
            }
            "mod" if is_ident(tok(i + 1)) && tok(i + 2) == "{" => {
                context.push(tok(i + 1).to_owned());
                depth += 1;
                inline.push(depth);
                i += 3;
                continue;
            }
            "use" => {
                let public = tok(i.wrapping_sub(1)) == "pub"
                    || (tok(i.wrapping_sub(1)) == ")" && (2..6).any(|b| tok(i.wrapping_sub(b)) == "pub"));
                let line = toks[i].1;
                let mut j = i + 1;
                let mut leaves = Vec::new();
                use_tree(&toks, &mut j, Vec::new(), &mut leaves);
                for (segments, name, glob) in leaves {
                    out.uses.push(UseLeaf {
                        context: context.clone(),
                        segments,
                        name,
                        glob,
                        public,
                        line,
                    });
                }
                while j < toks.len() && tok(j) != ";" {
                    j += 1;
                }
                i = j + 1;
                continue;
            }
            _ if is_ident(t) => {
                out.idents.insert(t.to_owned());
                if tok(i + 1) == "::" && tok(i.wrapping_sub(1)) != "::" {
                    let line = toks[i].1;
                    let mut segments = vec![t.to_owned()];
                    let mut j = i + 1;
                    while tok(j) == "::" && is_ident(tok(j + 1)) {
                        segments.push(tok(j + 1).to_owned());
                        j += 2;
                    }
                    out.paths.push(Path {
                        context: context.clone(),
                        segments,
                        line,
                    });
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// One `use` tree from `toks[*j]`, its leaves pushed as (segments, imported name, glob).
fn use_tree(
    toks: &[(String, usize)],
    j: &mut usize,
    mut prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, String, bool)>,
) {
    let tok = |i: usize| toks.get(i).map_or("", |t| t.0.as_str());
    if tok(*j) == "::" {
        // `use ::name` names an external crate.
        prefix.push(String::new());
        *j += 1;
    }
    loop {
        match tok(*j) {
            "{" => {
                *j += 1;
                while tok(*j) != "}" && *j < toks.len() {
                    use_tree(toks, j, prefix.clone(), out);
                    if tok(*j) == "," {
                        *j += 1;
                    }
                }
                *j += 1;
                return;
            }
            "*" => {
                *j += 1;
                out.push((prefix, String::new(), true));
                return;
            }
            "self" if !prefix.is_empty() && tok(*j + 1) != "::" => {
                *j += 1;
                let name = alias(toks, j).unwrap_or_else(|| prefix.last().cloned().unwrap_or_default());
                out.push((prefix, name, false));
                return;
            }
            t if is_ident(t) => {
                prefix.push(t.to_owned());
                *j += 1;
                if tok(*j) == "::" {
                    *j += 1;
                    continue;
                }
                let name = alias(toks, j).unwrap_or_else(|| t.to_owned());
                out.push((prefix, name, false));
                return;
            }
            _ => return,
        }
    }
}

/// `as name` after a use leaf, consumed.
fn alias(toks: &[(String, usize)], j: &mut usize) -> Option<String> {
    if toks.get(*j).is_some_and(|t| t.0 == "as") {
        let name = toks.get(*j + 1)?.0.clone();
        *j += 2;
        return Some(name);
    }
    None
}

/// The source with comments and string and character literals replaced by spaces (newlines kept), so that the
/// scan sees code only.
pub fn code_only(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let word = |k: usize| k > 0 && (c[k - 1].is_alphanumeric() || c[k - 1] == '_');
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(k).copied().unwrap_or('\0');
        if at(i) == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if at(i) == '/' && at(i + 1) == '*' {
            let mut nest = 0;
            loop {
                if i >= c.len() {
                    break;
                }
                if at(i) == '/' && at(i + 1) == '*' {
                    nest += 1;
                    out.push_str("  ");
                    i += 2;
                } else if at(i) == '*' && at(i + 1) == '/' {
                    nest -= 1;
                    out.push_str("  ");
                    i += 2;
                    if nest == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if !word(i) && matches!(at(i), 'r' | 'b' | 'c') && {
            // A raw string: `r"…"`, `r#"…"#`, `br…`, `cr…`.
            let k = if at(i) != 'r' && at(i + 1) == 'r' {
                i + 2
            } else {
                i + 1
            };
            (at(i) == 'r' || at(i + 1) == 'r') && {
                let mut h = k;
                while at(h) == '#' {
                    h += 1;
                }
                at(h) == '"'
            }
        } {
            let mut k = if at(i) != 'r' { i + 2 } else { i + 1 };
            let mut hashes = 0;
            while at(k) == '#' {
                hashes += 1;
                k += 1;
            }
            k += 1;
            loop {
                if k >= c.len() {
                    break;
                }
                if c[k] == '"' && (1..=hashes).all(|h| at(k + h) == '#') {
                    k += 1 + hashes;
                    break;
                }
                k += 1;
            }
            for &ch in &c[i..k.min(c.len())] {
                blank(&mut out, ch);
            }
            i = k;
        } else if at(i) == '"' || (!word(i) && matches!(at(i), 'b' | 'c') && at(i + 1) == '"') {
            let mut k = if at(i) == '"' { i + 1 } else { i + 2 };
            while k < c.len() && c[k] != '"' {
                k += if c[k] == '\\' { 2 } else { 1 };
            }
            for &ch in &c[i..(k + 1).min(c.len())] {
                blank(&mut out, ch);
            }
            i = k + 1;
        } else if at(i) == '\'' && (at(i + 1) == '\\' || (at(i + 1) != '\'' && at(i + 2) == '\'')) {
            // A character literal; a lifetime (`'a`) has no closing quote after one character.
            let mut k = i + 1;
            while k < c.len() && c[k] != '\'' {
                k += if c[k] == '\\' { 2 } else { 1 };
            }
            for &ch in &c[i..(k + 1).min(c.len())] {
                blank(&mut out, ch);
            }
            i = k + 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}
