//! `man/coorfs.1` and `docs/OPTIONS.md` are generated from the CLI; this fails when a
//! committed one is stale.
//! Regenerate with: UPDATE_MAN=1 cargo test --test manpage

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
        "{path} is stale: run UPDATE_MAN=1 cargo test --test manpage and commit it"
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

fn read(doc: &str) -> String {
    std::fs::read_to_string(format!("{ROOT}/{doc}")).unwrap()
}
