//! `man/coorfs.1` and `docs/OPTIONS.md` are generated from the CLI; this fails when a
//! committed one is stale, and when the hand-written docs name an option the CLI lacks.
//! Regenerate with: UPDATE_MAN=1 cargo test --test it manpage::

use std::collections::HashSet;

use clap::CommandFactory;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/man/coorfs.1");
const OPTIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/OPTIONS.md");

/// Compares a generated file with the committed one (rewriting it first under UPDATE_MAN).
fn check_current(path: &str, want: &str) {
    if std::env::var_os("UPDATE_MAN").is_some() {
        std::fs::write(path, want).unwrap();
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "{path} is stale: run UPDATE_MAN=1 cargo test --test it manpage:: and commit it"
    );
}

#[test]
fn man_page_is_current() {
    check_current(PAGE, &coorfs::manpage::render());
}

#[test]
fn options_reference_is_current() {
    check_current(OPTIONS, &coorfs::manpage::options_markdown());
}

/// Every long option of every command appears in the man page and in docs/OPTIONS.md, and
/// the README names every command.
#[test]
fn every_option_is_documented() {
    let page = coorfs::manpage::render();
    let options = coorfs::manpage::options_markdown();
    let readme = read("README.md");
    let cli = coorfs::cli::Cli::command();
    for sub in cli.get_subcommands().filter(|s| !s.is_hide_set()) {
        assert!(
            readme.contains(&format!("coorfs {}", sub.get_name())),
            "README lacks coorfs {}",
            sub.get_name()
        );
        for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = arg.get_long() {
                if long == "help" {
                    continue;
                }
                let roff = format!("\\-\\-{}", long.replace('-', "\\-"));
                assert!(
                    page.contains(&roff),
                    "man page lacks --{long} of {}",
                    sub.get_name()
                );
                assert!(
                    options.contains(&format!("`--{long}")),
                    "docs/OPTIONS.md lacks --{long} of {}",
                    sub.get_name()
                );
            }
        }
    }
}

/// Long options of other programs that the hand-written docs show in their examples.
const NOT_COORFS: &[(&str, &str)] = &[
    ("help", "clap's own, on every command"),
    ("release", "cargo test --release"),
    ("test", "cargo test --test it AREA::"),
    ("data", "the example job's: python train.py --data DIR"),
    ("lr", "the example sweep's: python train.py --lr RATE"),
    ("only-values", "getfattr's"),
    ("destdir", "scripts/install.sh --destdir DIR"),
];

/// The docs written by hand that name options.
const HAND_WRITTEN: &[&str] = &["README.md", "docs/USAGE.md"];

fn read(doc: &str) -> String {
    std::fs::read_to_string(format!("{ROOT}/{doc}")).unwrap()
}

/// The `--name` words of a text (`--name*` as `name*`), skipping `--` alone, table rules and
/// dashes inside words.
fn long_options(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = text[i..].find("--") {
        let start = i + at;
        let before = start.checked_sub(1).map(|j| bytes[j]);
        let mut end = start + 2;
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'-')
        {
            end += 1;
        }
        let word_before =
            before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        let first = bytes.get(start + 2).copied();
        if !word_before && first.is_some_and(|b| b.is_ascii_lowercase()) {
            let mut name = text[start + 2..end].trim_end_matches('-').to_string();
            if bytes.get(end) == Some(&b'*') {
                name.push('*');
            }
            out.push(name);
        }
        i = end.max(start + 2);
    }
    out
}

#[test]
fn long_options_are_found() {
    assert_eq!(
        long_options("`--cache-size 8G` | --x --\n|---|---| a--b `--peer-tls-*` -- cmd"),
        ["cache-size", "x", "peer-tls*"]
    );
}

/// Every `--option` that README.md and docs/USAGE.md mention is an option of some coorfs
/// command (or one of [`NOT_COORFS`]): a renamed or removed option cannot leave stale docs.
#[test]
fn documented_options_exist() {
    let cli = coorfs::cli::Cli::command();
    let known: HashSet<String> = cli
        .get_subcommands()
        .flat_map(|sub| sub.get_arguments())
        .filter_map(|arg| arg.get_long().map(str::to_string))
        .chain(NOT_COORFS.iter().map(|(name, _)| name.to_string()))
        .collect();
    let mut unknown = Vec::new();
    for doc in HAND_WRITTEN {
        let text = read(doc);
        let found = long_options(&text);
        assert!(
            found.len() > 10,
            "{doc}: only {} options found",
            found.len()
        );
        for name in found {
            let exists = match name.strip_suffix('*') {
                Some(prefix) => known.iter().any(|k| k.starts_with(prefix)),
                None => known.contains(&name),
            };
            if !exists {
                unknown.push(format!("{doc}: --{name}"));
            }
        }
    }
    unknown.sort();
    unknown.dedup();
    assert!(
        unknown.is_empty(),
        "options that no coorfs command has (rename them, or add another program's to \
NOT_COORFS):\n{}",
        unknown.join("\n")
    );
}
