//! A real mount mirrors its source exactly: names (any bytes), kinds, stat fields, bytes at
//! any offset, symlinks, permissions, and a 100,000-entry directory.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::common::*;
use rand::{Rng, SeedableRng};

/// What `lstat` says of an entry, minus what legitimately differs (device, inode number,
/// and the access time of directories, which listing the source itself may update).
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    kind: u32,
    mode: u32,
    size: u64,
    nlink: u64,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
    ctime: (i64, i64),
    atime: Option<(i64, i64)>,
    target: Option<PathBuf>,
}

fn stat_of(path: &Path) -> Stat {
    let m = std::fs::symlink_metadata(path).unwrap();
    let kind = m.mode() & libc::S_IFMT;
    Stat {
        kind,
        mode: m.mode(),
        size: if m.is_dir() { 0 } else { m.size() },
        nlink: m.nlink(),
        uid: m.uid(),
        gid: m.gid(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
        atime: m.is_file().then(|| (m.atime(), m.atime_nsec())),
        target: m.is_symlink().then(|| std::fs::read_link(path).unwrap()),
    }
}

/// Every entry below `root` by relative path (as bytes), with its stat.
fn walk(root: &Path) -> BTreeMap<Vec<u8>, Stat> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(root.join(&rel)).unwrap() {
            let entry = entry.unwrap();
            let child = rel.join(entry.file_name());
            let st = stat_of(&root.join(&child));
            if st.kind == libc::S_IFDIR {
                stack.push(child.clone());
            }
            out.insert(child.as_os_str().as_bytes().to_vec(), st);
        }
    }
    out
}

/// Reads up to `len` bytes at `offset`, looping over short reads, stopping at end of file.
fn pread_all(file: &std::fs::File, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = file.read_at(&mut buf[done..], offset + done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    buf.truncate(done);
    Ok(buf)
}

fn build_tree(src: &Path) {
    std::fs::create_dir_all(src.join("nested/a/b/c")).unwrap();
    std::fs::write(src.join("nested/a/b/c/deep.txt"), b"deep\n").unwrap();
    std::fs::write(src.join("nested/a/mid.bin"), bytes(1, 70_000)).unwrap();
    std::fs::write(src.join("empty"), b"").unwrap();
    std::fs::write(src.join("five_mib.bin"), bytes(2, 5 << 20)).unwrap();
    std::fs::write(
        src.join(OsStr::from_bytes(b"caf\xe9-latin1.bin")),
        bytes(3, 1000),
    )
    .unwrap();
    std::fs::write(src.join("日本語-ñ-🚀.txt"), "unicode\n").unwrap();
    std::os::unix::fs::symlink("nested/a/b/c/deep.txt", src.join("link")).unwrap();
    std::os::unix::fs::symlink("does/not/exist", src.join("dangling")).unwrap();
    std::fs::hard_link(src.join("empty"), src.join("empty-hardlink")).unwrap();
    std::fs::write(src.join("secret.bin"), b"top secret").unwrap();
    std::fs::set_permissions(
        src.join("secret.bin"),
        std::fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    std::fs::write(src.join("exec.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(src.join("exec.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir(src.join("wide")).unwrap();
    for i in 0..100_000 {
        std::fs::File::create(src.join(format!("wide/entry-{i:06}"))).unwrap();
    }
}

#[test]
fn tree_listing_stat_and_bytes_equal_the_source() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    build_tree(&src);
    let want = walk(&src);
    let m = Mount::new(&src, &[]);

    // Metadata first, before any read could touch an access time.
    let got = walk(&m.mnt);
    assert_eq!(got.len(), want.len());
    assert_eq!(got.len(), 100_000 + 16);
    for (name, st) in &want {
        assert_eq!(got.get(name), Some(st), "{}", String::from_utf8_lossy(name));
    }
    assert_eq!(std::fs::read_dir(m.path("wide")).unwrap().count(), 100_000);
    assert_eq!(stat_of(&m.mnt).mode, stat_of(&src).mode);

    // Bytes at random offsets and lengths, including past the end.
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    for rel in [
        "five_mib.bin",
        "nested/a/mid.bin",
        "empty",
        "nested/a/b/c/deep.txt",
        "日本語-ñ-🚀.txt",
    ] {
        let a = std::fs::File::open(src.join(rel)).unwrap();
        let b = std::fs::File::open(m.path(rel)).unwrap();
        let size = a.metadata().unwrap().len();
        for _ in 0..200 {
            let offset = rng.random_range(0..size + 4096);
            let len = rng.random_range(0..(2 << 20));
            assert_eq!(
                pread_all(&b, offset, len).unwrap(),
                pread_all(&a, offset, len).unwrap(),
                "{rel} at {offset}+{len}"
            );
        }
        assert_eq!(
            std::fs::read(m.path(rel)).unwrap(),
            std::fs::read(src.join(rel)).unwrap()
        );
    }
    let latin1 = OsStr::from_bytes(b"caf\xe9-latin1.bin");
    assert_eq!(std::fs::read(m.mnt.join(latin1)).unwrap(), bytes(3, 1000));
    assert_eq!(std::fs::read(m.path("link")).unwrap(), b"deep\n");
    assert_eq!(
        std::fs::read(m.path("dangling")).unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
    assert_eq!(
        std::fs::read(m.path("no-such-file")).unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
    m.unmount();
}

#[test]
fn the_kernel_enforces_the_source_permissions() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(src.join("public"), b"for everyone").unwrap();
    std::fs::set_permissions(src.join("public"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(src.join("secret"), b"for root").unwrap();
    std::fs::set_permissions(src.join("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();

    // Without --allow-other, nobody else may even look.
    let private = Mount::new(&src, &[]);
    let out = as_nobody("cat", &[private.path("public").as_os_str()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    private.unmount();

    let shared = Mount::new(&src, &["--allow-other"]);
    let out = as_nobody("cat", &[shared.path("public").as_os_str()]);
    assert_eq!(out.stdout, b"for everyone", "{}", stderr(&out));
    let out = as_nobody("cat", &[shared.path("secret").as_os_str()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    // Root reads a mode-600 file like on the source.
    assert_eq!(std::fs::read(shared.path("secret")).unwrap(), b"for root");
    shared.unmount();
}

#[test]
fn names_added_and_removed_after_the_scan_show_in_the_next_listing() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    for d in ["kept", "changed"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
        for i in 0..40 {
            std::fs::write(src.join(format!("{d}/f{i:02}")), bytes(i, 100 + i as usize)).unwrap();
        }
    }
    // Old enough that the scan keeps the directories' listings (see DatasetFs::opendir).
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let m = Mount::new(&src, &[]);
    wait_for_scan(&m.mnt);
    // Listed (with attributes) from what the scan kept: as the source.
    assert_eq!(walk(&m.mnt), walk(&src));

    std::fs::write(src.join("changed/new"), bytes(99, 5000)).unwrap();
    std::fs::remove_file(src.join("changed/f03")).unwrap();
    std::fs::rename(src.join("changed/f04"), src.join("changed/f04-renamed")).unwrap();
    let names = |root: &Path| {
        let mut v: Vec<_> = std::fs::read_dir(root.join("changed"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&m.mnt), names(&src));
    assert!(names(&m.mnt).contains(&"new".into()));
    assert_eq!(
        std::fs::read(m.path("changed/new")).unwrap(),
        bytes(99, 5000)
    );
    assert_eq!(
        std::fs::read(m.path("changed/f04-renamed")).unwrap(),
        bytes(4, 104)
    );
    m.unmount();
}
