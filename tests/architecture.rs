//! The modules of `src/` import one another in layers: no circle of
//! imports, in any folder. A circle means two modules each need the
//! other's inside, so neither can be read, tested or moved alone; the
//! piece they share belongs to one of them (or lower).
//!
//! A file's imports are the paths it names from `crate::`, `super::` and
//! `self::` (in `use` trees too, macros by the file that exports them,
//! `pub use` of a module by the module). In each folder the modules beside
//! each other are checked: its files (but `mod.rs`, or `lib.rs` at the top)
//! and its subfolders, each subfolder with everything inside it. A
//! folder's `mod.rs` and its own files are not checked against each other:
//! the files read the folder's types and `mod.rs` calls its files, which is
//! how a Rust module is made.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module of the library: its path below `crate` and its file.
struct Module {
    path: Vec<String>,
    file: PathBuf,
}

/// The library's modules (`main.rs` is the binary: it imports the library
/// by name, and nothing imports it).
fn modules(src: &Path) -> Vec<Module> {
    let mut found = vec![];
    let mut todo = vec![src.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let file = entry.unwrap().path();
            if file.is_dir() {
                todo.push(file);
                continue;
            }
            if file.extension().is_none_or(|e| e != "rs") || file == src.join("main.rs") {
                continue;
            }
            let relative = file.strip_prefix(src).unwrap().with_extension("");
            let mut path: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
                path.pop();
            }
            found.push(Module { path, file });
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    found
}

/// The source without comments, strings and character literals (each
/// replaced by spaces, so that lines keep their numbers).
fn code(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, s: &[char]| out.extend(s.iter().map(|&ch| if ch == '\n' { '\n' } else { ' ' }));
    let mut i = 0;
    while i < c.len() {
        let rest = &c[i..];
        let skip = if rest.starts_with(&['/', '/']) {
            rest.iter().position(|&ch| ch == '\n').unwrap_or(rest.len())
        } else if rest.starts_with(&['/', '*']) {
            let mut depth = 0;
            let mut j = 0;
            while j < rest.len() {
                if rest[j..].starts_with(&['/', '*']) {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(&['*', '/']) {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            j
        } else if rest[0] == 'r'
            && rest.get(1).is_some_and(|&ch| ch == '"' || ch == '#')
            && !ident_char(c.get(i.wrapping_sub(1)))
        {
            // r"…" or r#"…"#.
            let hashes = rest[1..].iter().take_while(|&&ch| ch == '#').count();
            if rest.get(1 + hashes) != Some(&'"') {
                0
            } else {
                let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                let body = 2 + hashes;
                body + rest[body..].windows(close.len()).position(|w| w == close.as_slice()).unwrap_or(rest.len())
                    + close.len()
            }
        } else if rest[0] == '"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != '"' {
                j += if rest[j] == '\\' { 2 } else { 1 };
            }
            j + 1
        } else if rest[0] == '\'' && rest.get(1) == Some(&'\\') {
            2 + rest[2..].iter().position(|&ch| ch == '\'').unwrap_or(0) + 1
        } else if rest[0] == '\'' && rest.get(2) == Some(&'\'') {
            3
        } else {
            0
        };
        if skip == 0 {
            out.push(c[i]);
            i += 1;
        } else {
            let end = (i + skip).min(c.len());
            blank(&mut out, &c[i..end]);
            i = end;
        }
    }
    out
}

fn ident_char(c: Option<&char>) -> bool {
    c.is_some_and(|&c| c.is_alphanumeric() || c == '_')
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Path,
    Open,
    Close,
    Comma,
    Other(char),
}

/// Identifiers, `::`, braces and commas, each with its line.
fn tokens(code: &str) -> Vec<(Token, usize)> {
    let c: Vec<char> = code.chars().collect();
    let (mut out, mut line, mut i) = (vec![], 1, 0);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
        }
        if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while ident_char(c.get(i)) {
                i += 1;
            }
            out.push((Token::Ident(c[start..i].iter().collect()), line));
            continue;
        }
        if ch.is_ascii_digit() {
            while ident_char(c.get(i)) {
                i += 1;
            }
            out.push((Token::Other('0'), line));
            continue;
        }
        if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Token::Path, line));
            i += 2;
            continue;
        }
        match ch {
            '{' => out.push((Token::Open, line)),
            '}' => out.push((Token::Close, line)),
            ',' => out.push((Token::Comma, line)),
            c if c.is_whitespace() => {}
            c => out.push((Token::Other(c), line)),
        }
        i += 1;
    }
    out
}

/// A path a file names, made absolute, with the line it is named on.
struct Named {
    path: Vec<String>,
    line: usize,
    /// Named in a `pub use` (a re-export).
    reexport: bool,
}

/// Every path `module`'s file names from `crate::`, `$crate::`, `super::`
/// or `self::`, use trees expanded; inline modules (`mod tests { … }`)
/// move `super` and `self` as Rust does. In `lib.rs` and `mod.rs`, `pub
/// use` of a child module's path is named too (a re-export of it).
fn named(module: &Module, code: &str) -> Vec<Named> {
    let t = tokens(code);
    let ident = |i: usize| match t.get(i) {
        Some((Token::Ident(s), _)) => Some(s.as_str()),
        _ => None,
    };
    let is = |i: usize, tok: Token| t.get(i).is_some_and(|(x, _)| *x == tok);
    let mut out = vec![];
    // The inline modules open at this point: (name, brace depth inside).
    let mut inline: Vec<(String, usize)> = vec![];
    let mut depth = 0;
    let root_file = module.file.file_name().is_some_and(|f| f == "mod.rs" || f == "lib.rs");
    let mut i = 0;
    while i < t.len() {
        match &t[i].0 {
            Token::Open => depth += 1,
            Token::Close => {
                depth -= 1;
                if inline.last().is_some_and(|&(_, d)| d > depth) {
                    inline.pop();
                }
            }
            _ => {}
        }
        if ident(i) == Some("mod") && ident(i + 1).is_some() && is(i + 2, Token::Open) {
            inline.push((ident(i + 1).unwrap().to_string(), depth + 1));
            depth += 1;
            i += 3;
            continue;
        }
        let here: Vec<String> = module.path.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect();
        let after_path = i > 0 && is(i - 1, Token::Path);
        // Where the path starts (absolute), and the token its tree begins at.
        let start: Option<(Vec<String>, usize)> = match ident(i) {
            Some("crate") if !after_path && is(i + 1, Token::Path) => Some((vec![], i + 2)),
            Some("self") if !after_path && is(i + 1, Token::Path) => Some((here.clone(), i + 2)),
            Some("super") if !after_path && is(i + 1, Token::Path) => {
                let (mut p, mut j) = (here.clone(), i);
                while ident(j) == Some("super") && is(j + 1, Token::Path) {
                    p.pop();
                    j += 2;
                }
                Some((p, j))
            }
            // `pub use child::…` in a crate root or a mod.rs.
            Some(s)
                if root_file
                    && s != "std"
                    && ident(i.wrapping_sub(1)) == Some("use")
                    && ident(i.wrapping_sub(2)) == Some("pub") =>
            {
                Some((here.clone(), i))
            }
            _ => None,
        };
        let Some((start, begin)) = start else {
            i += 1;
            continue;
        };
        let reexport = ident(i.wrapping_sub(1)) == Some("use") && ident(i.wrapping_sub(2)) == Some("pub");
        let (line, mut paths) = (t[i].1, vec![]);
        i = tree(&t, begin, start, &mut paths);
        out.extend(paths.into_iter().map(|path| Named { path, line, reexport }));
    }
    out
}

/// Reads a use tree (or a plain path) at `i` below `prefix`; returns where
/// it ends.
fn tree(t: &[(Token, usize)], mut i: usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    loop {
        match t.get(i).map(|(x, _)| x) {
            Some(Token::Ident(s)) if s == "self" => {
                i += 1;
            }
            Some(Token::Ident(s)) => {
                prefix.push(s.clone());
                i += 1;
            }
            Some(Token::Open) => {
                i += 1;
                loop {
                    i = tree(t, i, prefix.clone(), out);
                    // Past an `as name` or whatever ends this item.
                    while !matches!(t.get(i).map(|(x, _)| x), None | Some(Token::Comma | Token::Close)) {
                        i += 1;
                    }
                    match t.get(i).map(|(x, _)| x) {
                        Some(Token::Comma) => i += 1,
                        _ => return i + 1,
                    }
                    if matches!(t.get(i).map(|(x, _)| x), Some(Token::Close)) {
                        return i + 1;
                    }
                }
            }
            _ => {
                out.push(prefix);
                return i;
            }
        }
        if matches!(t.get(i).map(|(x, _)| x), Some(Token::Path)) {
            i += 1;
        } else {
            out.push(prefix);
            return i;
        }
    }
}

/// An import of one module by another, with where it is.
struct Edge {
    from: Vec<String>,
    to: Vec<String>,
    at: String,
}

/// Every import between two different modules of the library.
fn imports(src: &Path) -> (Vec<Module>, Vec<Edge>) {
    let modules = modules(src);
    let known: BTreeSet<Vec<String>> = modules.iter().map(|m| m.path.clone()).collect();
    let mut aliases: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
    let mut all = vec![];
    for m in &modules {
        let text = std::fs::read_to_string(&m.file).unwrap();
        let code = code(&text);
        // Macros exported at the crate root are the file's that defines them.
        let t = tokens(&code);
        for w in t.windows(4) {
            if let [(Token::Ident(r), _), (Token::Other('!'), _), (Token::Ident(name), _), _] = w {
                if r == "macro_rules" && code.contains("#[macro_export]") {
                    aliases.insert(vec![name.clone()], m.path.clone());
                }
            }
        }
        for n in named(m, &code) {
            if n.reexport && known.contains(&n.path) {
                let name = n.path.last().unwrap().clone();
                let alias: Vec<String> = m.path.iter().cloned().chain([name]).collect();
                if alias != n.path {
                    aliases.insert(alias, n.path.clone());
                }
            }
            all.push((m, n));
        }
    }
    let resolve = |path: &[String]| -> Option<Vec<String>> {
        let mut path = path.to_vec();
        if let Some((alias, to)) = aliases.iter().find(|(a, _)| path.starts_with(a)) {
            path = to.iter().cloned().chain(path[alias.len()..].iter().cloned()).collect();
        }
        (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| known.contains(p))
    };
    let mut edges = vec![];
    for (m, n) in all {
        let Some(to) = resolve(&n.path) else { continue };
        if to != m.path {
            let file = m.file.strip_prefix(src.parent().unwrap()).unwrap().display().to_string();
            edges.push(Edge { from: m.path.clone(), to, at: format!("{file}:{}: {}", n.line, n.path.join("::")) });
        }
    }
    (modules, edges)
}

/// The circles among the modules beside each other in each folder: each
/// strongly connected set of two or more, with the imports inside it.
fn circles(src: &Path) -> Vec<String> {
    let (modules, edges) = imports(src);
    let folders: BTreeSet<Vec<String>> = modules
        .iter()
        .filter(|m| m.file.file_name().is_some_and(|f| f == "mod.rs" || f == "lib.rs"))
        .map(|m| m.path.clone())
        .collect();
    let mut found = vec![];
    for folder in folders {
        // The child of `folder` a module is, or is inside.
        let child = |p: &[String]| (p.len() > folder.len() && p.starts_with(&folder)).then(|| p[folder.len()].clone());
        let mut graph: BTreeMap<String, BTreeMap<String, Vec<&str>>> = BTreeMap::new();
        for e in &edges {
            if let (Some(a), Some(b)) = (child(&e.from), child(&e.to)) {
                if a != b {
                    graph.entry(a).or_default().entry(b).or_default().push(&e.at);
                }
            }
        }
        for set in strongly_connected(&graph) {
            let name = |c: &str| folder.iter().cloned().chain([c.to_string()]).collect::<Vec<_>>().join("/");
            let mut text = format!("{{{}}}", set.iter().map(|c| name(c)).collect::<Vec<_>>().join(", "));
            for a in &set {
                for (b, at) in graph.get(a).into_iter().flatten().filter(|(b, _)| set.contains(*b)) {
                    text += &format!("\n    {} -> {}: {}", name(a), name(b), at.join("; "));
                }
            }
            found.push(text);
        }
    }
    found
}

/// Tarjan's strongly connected components of two or more nodes.
fn strongly_connected(graph: &BTreeMap<String, BTreeMap<String, Vec<&str>>>) -> Vec<BTreeSet<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeMap<String, Vec<&'a str>>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        for w in s.graph.get(v).into_iter().flat_map(|m| m.keys()) {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                let low = s.low[v].min(s.low[w.as_str()]);
                s.low.insert(v, low);
            } else if s.on.contains(w.as_str()) {
                let low = s.low[v].min(s.index[w.as_str()]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut set = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                set.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                s.out.push(set);
            }
        }
    }
    let mut s =
        State { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: vec![], on: BTreeSet::new(), out: vec![] };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_modules_import_each_other_in_a_circle() {
    let found = circles(&src());
    assert!(found.is_empty(), "{} circle(s) of imports in src/:\n{}", found.len(), found.join("\n"));
}

/// The reader finds what the rule above holds against: imports of each
/// spelling, and a circle where there is one.
#[test]
fn the_import_reader_sees_every_spelling() {
    let (_, edges) = imports(&src());
    let has = |from: &str, to: &str| edges.iter().any(|e| e.from.join("/") == from && e.to.join("/") == to);
    // `use crate::onnx::{…}`, a `super::` path, `crate::shapes` (a `pub
    // use` of graph::shapes), an exported macro (`crate::require`).
    assert!(has("graph/fold", "onnx"));
    assert!(has("graph/shapes", "graph/dim"));
    assert!(has("passes/skip_norm", "graph/shapes"));
    assert!(edges.iter().any(|e| e.from == ["pattern"] && e.to == ["graph"] && e.at.ends_with(": require")));
    let text = "use crate::a::{b, c::{self, D}};\nfn f() { super::e::g(); let s = \"crate::z\"; }\nmod tests { use super::*; }";
    let module = Module { path: vec!["x".into(), "y".into()], file: PathBuf::from("x/y.rs") };
    let paths: Vec<String> = named(&module, &code(text)).iter().map(|n| n.path.join("::")).collect();
    assert_eq!(paths, ["a::b", "a::c", "a::c::D", "x::e::g", "x::y"]);
    let edge = |to: &str| (to.to_string(), vec!["here"]);
    let graph = BTreeMap::from([
        ("a".to_string(), BTreeMap::from([edge("b")])),
        ("b".to_string(), BTreeMap::from([edge("a")])),
        ("c".to_string(), BTreeMap::from([edge("a")])),
    ]);
    assert_eq!(strongly_connected(&graph), [BTreeSet::from(["a".to_string(), "b".to_string()])]);
}

/// Who reads a value is the driver's to settle (`rewrite::settle`, `Kept`)
/// and the toolkit's to answer (`pattern::siblings`): no pass file asks
/// the graph for a value's consumers. (Comments and strings are left out.)
#[test]
fn no_pass_asks_who_reads_a_value() {
    let passes = src().join("passes");
    let asking: Vec<String> = modules(&src())
        .into_iter()
        .filter(|m| m.file.starts_with(&passes))
        .filter(|m| code(&std::fs::read_to_string(&m.file).unwrap()).contains(".consumers("))
        .map(|m| m.file.display().to_string())
        .collect();
    assert!(asking.is_empty(), "passes that ask who reads a value: {asking:?}");
    // The check sees a call where there is one.
    assert!(code("let r = g.consumers(x); // g.consumers(y)").contains(".consumers("));
    assert!(!code("// g.consumers(y)\nlet s = \"g.consumers(\";").contains(".consumers("));
}
