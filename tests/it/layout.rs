//! The source tree reads top to bottom: `cli` -> `daemon` -> `fuse` -> `fs` -> `tier` -> the
//! cache, the cluster's wire and the source, with `jobs` and `prefetch` told of what happens.
//! A module that reaches back up to one that uses it makes the two one tangle that must be
//! read (and changed) together. This test fails on any circle between the crate's top-level
//! modules (a folder of src/ or a file of it), and on one between the files of a folder
//! (`super::NAME`; the folder's `mod.rs`, which declares them, aside), and names the `use`
//! that closes it.
//!
//! What counts is a `crate::NAME` path in code: not in comments (doc links included) or
//! literals, nor in an item under `#[cfg(test)]` (the `mod tests` block, a test-only field,
//! fn or statement), whose end is found by brackets. Tests may reach anywhere, and a doc
//! link is no dependency; the code after a test item is read like the code before it.
//!
//! docs/LAYOUT.md is the tree's map: one line for each file of src/, scripts/ and tests/
//! (a list item: the path in backquotes, a colon, what it owns). This fails when it misses
//! a file or names one that is not there.

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

/// Blanks `chars[from..to]`: each char but a newline becomes a space, so that lines keep their
/// numbers.
fn blank(chars: &mut [char], from: usize, to: usize) {
    let to = to.min(chars.len());
    for c in &mut chars[from.min(to)..to] {
        if *c != '\n' {
            *c = ' ';
        }
    }
}

/// `text` with its comments and the insides of its string and char literals blanked: what is
/// left is code.
fn code_only(text: &str) -> Vec<char> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = chars.clone();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let word_starts = |i: usize| i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        // A raw string, r"..." or br#"..."#: no escapes, ended by a quote and as many #.
        let hashes = (i + 1..chars.len())
            .take_while(|&j| chars[j] == '#')
            .count();
        let raw = c == 'r'
            && at(i + 1 + hashes) == '"'
            && (word_starts(i) || (at(i.wrapping_sub(1)) == 'b' && word_starts(i - 1)));
        if c == '/' && at(i + 1) == '/' {
            let end = (i..chars.len())
                .find(|&j| chars[j] == '\n')
                .unwrap_or(chars.len());
            blank(&mut out, i, end);
            i = end;
        } else if c == '/' && at(i + 1) == '*' {
            // Block comments nest.
            let (mut j, mut depth) = (i + 2, 1);
            while j < chars.len() && depth > 0 {
                if chars[j] == '/' && at(j + 1) == '*' {
                    (depth, j) = (depth + 1, j + 1);
                } else if chars[j] == '*' && at(j + 1) == '/' {
                    (depth, j) = (depth - 1, j + 1);
                }
                j += 1;
            }
            blank(&mut out, i, j);
            i = j;
        } else if raw {
            let open = i + 1 + hashes;
            let mut j = open + 1;
            while j < chars.len() && !(chars[j] == '"' && (1..=hashes).all(|k| at(j + k) == '#')) {
                j += 1;
            }
            blank(&mut out, open + 1, j);
            i = j + 1 + hashes;
        } else if c == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i + 1, j);
            i = j + 1;
        } else if c == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A char literal ('{', '\'', '\u{7b}'); a lifetime ('a) has no closing quote.
            let mut j = if at(i + 1) == '\\' { i + 3 } else { i + 2 };
            while j < chars.len() && chars[j] != '\'' {
                j += 1;
            }
            blank(&mut out, i + 1, j);
            i = j + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// `code` (from [`code_only`]) with each item under `#[cfg(test)]` blanked: the attribute and
/// what follows it up to a `;` or `,` outside brackets (a `use`, a field, a statement), or to
/// the `}` that closes its body (a `mod tests`, a fn, an impl, a block), or to the bracket
/// that closes around it. What this misreads ends too early, so that test code counts as
/// code: a false circle, never a use missed.
fn without_test_items(mut code: Vec<char>) -> Vec<char> {
    let attr: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + attr.len() <= code.len() {
        if code[i..i + attr.len()] != attr[..] {
            i += 1;
            continue;
        }
        let mut depth = 0usize;
        let mut end = code.len();
        for (j, &c) in code.iter().enumerate().skip(i + attr.len()) {
            match c {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' if depth == 0 => {
                    end = j;
                    break;
                }
                ')' | ']' | '}' => {
                    depth -= 1;
                    if depth == 0 && c == '}' {
                        end = j + 1;
                        break;
                    }
                }
                ';' | ',' if depth == 0 => {
                    end = j + 1;
                    break;
                }
                _ => {}
            }
        }
        blank(&mut code, i, end);
        i = end;
    }
    code
}

/// The top-level modules that `text` names as `crate::NAME` in its code (not in comments,
/// literals or items under `#[cfg(test)]`), each with the first line that names it.
fn named_modules(text: &str) -> Vec<(String, usize)> {
    named_after(text, &["crate::"])
}

/// The names that follow one of `prefixes` in `text`'s code (as [`named_modules`]), each with
/// the first line that names it; in a group (`super::{a::X, B}`) the names followed by `::`.
fn named_after(text: &str, prefixes: &[&str]) -> Vec<(String, usize)> {
    let code: String = without_test_items(code_only(text)).into_iter().collect();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out: Vec<(String, usize)> = Vec::new();
    let mut add = |name: String, line: usize| {
        if !name.is_empty() && !out.iter().any(|(n, _)| *n == name) {
            out.push((name, line));
        }
    };
    for (i, code) in code.lines().enumerate() {
        for prefix in prefixes {
            for (at, _) in code.match_indices(prefix) {
                let rest = &code[at + prefix.len()..];
                if let Some(group) = rest.strip_prefix('{') {
                    let group = &group[..group.find('}').unwrap_or(group.len())];
                    for part in group.split(',') {
                        let part = part.trim();
                        let name = ident(part);
                        if part[name.len()..].starts_with("::") {
                            add(name, i + 1);
                        }
                    }
                } else {
                    add(ident(rest), i + 1);
                }
            }
        }
    }
    out
}

/// Within each folder of src/, the uses of one file by its siblings (`super::NAME`,
/// `crate::FOLDER::NAME`), keyed `FOLDER/FILE`; the folder's `mod.rs`, which declares and
/// dispatches to them, is not one of them.
fn sibling_uses() -> Uses {
    let mut uses = Uses::new();
    for entry in std::fs::read_dir(SRC).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        let folder = dir.file_name().unwrap().to_string_lossy().to_string();
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        let stem = |f: &Path| f.file_stem().unwrap().to_string_lossy().to_string();
        let siblings: BTreeSet<String> = files
            .iter()
            .filter(|f| f.parent() == Some(dir.as_path()))
            .map(|f| stem(f))
            .filter(|s| s != "mod")
            .collect();
        for file in files.iter().filter(|f| f.parent() == Some(dir.as_path())) {
            let from = stem(file);
            if from == "mod" {
                continue;
            }
            let text = std::fs::read_to_string(file).unwrap();
            let own = format!("crate::{folder}::");
            for (to, line) in named_after(&text, &["super::", &own]) {
                if to != from && siblings.contains(&to) {
                    uses.entry(format!("{folder}/{from}"))
                        .or_default()
                        .entry(format!("{folder}/{to}"))
                        .or_insert(format!("src/{folder}/{from}.rs:{line}"));
                }
            }
        }
    }
    uses
}

/// Every circle in `uses`, each as the `use` that closes it and the way back.
fn circles(uses: &Uses) -> Vec<String> {
    let mut circles = Vec::new();
    for (from, tos) in uses {
        for (to, at) in tos {
            if let Some(back) = path_back(uses, to, from, &mut BTreeSet::new()) {
                circles.push(format!("{from} -> {} ({at})", back.join(" -> ")));
            }
        }
    }
    circles
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
    let circles = circles(&uses);
    assert!(
        circles.is_empty(),
        "modules in a circle:\n{}",
        circles.join("\n")
    );
}

#[test]
fn no_file_reaches_back_to_a_sibling_that_uses_it() {
    let uses = sibling_uses();
    // The parse found the folders' files: the opener plans with plan.rs.
    assert!(
        uses.get("fs/open")
            .is_some_and(|m| m.contains_key("fs/plan")),
        "{uses:?}"
    );
    let circles = circles(&uses);
    assert!(
        circles.is_empty(),
        "files of one folder in a circle:\n{}",
        circles.join("\n")
    );
}

/// The fields of `struct NAME` in `text` (a declaration of one field a line).
fn struct_fields(text: &str, name: &str) -> Vec<String> {
    let start = format!("pub struct {name} {{");
    let Some(body) = text.split(&start).nth(1) else {
        return Vec::new();
    };
    let body = body.split("\n}").next().unwrap_or("");
    body.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//") && !l.is_empty())
        .filter_map(|l| l.split_once(':').map(|(f, _)| f.to_string()))
        .collect()
}

#[test]
fn the_core_holds_its_state_in_at_most_ten_parts() {
    // A coordinator over parts of one concern each (src/fs/mod.rs): every new piece of state
    // belongs to one of them, not beside them.
    let text = std::fs::read_to_string(Path::new(ROOT).join("src/fs/mod.rs")).unwrap();
    let fields = struct_fields(&text, "DatasetFs");
    assert!(fields.contains(&"opener".to_string()), "{fields:?}");
    assert!(
        fields.len() <= 10,
        "DatasetFs has {} fields: {fields:?}",
        fields.len()
    );
}

#[test]
fn a_sibling_is_found_alone_and_in_a_group() {
    let text =
        "use super::{DatasetFs, open::Accessed, plan::{A, B}};\nfn f() { super::read::x() }\n";
    assert_eq!(
        named_after(text, &["super::"]),
        vec![("open".into(), 1), ("plan".into(), 1), ("read".into(), 2)]
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

/// Only the item under `#[cfg(test)]` is skipped, however its braces are written, and the
/// code after it counts, with its own line numbers.
#[test]
fn only_the_test_item_is_skipped() {
    let text = r##"struct S {
    #[cfg(test)]
    fail: crate::a::Flag,
    ok: u8,
}
fn f() {
    #[cfg(test)]
    if crate::b::fails() {
        return;
    }
    crate::c::go();
}
#[cfg(test)]
impl S {
    fn g() -> u8 { let s = "}}{"; let c = '}'; /* } */ crate::d::x(s, c) }
}
#[cfg(test)]
mod tests {
    use crate::e;
    // a brace in a comment: }
    const CLOSE: char = '}';
    const ESCAPED: char = '\'';
    const TEXT: &str = "} \" }";
    const RAW: &str = r"}\";
    fn h<'a>(x: &'a str) -> &'a str { x }
    #[cfg(test)]
    fn nested() { crate::f::x() }
}
use crate::g::Y;
const NOT_A_TEST: &str = "#[cfg(test)] {";
/* a /* nested */ block comment naming crate::h */
fn last() { crate::i::z() }
"##;
    let names: Vec<(String, usize)> = named_modules(text);
    let want = [("c", 11), ("g", 29), ("i", 32)];
    let want: Vec<(String, usize)> = want.iter().map(|&(n, l)| (n.to_string(), l)).collect();
    assert_eq!(names, want);
}

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The files docs/LAYOUT.md must name: every `.rs` file of `src/`, every file of `scripts/`,
/// and the files of `tests/` and of its folders (`it/`, `it/common/`, `python/`), as paths from the
/// repository root. Caches (`__pycache__`) and hidden files are none of them.
fn files_to_name() -> BTreeSet<String> {
    fn walk(dir: &Path, depth: usize, keep: &dyn Fn(&Path) -> bool, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "__pycache__" || name.ends_with(".pyc") {
                continue;
            }
            if path.is_dir() {
                if depth > 0 {
                    walk(&path, depth - 1, keep, out);
                }
            } else if keep(&path) {
                let rel = path.strip_prefix(ROOT).unwrap();
                out.insert(rel.to_string_lossy().into_owned());
            }
        }
    }
    let root = Path::new(ROOT);
    let mut out = BTreeSet::new();
    walk(&root.join("src"), usize::MAX, &|_| true, &mut out);
    walk(&root.join("scripts"), 0, &|_| true, &mut out);
    walk(&root.join("tests"), 2, &|_| true, &mut out);
    out
}

/// What a layout page says is wrong: files it does not name, names of files that are not
/// there, files named twice, and entries that are not one line of `path`: what it owns.
fn layout_faults(page: &str, files: &BTreeSet<String>) -> Vec<String> {
    let mut faults = Vec::new();
    let mut named = BTreeMap::<String, usize>::new();
    let lines: Vec<&str> = page.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.strip_prefix("- `") else {
            continue;
        };
        let Some((path, what)) = rest.split_once('`') else {
            continue;
        };
        *named.entry(path.to_string()).or_default() += 1;
        let what = what.split_once(':').map_or("", |(_, w)| w.trim());
        let wrapped = lines.get(i + 1).is_some_and(|next| next.starts_with(' '));
        if what.is_empty() || wrapped {
            faults.push(format!(
                "not one line of `{path}`: what it owns (line {})",
                i + 1
            ));
        }
    }
    for file in files {
        if !named.contains_key(file) {
            faults.push(format!("missing: {file}"));
        }
    }
    for (path, times) in &named {
        if !files.contains(path) {
            faults.push(format!("no such file: {path}"));
        } else if *times > 1 {
            faults.push(format!("named {times} times: {path}"));
        }
    }
    faults
}

#[test]
fn the_layout_names_every_file() {
    let page = std::fs::read_to_string(Path::new(ROOT).join("docs/LAYOUT.md")).unwrap();
    let files = files_to_name();
    assert!(files.contains("src/lib.rs") && files.contains("scripts/test.sh"));
    let faults = layout_faults(&page, &files);
    assert!(
        faults.is_empty(),
        "docs/LAYOUT.md: one line for each file of src/, scripts/ and tests/:\n{}",
        faults.join("\n")
    );
}

#[test]
fn layout_faults_are_named() {
    let files: BTreeSet<String> = ["src/a.rs", "src/b.rs", "src/c.rs"]
        .map(String::from)
        .into();
    let page = "Intro naming `src/gone.rs` in prose.\n\
        - `src/a.rs`: the a.\n\
        - `src/a.rs`: the a again.\n\
        - `src/b.rs`: the b, wrapped\n  onto a second line.\n\
        - `src/gone.rs`: a file that left.\n";
    assert_eq!(
        layout_faults(page, &files),
        [
            "not one line of `src/b.rs`: what it owns (line 4)",
            "missing: src/c.rs",
            "named 2 times: src/a.rs",
            "no such file: src/gone.rs",
        ]
    );
}
