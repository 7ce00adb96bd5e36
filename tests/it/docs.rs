//! The README and docs/ link to each other's sections; a renamed heading or a moved section
//! must not leave a link pointing nowhere. Every relative link of README.md and of the docs
//! in `DOCS` names a file of the repository and, with `#anchor`, a heading of it (GitHub's
//! anchors: lower case, punctuation dropped, spaces as hyphens).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const DOCS: &[&str] = &[
    "README.md",
    "docs/DESIGN.md",
    "docs/BENCHMARKS.md",
    "docs/USAGE.md",
    "docs/OPTIONS.md",
    "docs/LAYOUT.md",
];

/// The anchor GitHub gives a heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> HashSet<String> {
    let mut in_code = false;
    let mut out = HashSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of `[text](target)` links.
fn links(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(target, _)| target.to_string()))
        .collect()
}

#[test]
fn every_link_of_the_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in DOCS {
        let path = Path::new(ROOT).join(doc);
        let text = std::fs::read_to_string(&path).unwrap();
        for target in links(&text) {
            if target.contains("://") || target.contains(' ') {
                continue;
            }
            checked += 1;
            let (file, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let file: PathBuf = if file.is_empty() {
                path.clone()
            } else {
                path.parent().unwrap().join(file)
            };
            let Ok(linked) = std::fs::read_to_string(&file) else {
                broken.push(format!("{doc}: {target} (no such file)"));
                continue;
            };
            if !fragment.is_empty() && !anchors(&linked).contains(fragment) {
                broken.push(format!("{doc}: {target} (no such heading)"));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked > 20,
        "only {checked} links found: is the parser right?"
    );
}

#[test]
fn anchors_follow_github() {
    assert_eq!(
        anchor(" Prefetch and order hints (`scripts/bench-epochs.sh prefetch`)"),
        "prefetch-and-order-hints-scriptsbench-epochssh-prefetch"
    );
    assert_eq!(anchor("Memory: one budget"), "memory-one-budget");
}
