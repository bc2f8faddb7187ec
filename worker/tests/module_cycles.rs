//! The floor plan's rules, read from the source: no import cycle among the modules of the
//! workspace's crates, no sandbox module importing from a floor above its own, and no
//! production function over 150 lines.
//!
//! A module is one source file (`a/mod.rs` is `a`, `a/b.rs` is `a::b`); its edges are the
//! modules its `crate::`, `super::` and `self::` paths name, grouped imports included. Comments
//! (doc links too) are not edges. A path names the longest module it starts with, so
//! `crate::node::health::Backoff` is an edge to `node::health`, `crate::node::Node` one to
//! `node`. An inline test module's `super::` is the file's own module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`node::health`, `` for the crate root) → its file's text.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            out.insert(parts.join("::"), std::fs::read_to_string(&path).unwrap());
        }
    }
    out
}

/// The text without `//` comments (doc comments included) and string literals.
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = ' ';
        let mut kept = String::new();
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if in_str {
                if c == '"' && prev != '\\' {
                    in_str = false;
                }
                prev = if prev == '\\' && c == '\\' { ' ' } else { c };
                continue;
            }
            if c == '/' && chars.peek() == Some(&'/') {
                break;
            }
            if c == '"' {
                in_str = true;
                prev = ' ';
                continue;
            }
            kept.push(c);
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

/// Every full path of a use tree starting at `rest` (just after `crate::`, `super::`...):
/// `a::{b, c::d}` gives `a::b` and `a::c::d`.
fn paths(rest: &str) -> Vec<Vec<String>> {
    fn tree(s: &[char], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        loop {
            while *i < s.len() && s[*i].is_whitespace() {
                *i += 1;
            }
            if *i < s.len() && s[*i] == '{' {
                *i += 1;
                loop {
                    tree(s, i, &path, out);
                    while *i < s.len() && s[*i].is_whitespace() {
                        *i += 1;
                    }
                    match s.get(*i) {
                        Some(',') => *i += 1,
                        Some('}') => {
                            *i += 1;
                            return;
                        }
                        _ => return,
                    }
                    while *i < s.len() && s[*i].is_whitespace() {
                        *i += 1;
                    }
                    if s.get(*i) == Some(&'}') {
                        *i += 1;
                        return;
                    }
                }
            }
            let start = *i;
            while *i < s.len() && (s[*i].is_alphanumeric() || s[*i] == '_') {
                *i += 1;
            }
            if *i == start {
                out.push(path);
                return;
            }
            path.push(s[start..*i].iter().collect());
            if s.get(*i) == Some(&':') && s.get(*i + 1) == Some(&':') {
                *i += 2;
            } else {
                out.push(path);
                return;
            }
        }
    }
    let chars: Vec<char> = rest.chars().take(4000).collect();
    let mut out = Vec::new();
    tree(&chars, &mut 0, &[], &mut out);
    out
}

/// The modules `module` (whose text is `text`) names.
fn edges(module: &str, text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let text = code(text);
    let own: Vec<String> = module
        .split("::")
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    let parent = own[..own.len().saturating_sub(1)].to_vec();
    // Inline modules (`mod tests {`) start a region where `super::` is this file's module.
    let inline_at = text
        .match_indices("mod ")
        .find(|(i, _)| {
            let after = &text[i + 4..];
            let name_end = after
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(0);
            name_end > 0 && after[name_end..].trim_start().starts_with('{')
        })
        .map_or(usize::MAX, |(i, _)| i);
    let mut out = BTreeSet::new();
    for (root, base) in [
        ("crate::", None),
        ("super::", Some(true)),
        ("self::", Some(false)),
    ] {
        for (at, _) in text.match_indices(root) {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let prefix = match base {
                None => Vec::new(),
                Some(true) if at > inline_at => own.clone(),
                Some(true) => parent.clone(),
                Some(false) => own.clone(),
            };
            for tail in paths(&text[at + root.len()..]) {
                let full: Vec<String> = prefix.iter().cloned().chain(tail).collect();
                let target = (0..=full.len())
                    .rev()
                    .map(|n| full[..n].join("::"))
                    .find(|m| known.contains(m))
                    .unwrap_or_default();
                if target != module {
                    out.insert(target);
                }
            }
        }
    }
    out
}

/// One cycle of the graph, if there is any.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, done, stack) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut done, &mut Vec::new()))
}

fn graph_of(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(src);
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(m, text)| (m.clone(), edges(m, text, &known)))
        .collect()
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The groups of modules that import each other (strongly connected, more than one module).
fn tangles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_owned()];
        while let Some(n) = todo.pop() {
            for next in graph.get(&n).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|n| (n, reach(n))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for (n, from_n) in &reaches {
        let group: BTreeSet<String> = from_n
            .iter()
            .filter(|m| reaches.get(m).is_some_and(|r| r.contains(*n)))
            .cloned()
            .collect();
        if group.len() > 1 && !out.contains(&group) {
            out.push(group);
        }
    }
    out
}

/// Cycles allowed to remain (crate, modules): none. A cycle that must stay for a while is
/// listed here with the change that will break it; nothing may join it.
const KNOWN: &[(&str, &[&str])] = &[];

#[test]
fn no_crate_has_an_import_cycle() {
    for krate in [
        "worker",
        "queue",
        "loadgen",
        "bench",
        "private-redis",
        "testkit",
    ] {
        let graph = graph_of(&workspace().join(krate).join("src"));
        assert!(graph.len() >= 3, "{krate}: read {} modules", graph.len());
        for group in tangles(&graph) {
            let known = KNOWN.iter().any(|(k, members)| {
                *k == krate && group.iter().all(|m| members.contains(&m.as_str()))
            });
            if known {
                eprintln!("{krate}: known import cycle among {group:?}");
                continue;
            }
            let sub: BTreeMap<String, BTreeSet<String>> = graph
                .iter()
                .filter(|(m, _)| group.contains(*m))
                .map(|(m, e)| (m.clone(), e.intersection(&group).cloned().collect()))
                .collect();
            let cycle = find_cycle(&sub).unwrap_or_default();
            panic!(
                "{krate}: import cycle {} (all of {group:?} import each other)",
                cycle.join(" -> ")
            );
        }
    }
}

#[test]
fn the_check_sees_edges_and_cycles() {
    let known: BTreeSet<String> = ["", "a", "a::b", "c"].map(str::to_owned).into();
    let text = "//! [`crate::c`] is only a doc link\nuse crate::{a::b::Thing, c};\n\
                fn f() { super::g(); let s = \"crate::a\"; }\n";
    let got = edges("a::b", text, &known);
    assert_eq!(got, ["a", "c"].map(str::to_owned).into());
    let tests = "use crate::c;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n";
    assert_eq!(edges("a", tests, &known), ["c"].map(str::to_owned).into());
    let mut graph = BTreeMap::new();
    graph.insert("a".to_owned(), BTreeSet::from(["b".to_owned()]));
    graph.insert("b".to_owned(), BTreeSet::from(["a".to_owned()]));
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".to_owned(), "b".to_owned(), "a".to_owned()])
    );
    graph.get_mut("b").unwrap().clear();
    assert_eq!(find_cycle(&graph), None);
}

/// The floors of `sandbox`'s rooms: a module may import from its own floor or a lower one,
/// never from a room above its own. The engine's side stands on the processes it starts,
/// they on the isolation steps they share and the warm runtimes, and all of them on the
/// kernel's calls. `sandbox` itself (its `mod.rs`, the public face) stands above them all.
const SANDBOX_FLOORS: &[(&str, u32)] = &[
    ("kernel", 0),
    ("isolate", 1),
    ("runtime", 1),
    ("process", 2),
    ("engine", 3),
];

/// The floor of a module of `sandbox` (`sandbox::isolate::rootfs`): its room's, or none for
/// `sandbox` itself and for modules outside it. A module directly in `sandbox/` that is not a
/// room has no floor the plan knows, and is refused.
fn sandbox_floor(module: &str) -> Option<u32> {
    let rest = module.strip_prefix("sandbox::")?;
    let room = rest.split("::").next().unwrap();
    let floor = SANDBOX_FLOORS
        .iter()
        .find(|(r, _)| *r == room)
        .map(|(_, f)| *f);
    assert!(
        floor.is_some(),
        "{module}: `sandbox/{room}` is in no room of SANDBOX_FLOORS; put it in one, or add its \
         room with its floor"
    );
    floor
}

/// Every import inside `sandbox` that points to a room above its own (module → target).
fn arrows_up(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (module, targets) in graph {
        let Some(floor) = sandbox_floor(module) else {
            continue;
        };
        for target in targets {
            if target == "sandbox" || sandbox_floor(target).is_some_and(|t| t > floor) {
                out.push((module.clone(), target.clone()));
            }
        }
    }
    out
}

#[test]
fn no_sandbox_module_imports_from_a_floor_above_its_own() {
    let graph = graph_of(&workspace().join("worker").join("src"));
    let rooms: BTreeSet<&str> = graph
        .keys()
        .filter_map(|m| m.strip_prefix("sandbox::"))
        .map(|m| m.split("::").next().unwrap())
        .collect();
    let planned: BTreeSet<&str> = SANDBOX_FLOORS.iter().map(|(r, _)| *r).collect();
    assert_eq!(rooms, planned, "the rooms of worker/src/sandbox");
    let up = arrows_up(&graph);
    assert!(
        up.is_empty(),
        "imports pointing up the sandbox's floors ({SANDBOX_FLOORS:?}): {up:?}"
    );
}

#[test]
fn the_floor_check_sees_arrows_up() {
    let edge = |from: &str, to: &str| {
        let mut graph = BTreeMap::new();
        graph.insert(from.to_owned(), BTreeSet::from([to.to_owned()]));
        arrows_up(&graph)
    };
    let up = |from: &str, to: &str| vec![(from.to_owned(), to.to_owned())];
    assert_eq!(
        edge("sandbox::kernel::sys", "sandbox::isolate::limits"),
        up("sandbox::kernel::sys", "sandbox::isolate::limits")
    );
    assert_eq!(
        edge("sandbox::isolate::rootfs", "sandbox::process::wire"),
        up("sandbox::isolate::rootfs", "sandbox::process::wire")
    );
    assert_eq!(
        edge("sandbox::process::init", "sandbox::engine::run"),
        up("sandbox::process::init", "sandbox::engine::run")
    );
    // The public face is above every room.
    assert_eq!(
        edge("sandbox::process::zygote", "sandbox"),
        up("sandbox::process::zygote", "sandbox")
    );
    assert!(edge("sandbox::engine::run", "sandbox::kernel::clock").is_empty());
    assert!(edge("sandbox::isolate::usage", "sandbox::isolate::budget").is_empty());
    assert!(edge("sandbox::isolate::limits", "sandbox::runtime::python").is_empty());
    assert!(edge("sandbox", "sandbox::engine::start").is_empty());
    assert!(edge("node::job", "sandbox::engine::run").is_empty());
    let stray = std::panic::catch_unwind(|| edge("sandbox::stray", "sandbox::kernel::sys"));
    assert!(stray.is_err(), "a module in no room is refused");
}

/// The most lines a production function may take, signature to closing brace: past it, a
/// function wants named steps or a small state type.
const MAX_FUNCTION_LINES: usize = 150;

/// The functions of `text` (comments and strings already stripped by [`code`]) longer than
/// `max` lines, as `name (line N, L lines)`. Test code is left out: everything from the first
/// `#[cfg(test)]` on (a file's test module sits at its end).
fn long_functions(text: &str, max: usize) -> Vec<String> {
    let lines: Vec<&str> = text
        .lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .collect();
    let mut long = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(name) = function_name(lines[i]) else {
            i += 1;
            continue;
        };
        let (mut depth, mut opened, mut end) = (0i64, false, i);
        for (j, line) in lines.iter().enumerate().skip(i) {
            end = j;
            depth += line.matches('{').count() as i64 - line.matches('}').count() as i64;
            opened |= line.contains('{');
            if (opened && depth <= 0) || (!opened && line.trim_end().ends_with(';')) {
                break;
            }
        }
        let len = end - i + 1;
        if opened && len > max {
            long.push(format!("{name} (line {}, {len} lines)", i + 1));
        }
        i = end + 1;
    }
    long
}

/// The name of the function a line declares, if it declares one.
fn function_name(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    loop {
        let word = rest.split_whitespace().next()?;
        let qualifier = word == "pub"
            || word.starts_with("pub(")
            || matches!(word, "async" | "const" | "unsafe" | "extern" | "default");
        if !qualifier {
            break;
        }
        rest = rest[word.len()..].trim_start();
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(&rest[..end])
}

/// Whether module `name` is declared for tests only (`#[cfg(test)]` right above `mod x;` in
/// its parent).
fn test_only(modules: &BTreeMap<String, String>, name: &str) -> bool {
    let (parent, last) = name.rsplit_once("::").unwrap_or(("", name));
    let Some(text) = modules.get(parent) else {
        return false;
    };
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    lines.windows(2).any(|w| {
        w[0] == "#[cfg(test)]"
            && (w[1] == format!("mod {last};") || w[1] == format!("pub mod {last};"))
    })
}

#[test]
fn no_production_function_is_over_150_lines() {
    let mut long = Vec::new();
    for krate in ["worker", "queue", "loadgen", "bench"] {
        let modules = modules(&workspace().join(krate).join("src"));
        for (name, text) in &modules {
            if test_only(&modules, name) {
                continue;
            }
            for f in long_functions(&code(text), MAX_FUNCTION_LINES) {
                long.push(format!("{krate}: {name}::{f}"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_length_check_sees_a_long_function_and_skips_tests() {
    let body = "    x += 1;\n".repeat(5);
    let text = format!(
        "pub(crate) async fn long(x: u8) -> u8 {{\n{body}}}\nfn short() {{}}\n\
         trait T {{\n    fn declared(&self);\n}}\n#[cfg(test)]\nmod tests {{\n    fn t() {{\n{body}    }}\n}}\n"
    );
    assert_eq!(long_functions(&text, 6), ["long (line 1, 7 lines)"]);
    assert!(long_functions(&text, 7).is_empty());
    assert_eq!(function_name("    pub unsafe fn f<T>()"), Some("f"));
    assert_eq!(function_name("let fn_x = 1;"), None);
}
