//! `man/coorfs.1` is generated from the CLI; this fails when the committed page is stale.
//! Regenerate with: UPDATE_MAN=1 cargo test --test manpage

use clap::CommandFactory;

const PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/man/coorfs.1");

#[test]
fn man_page_is_current() {
    let want = coorfs::manpage::render();
    if std::env::var_os("UPDATE_MAN").is_some() {
        std::fs::write(PAGE, &want).unwrap();
    }
    let have = std::fs::read_to_string(PAGE).unwrap_or_default();
    assert!(
        have == want,
        "man/coorfs.1 is stale: run UPDATE_MAN=1 cargo test --test manpage and commit it"
    );
}

/// Every long option of every command appears in the man page and in the README.
#[test]
fn every_option_is_documented() {
    let page = coorfs::manpage::render();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
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
                    readme.contains(&format!("--{long}")),
                    "README lacks --{long} of {}",
                    sub.get_name()
                );
            }
        }
    }
}
