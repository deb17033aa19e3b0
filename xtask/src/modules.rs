//! The module layering rule: within a crate, sibling modules never import each other in a
//! circle. For each module that has children (the crate root, `operations/`, `store/`, ...), the
//! edges between its children must form a DAG, where an edge `a -> b` means some file under `a`
//! names a path under `b` (`crate::b::…` or, from a sibling file, `super::b::…`). A parent and
//! its own children may name each other (re-exports, `super::Item`): that is how Rust modules
//! share items, not a cycle between components.
//!
//! The scan reads source text, not a parsed syntax tree: comments and string literals are blanked
//! first, then every `crate::`/`super::` path is read, brace groups included
//! (`crate::{a::X, b::{c, d}}`). A path resolves to the longest module it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A module path inside a crate: `[]` is the root, `["operations", "core"]` is
/// `operations/core.rs`.
type ModPath = Vec<String>;

/// The module a file defines, from its path relative to the crate's `src/`; `None` for files
/// that are their own crate roots (`bin/`).
pub fn module_of(relative: &str) -> Option<ModPath> {
    let relative = relative.strip_suffix(".rs")?;
    let mut parts: Vec<String> = relative.split('/').map(str::to_owned).collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    Some(parts)
}

/// `text` with `//` and `/* */` comments and the contents of string and char literals replaced
/// by spaces, so that a path inside either is not read as an import.
fn blank_non_code(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        if rest.starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            while i < bytes.len() {
                if bytes[i..].starts_with(b"/*") {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if bytes[i..].starts_with(b"*/") {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(if bytes[i] == b'\n' { b'\n' } else { b' ' });
                    i += 1;
                }
            }
        } else if rest.starts_with(b"r#\"") || rest.starts_with(b"r\"") {
            // Raw string: r"..." or r#"..."#.
            let hashes = rest[1..].iter().take_while(|&&b| b == b'#').count();
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let start = i + 2 + hashes;
            out.extend(std::iter::repeat_n(b' ', 2 + hashes));
            i = start;
            while i < bytes.len() && !bytes[i..].starts_with(&close) {
                out.push(b' ');
                i += 1;
            }
            out.extend(std::iter::repeat_n(b' ', close.len().min(bytes.len() - i)));
            i += close.len();
        } else if bytes[i] == b'"' {
            out.push(b' ');
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                if bytes[i] == b'\\' {
                    out.push(b' ');
                    i += 1;
                }
                if i < bytes.len() {
                    out.push(b' ');
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if bytes[i] == b'\'' && rest.len() >= 3 && (rest[2] == b'\'' || rest[1] == b'\\') {
            // A char literal ('a', '\n', '\''); a lifetime ('a) has no closing quote.
            let end = rest[2..]
                .iter()
                .position(|&b| b == b'\'')
                .map_or(rest.len(), |p| p + 3);
            out.extend(std::iter::repeat_n(b' ', end));
            i += end;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Every path that starts at `anchor` (`crate` or `super`) in `code`, as its segments after the
/// anchor, with brace groups expanded.
fn paths_from(code: &str, anchor: &str) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let needle = format!("{anchor}::");
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(pos) = code[from..].find(&needle) {
        let at = from + pos;
        from = at + needle.len();
        if at > 0 && (is_ident_byte(bytes[at - 1]) || bytes[at - 1] == b':') {
            continue; // `foo_crate::`, or `super::super::` (the inner one) etc.
        }
        let mut i = from;
        read_tree(bytes, &mut i, Vec::new(), &mut out);
    }
    out
}

/// Reads one use-tree at `*i` (segments `a::b::…`, possibly ending in `{…}`), pushing every
/// complete path (prefix plus its own segments) into `out`.
fn read_tree(bytes: &[u8], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    loop {
        while *i < bytes.len() && bytes[*i].is_ascii_whitespace() {
            *i += 1;
        }
        if *i < bytes.len() && bytes[*i] == b'{' {
            *i += 1;
            loop {
                while *i < bytes.len() && (bytes[*i].is_ascii_whitespace() || bytes[*i] == b',') {
                    *i += 1;
                }
                if *i >= bytes.len() || bytes[*i] == b'}' {
                    *i += 1;
                    return;
                }
                let before = *i;
                read_tree(bytes, i, path.clone(), out);
                if *i == before {
                    *i += 1; // not a path (`*`, `self`): step over it
                }
                // Skip `as alias` and anything else up to the next item or the group's end.
                while *i < bytes.len() && bytes[*i] != b',' && bytes[*i] != b'}' {
                    if bytes[*i] == b'{' {
                        read_tree(bytes, i, path.clone(), out);
                    } else {
                        *i += 1;
                    }
                }
            }
        }
        let start = *i;
        while *i < bytes.len() && is_ident_byte(bytes[*i]) {
            *i += 1;
        }
        if start == *i {
            if !path.is_empty() {
                out.push(path);
            }
            return;
        }
        path.push(String::from_utf8_lossy(&bytes[start..*i]).into_owned());
        if bytes[*i..].starts_with(b"::") {
            *i += 2;
        } else {
            out.push(path);
            return;
        }
    }
}

/// Names a module brings into scope with `use` (`pub use a::X;` in `lib.rs` makes `crate::X`
/// name `a`'s item): (the module plus the name) to the absolute path it stands for.
type Imports = BTreeMap<ModPath, Vec<String>>;

/// The longest known module that `path` (absolute segments) names, following names a module
/// imports: `crate::X` where the root has `pub use a::X` names module `a`, so that a circle
/// closed through a re-export is seen.
fn resolve(path: &[String], modules: &BTreeSet<ModPath>, imports: &Imports) -> ModPath {
    let mut path = path.to_vec();
    // Each step replaces an imported name by a longer-lived path; a `use` circle (which rustc
    // refuses anyway) stops after as many steps as there are imports.
    for _ in 0..=imports.len() {
        let module = (0..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| modules.contains(p))
            .unwrap_or_default();
        if module.len() == path.len() {
            return module;
        }
        let mut key = module.clone();
        key.push(path[module.len()].clone());
        match imports.get(&key) {
            Some(target) if !target.starts_with(&key) => {
                let mut next = target.clone();
                next.extend_from_slice(&path[module.len() + 1..]);
                path = next;
            }
            _ => return module,
        }
    }
    ModPath::new()
}

/// The names each module imports with `use` (see [`Imports`]), with the absolute path each
/// stands for. Globs are left out (they name no item), and so is a rename inside a brace
/// group, which is read under the item's own name.
fn imports_of(files: &[(String, String)]) -> Imports {
    let mut imports = Imports::new();
    for (file, text) in files {
        let Some(me) = module_of(file) else { continue };
        let code = blank_non_code(text);
        let bytes = code.as_bytes();
        let mut from = 0;
        while let Some(pos) = code[from..].find("use ") {
            let at = from + pos;
            from = at + 4;
            if at > 0 && is_ident_byte(bytes[at - 1]) {
                continue;
            }
            let mut i = from;
            let mut paths = Vec::new();
            read_tree(bytes, &mut i, Vec::new(), &mut paths);
            // `use a::X as Y;` names Y.
            let rest = code[i..].trim_start();
            let alias = rest
                .strip_prefix("as ")
                .map(|r| {
                    r.trim_start()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect::<String>()
                })
                .filter(|a| !a.is_empty());
            let single = paths.len() == 1;
            for p in paths {
                let Some(absolute) = absolute_path(&me, &p) else {
                    continue;
                };
                let Some(last) = p.last() else { continue };
                let name = match (&alias, single) {
                    (Some(a), true) => a.clone(),
                    _ => last.clone(),
                };
                if name == "self" {
                    continue;
                }
                let mut key = me.clone();
                key.push(name);
                imports.entry(key).or_insert(absolute);
            }
        }
    }
    imports
}

/// `path` as written in module `me` made absolute: `crate::…` from the root, `self::…` and a
/// plain path (a child module) from `me`, `super::…` from its parent; `None` for a path into
/// another crate (it starts with no module of this one, which the caller cannot tell, so a
/// plain path is taken as a child's).
fn absolute_path(me: &[String], path: &[String]) -> Option<Vec<String>> {
    let (first, rest) = path.split_first()?;
    Some(match first.as_str() {
        "crate" => rest.to_vec(),
        "self" => me.iter().chain(rest).cloned().collect(),
        "super" => {
            let (_, parent) = me.split_last()?;
            parent.iter().chain(rest).cloned().collect()
        }
        "std" | "core" | "alloc" => return None,
        _ => me.iter().chain(path).cloned().collect(),
    })
}

/// One import between sibling modules: under `parent`, `from` names `to`, first seen in `file`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiblingEdge {
    pub parent: ModPath,
    pub from: String,
    pub to: String,
    pub file: String,
}

/// The edges between sibling modules of one crate, given its files as (path relative to `src/`,
/// text).
pub fn sibling_edges(files: &[(String, String)]) -> Vec<SiblingEdge> {
    let modules: BTreeSet<ModPath> = files.iter().filter_map(|(f, _)| module_of(f)).collect();
    let imports = imports_of(files);
    let mut seen = BTreeSet::new();
    let mut edges = Vec::new();
    for (file, text) in files {
        let Some(me) = module_of(file) else { continue };
        let code = blank_non_code(text);
        let mut targets: Vec<ModPath> = paths_from(&code, "crate")
            .iter()
            .map(|p| resolve(p, &modules, &imports))
            .collect();
        // From `a/b.rs`, `super::c::…` is the sibling `a::c`; from a `mod.rs` it is the parent's
        // sibling. (Inside an inline `mod tests`, `super::` is the file's own module, which
        // resolves to no sibling module unless an item shares a module's name.)
        if let Some((_, parent)) = me.split_last() {
            for p in paths_from(&code, "super") {
                let mut abs = parent.to_vec();
                abs.extend(p);
                targets.push(resolve(&abs, &modules, &imports));
            }
        }
        for to in targets {
            let common = me.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == me.len() || common == to.len() {
                continue; // the same module, an ancestor or a descendant
            }
            let edge = (
                me[..common].to_vec(),
                me[common].clone(),
                to[common].clone(),
            );
            if seen.insert(edge.clone()) {
                edges.push(SiblingEdge {
                    parent: edge.0,
                    from: edge.1,
                    to: edge.2,
                    file: file.clone(),
                });
            }
        }
    }
    edges
}

/// The groups of sibling modules that import each other in a circle (strongly connected
/// components of more than one module), each as (parent, members sorted).
pub fn cycles(edges: &[SiblingEdge]) -> Vec<(ModPath, Vec<String>)> {
    let mut by_parent: BTreeMap<&ModPath, BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
    for e in edges {
        let graph = by_parent.entry(&e.parent).or_default();
        graph.entry(&e.from).or_default().insert(&e.to);
        graph.entry(&e.to).or_default();
    }
    let mut out = Vec::new();
    for (parent, graph) in by_parent {
        // Two nodes share a component when each reaches the other.
        let reach = |from: &str| {
            let mut seen = BTreeSet::new();
            let mut stack = vec![from];
            while let Some(n) = stack.pop() {
                for &m in &graph[n] {
                    if seen.insert(m) {
                        stack.push(m);
                    }
                }
            }
            seen
        };
        let reaches: BTreeMap<&str, BTreeSet<&str>> =
            graph.keys().map(|&n| (n, reach(n))).collect();
        let mut placed = BTreeSet::new();
        for &n in graph.keys() {
            if placed.contains(n) {
                continue;
            }
            let members: Vec<String> = graph
                .keys()
                .filter(|&&m| m == n || (reaches[n].contains(m) && reaches[m].contains(n)))
                .map(|m| m.to_string())
                .collect();
            for m in &members {
                placed.insert(m.clone());
            }
            if members.len() > 1 {
                out.push((parent.clone(), members));
            }
        }
    }
    out
}

/// Every module cycle in the crate whose sources are under `src`, described for a person.
pub fn check_crate(src: &Path, files: &[(String, String)]) -> Vec<String> {
    let edges = sibling_edges(files);
    let shown = src.display().to_string();
    cycles(&edges)
        .iter()
        .map(|(parent, members)| {
            let within = if parent.is_empty() {
                "the crate root".to_owned()
            } else {
                format!("`{}`", parent.join("::"))
            };
            let how: Vec<String> = edges
                .iter()
                .filter(|e| {
                    &e.parent == parent && members.contains(&e.from) && members.contains(&e.to)
                })
                .map(|e| format!("{} -> {} ({})", e.from, e.to, e.file))
                .collect();
            format!(
                "{shown}: modules {} under {within} import each other in a circle: {}",
                members.join(", "),
                how.join("; ")
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(f, t)| (f.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn files_map_to_modules() {
        assert_eq!(module_of("lib.rs"), Some(vec![]));
        assert_eq!(module_of("store/mod.rs"), Some(vec!["store".to_owned()]));
        assert_eq!(
            module_of("store/pins.rs"),
            Some(vec!["store".to_owned(), "pins".to_owned()])
        );
        assert_eq!(module_of("bin/tool.rs"), None);
    }

    #[test]
    fn brace_groups_comments_and_strings_are_read_as_code_is() {
        let code = blank_non_code(
            "use crate::{a::X, b::{c, d as e}, *};\n// crate::hidden::Y\n\
             let s = \"crate::in_string\"; let r = r#\"crate::raw\"#; let c = 'x';\n\
             fn f<'a>(x: &'a crate::f::T) {}",
        );
        let got: BTreeSet<Vec<String>> = paths_from(&code, "crate").into_iter().collect();
        let want: BTreeSet<Vec<String>> = [
            vec!["a", "X"],
            vec!["b", "c"],
            vec!["b", "d"],
            vec!["f", "T"],
        ]
        .iter()
        .map(|p| p.iter().map(|s| s.to_string()).collect())
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_circle_between_siblings_is_found_and_a_parent_child_pair_is_not() {
        let crate_files = files(&[
            ("lib.rs", "pub mod a; pub mod b; pub mod c; pub use a::A;"),
            ("a.rs", "use crate::b::B; pub struct A;"),
            ("b.rs", "use crate::c::C; pub struct B;"),
            ("c.rs", "pub struct C(crate::a::A);"),
        ]);
        let found = cycles(&sibling_edges(&crate_files));
        assert_eq!(
            found,
            vec![(vec![], vec!["a".to_owned(), "b".to_owned(), "c".to_owned()])]
        );
        // A parent's mod.rs re-exporting a child, and the child using the parent's items,
        // is not a circle; nor is a chain.
        let fine = files(&[
            ("lib.rs", "pub mod ops; pub mod reg;"),
            (
                "ops/mod.rs",
                "mod core; pub use self::core::Core; pub struct Cfg;",
            ),
            (
                "ops/core.rs",
                "use super::Cfg; use crate::reg::Reg; pub struct Core;",
            ),
            ("reg.rs", "pub struct Reg;"),
        ]);
        assert_eq!(cycles(&sibling_edges(&fine)), Vec::new());
    }

    #[test]
    fn a_circle_closed_through_a_crate_root_re_export_is_found() {
        let crate_files = files(&[
            (
                "lib.rs",
                "pub mod crash; pub mod error;\npub use crash::{CrashError, Other};\n\
                 pub use self::error::HostError as Error;",
            ),
            (
                "error.rs",
                "pub enum HostError { Crash(crate::CrashError) }",
            ),
            (
                "crash.rs",
                "pub struct CrashError; fn f() -> crate::Error { todo!() }",
            ),
        ]);
        let found = cycles(&sibling_edges(&crate_files));
        assert_eq!(
            found,
            vec![(vec![], vec!["crash".to_owned(), "error".to_owned()])]
        );
        // Through the re-export in one direction only: a chain, not a circle.
        let chain = files(&[
            (
                "lib.rs",
                "pub mod crash; pub mod error; pub use crash::CrashError;",
            ),
            (
                "error.rs",
                "pub enum HostError { Crash(crate::CrashError) }",
            ),
            ("crash.rs", "pub struct CrashError; use std::fmt;"),
        ]);
        assert_eq!(cycles(&sibling_edges(&chain)), Vec::new());
    }

    #[test]
    fn a_circle_through_super_between_nested_siblings_is_found() {
        let crate_files = files(&[
            ("lib.rs", "pub mod store;"),
            ("store/mod.rs", "mod commit; mod pins;"),
            ("store/commit.rs", "use super::pins::hold;"),
            ("store/pins.rs", "use crate::store::commit::Txn;"),
        ]);
        let found = cycles(&sibling_edges(&crate_files));
        assert_eq!(
            found,
            vec![(
                vec!["store".to_owned()],
                vec!["commit".to_owned(), "pins".to_owned()]
            )]
        );
    }
}
