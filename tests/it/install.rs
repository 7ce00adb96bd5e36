//! Installed like a system package: `scripts/build-deb.sh` packages the binary under test with
//! the mount(8) helper link, the man page, the completions of three shells and the systemd
//! examples, and `scripts/install.sh` installs the same tree. The package is unpacked, not
//! installed: installing it would move this machine's live mounts (its postinst), those of
//! the other tests among them, to the packaged daemon.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::*;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// The files every install has, relative to its root.
const FILES: [&str; 8] = [
    "usr/bin/coorfs",
    "usr/share/man/man1/coorfs.1.gz",
    "usr/share/bash-completion/completions/coorfs",
    "usr/share/zsh/vendor-completions/_coorfs",
    "usr/share/fish/vendor_completions.d/coorfs.fish",
    "usr/share/doc/coorfs/README.md",
    "usr/share/doc/coorfs/examples/mnt-train.mount",
    "usr/share/doc/coorfs/examples/coorfs-train.service",
];

/// Checks an installed tree at `root`.
fn assert_installed(root: &Path) {
    for f in FILES {
        let len = std::fs::metadata(root.join(f))
            .unwrap_or_else(|e| panic!("{f}: {e}"))
            .len();
        assert!(len > 0, "{f} is empty");
    }
    assert_eq!(
        std::fs::read_link(root.join("sbin/mount.fuse.coorfs")).unwrap(),
        Path::new("/usr/bin/coorfs")
    );
    let out = output_within(
        Command::new(root.join("usr/bin/coorfs")).arg("--version"),
        Duration::from_secs(10),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("coorfs {}", env!("CARGO_PKG_VERSION"))
    );
    // The man page is the tree's.
    let man = output_within(
        Command::new("gzip")
            .arg("-dc")
            .arg(root.join("usr/share/man/man1/coorfs.1.gz")),
        Duration::from_secs(10),
    );
    assert_eq!(
        man.stdout,
        std::fs::read(Path::new(REPO).join("man/coorfs.1")).unwrap()
    );
    // Each completion script knows every command.
    for f in &FILES[2..5] {
        let text = std::fs::read_to_string(root.join(f)).unwrap();
        for cmd in ["mount", "umount", "restart", "stats", "completions"] {
            assert!(text.contains(cmd), "{f} lacks {cmd}");
        }
    }
}

#[test]
fn the_deb_holds_the_binary_the_helper_the_man_page_and_completions() {
    let out = output_within(
        Command::new(Path::new(REPO).join("scripts/build-deb.sh")).env("COORFS_BIN", bin()),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let deb = Path::new(REPO).join(String::from_utf8_lossy(&out.stdout).trim());
    let field = |name: &str| {
        let out = output_within(
            Command::new("dpkg-deb").arg("-f").arg(&deb).arg(name),
            Duration::from_secs(10),
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(field("Package"), "coorfs");
    assert_eq!(field("Version"), env!("CARGO_PKG_VERSION"));
    assert!(field("Depends").contains("fuse3"));
    let dir = open_tempdir();
    let x = output_within(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(dir.path()),
        Duration::from_secs(30),
    );
    assert!(x.status.success(), "{}", stderr(&x));
    assert_installed(dir.path());
    // Its postinst moves live mounts to the new daemon.
    let ctl = open_tempdir();
    let e = output_within(
        Command::new("dpkg-deb").arg("-e").arg(&deb).arg(ctl.path()),
        Duration::from_secs(30),
    );
    assert!(e.status.success(), "{}", stderr(&e));
    let postinst = std::fs::read_to_string(ctl.path().join("postinst")).unwrap();
    assert!(postinst.contains("/usr/bin/coorfs restart"), "{postinst}");
}

#[test]
fn install_sh_installs_the_same_tree_and_refuses_bad_arguments() {
    let dir = open_tempdir();
    let script = Path::new(REPO).join("scripts/install.sh");
    let out = output_within(
        Command::new(&script)
            .arg("--destdir")
            .arg(dir.path())
            .env("COORFS_BIN", bin()),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_installed(dir.path());
    let out = output_within(
        Command::new(&script).arg("--prefix"),
        Duration::from_secs(10),
    );
    fails_with_line(
        &out,
        2,
        "install.sh: unknown argument '--prefix' (see --help)",
        "install.sh --prefix",
    );
}
