//! `--fast-open`: the kernel opens files without asking the daemon. Real mounts: the bytes
//! are the source's, a file the kernel holds costs the daemon nothing (its counters do not
//! move), the kernel checks the mode bits (as nobody), a change on the source shows within
//! `--metadata-ttl`, and order hints are refused with the error a user sees.

mod common;

use std::os::unix::fs::{PermissionsExt, chown};
use std::path::Path;

use common::*;

fn mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn files_read_whole_are_the_source_and_a_second_epoch_never_reaches_the_daemon() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 300, 700, 3);
    // A file of several blocks: read in many requests, counted as one read of the file.
    let big = bytes(99, 3 << 20);
    std::fs::write(src.join("big.bin"), &big).unwrap();
    // Without prefetch, so that every file of epoch 1 is a miss of the read itself.
    let m = Mount::new(
        &src,
        &["--fast-open", "--no-prefetch", "--block-size", "1M"],
    );
    wait_for_scan(&m.mnt);

    for epoch in 0..2 {
        for rel in &rels {
            assert_eq!(
                std::fs::read(m.path(rel)).unwrap(),
                std::fs::read(src.join(rel)).unwrap(),
                "{} in epoch {epoch}",
                rel.display()
            );
        }
        assert!(std::fs::read(m.path("big.bin")).unwrap() == big, "big.bin");
        let s = stats(&m.mnt);
        // Epoch 1: every file once, all misses. Epoch 2: the kernel held every page, and
        // the daemon saw nothing at all.
        assert_eq!(num(&s, "reads"), 301, "after epoch {epoch}: {s}");
        assert_eq!(num(&s, "misses"), 301, "after epoch {epoch}: {s}");
        assert_eq!(
            num(&s, "bytes_from_source"),
            300 * 700 + big.len() as u64,
            "after epoch {epoch}: {s}"
        );
    }
    m.unmount();
}

#[test]
fn the_kernel_checks_the_mode_bits_and_a_chmod_shows_within_the_metadata_ttl() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    mode(&src, 0o755);
    std::fs::write(src.join("open"), b"anyone").unwrap();
    mode(&src.join("open"), 0o644);
    std::fs::write(src.join("secret"), b"root only").unwrap();
    mode(&src.join("secret"), 0o600);
    std::fs::write(src.join("theirs"), b"nobody's").unwrap();
    chown(src.join("theirs"), Some(NOBODY), Some(NOBODY)).unwrap();
    mode(&src.join("theirs"), 0o600);

    let m = Mount::new(
        &src,
        &["--fast-open", "--allow-other", "--metadata-ttl", "0"],
    );
    let cat = |rel: &str| sh_as_nobody("cat \"$1\"", &[&m.path(rel)]);
    assert_eq!(cat("open").stdout, b"anyone");
    assert_eq!(cat("theirs").stdout, b"nobody's");
    let denied = cat("secret");
    assert!(!denied.status.success());
    assert!(
        stderr(&denied).contains("Permission denied"),
        "{}",
        stderr(&denied)
    );
    // Root reads it; nobody still may not, though its pages are in the kernel now.
    assert_eq!(std::fs::read(m.path("secret")).unwrap(), b"root only");
    assert!(stderr(&cat("secret")).contains("Permission denied"));

    // With --metadata-ttl 0 the kernel asks for the attributes at every open.
    mode(&src.join("open"), 0o600);
    let now = cat("open");
    assert!(!now.status.success(), "a chmod 600 did not take effect");
    assert!(
        stderr(&now).contains("Permission denied"),
        "{}",
        stderr(&now)
    );
    mode(&src.join("open"), 0o644);
    assert_eq!(cat("open").stdout, b"anyone", "{}", stderr(&cat("open")));
    m.unmount();
}

#[test]
fn a_file_changed_on_the_source_is_read_anew_once_its_attributes_expire() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), b"first version").unwrap();
    std::fs::write(src.join("g"), b"same size: A").unwrap();
    let m = Mount::new(&src, &["--fast-open", "--metadata-ttl", "0"]);
    assert_eq!(std::fs::read(m.path("f")).unwrap(), b"first version");
    assert_eq!(std::fs::read(m.path("g")).unwrap(), b"same size: A");
    // A new size, and the same size with new bytes (the kernel's pages must go for both).
    std::fs::write(src.join("f"), b"second, longer version").unwrap();
    std::fs::write(src.join("g"), b"same size: B").unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(src.join("g"))
        .unwrap()
        .set_modified(later)
        .unwrap();
    assert_eq!(
        std::fs::read(m.path("f")).unwrap(),
        b"second, longer version"
    );
    assert_eq!(std::fs::read(m.path("g")).unwrap(), b"same size: B");
    m.unmount();
}

#[test]
fn order_hints_are_refused_with_a_clear_error() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 4, 100, 1);
    let m = Mount::new(&src, &["--fast-open"]);
    // A file opened first: the kernel has stopped sending OPEN by the time the hint comes.
    std::fs::read(m.path(&rels[0])).unwrap();
    let err = coorfs::reader::send_hint(&m.mnt, format!("{}\n", rels[1].display()).as_bytes())
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EOPNOTSUPP), "{err}");
    assert_eq!(num(&stats(&m.mnt), "hints_accepted"), 0);
    m.unmount();
}
