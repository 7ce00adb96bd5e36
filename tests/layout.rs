//! The source tree reads top to bottom: `cli` -> `daemon` -> `fuse` -> `fs` -> `tier` -> the
//! cache, the cluster's wire and the source, with `jobs` and `prefetch` told of what happens.
//! A module that reaches back up to one that uses it makes the two one tangle that must be
//! read (and changed) together. This test fails on any circle between the crate's top-level
//! modules (a folder of src/ or a file of it), and names the `use` that closes it.
//!
//! What counts is a `crate::NAME` path in code outside `#[cfg(test)]` and comments (doc links
//! included in neither): tests may reach anywhere, and a doc link is no dependency.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// A use of one module by another: where it is written.
type Uses = BTreeMap<String, BTreeMap<String, String>>;

/// The top-level module of a file of src/ (`fs/read.rs` -> `fs`, `daemon.rs` -> `daemon`).
fn module_of(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// Every file of `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules that `text` names as `crate::NAME`, outside comments and before
/// its `#[cfg(test)]` module, each with the first line that names it.
fn named_modules(text: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        let code = line.split("//").next().unwrap();
        for (at, _) in code.match_indices("crate::") {
            let name: String = code[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && !out.iter().any(|(n, _)| *n == name) {
                out.push((name, i + 1));
            }
        }
    }
    out
}

fn crate_uses() -> Uses {
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    let mut uses = Uses::new();
    for file in files {
        let rel = file.strip_prefix(SRC).unwrap();
        let from = module_of(rel);
        if from == "main" {
            continue; // the binary: it sees the library from outside, as `coorfs::`
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (to, line) in named_modules(&text) {
            if to != from {
                let at = format!("src/{}:{line}", rel.display());
                uses.entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_insert(at);
            }
        }
    }
    uses
}

/// A path of uses from `from` back to `to`, if there is one.
fn path_back(
    uses: &Uses,
    from: &str,
    to: &str,
    seen: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if from == to {
        return Some(vec![to.to_string()]);
    }
    if !seen.insert(from.to_string()) {
        return None;
    }
    for next in uses.get(from).into_iter().flat_map(|m| m.keys()) {
        if let Some(mut rest) = path_back(uses, next, to, seen) {
            rest.insert(0, from.to_string());
            return Some(rest);
        }
    }
    None
}

#[test]
fn no_module_reaches_back_up() {
    let uses = crate_uses();
    // The graph is not empty: the parse found the crate's structure.
    assert!(uses.get("daemon").is_some_and(|m| m.contains_key("fs")));
    assert!(uses.get("fuse").is_some_and(|m| m.contains_key("fs")));
    let mut circles = Vec::new();
    for (from, tos) in &uses {
        for (to, at) in tos {
            if let Some(back) = path_back(&uses, to, from, &mut BTreeSet::new()) {
                circles.push(format!("{from} -> {} ({at})", back.join(" -> ")));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "modules in a circle:\n{}",
        circles.join("\n")
    );
}

#[test]
fn a_circle_is_found() {
    let mut uses = Uses::new();
    let edge = |uses: &mut Uses, a: &str, b: &str| {
        uses.entry(a.into())
            .or_default()
            .insert(b.into(), "here".into());
    };
    edge(&mut uses, "a", "b");
    edge(&mut uses, "b", "c");
    assert_eq!(path_back(&uses, "b", "a", &mut BTreeSet::new()), None);
    edge(&mut uses, "c", "a");
    assert_eq!(
        path_back(&uses, "b", "a", &mut BTreeSet::new()),
        Some(vec!["b".into(), "c".into(), "a".into()])
    );
}

#[test]
fn comments_and_tests_are_no_uses() {
    let text = "use crate::fs::X;\n//! see [`crate::daemon`]\nlet y = crate::tier::get(); // crate::jobs\n#[cfg(test)]\nuse crate::cli;\n";
    let names: Vec<String> = named_modules(text).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["fs", "tier"]);
}
