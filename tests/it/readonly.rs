//! Every write-type operation on a mount fails with EROFS, and the source is left untouched.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::common::*;

fn c(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// The result of a libc call that returns -1 on failure.
fn sys(rc: libc::c_int) -> io::Result<()> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Everything about the source tree that a write could change.
fn snapshot(root: &Path) -> Vec<(String, u32, u64, i64, i64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let data = if m.is_file() {
                std::fs::read(&p).unwrap()
            } else {
                Vec::new()
            };
            if m.is_dir() {
                stack.push(p.clone());
            }
            out.push((
                p.display().to_string(),
                m.mode(),
                m.size(),
                m.mtime(),
                m.mtime_nsec(),
                data,
            ));
        }
    }
    out.sort();
    out
}

#[test]
fn writes_fail_with_erofs_and_leave_the_source_unchanged() {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sub/inner")).unwrap();
    std::fs::write(src.join("file"), b"original").unwrap();
    std::fs::write(src.join("sub/other"), b"other").unwrap();
    let before = snapshot(&src);
    let m = Mount::new(&src, &[]);
    let file = m.path("file");

    let attempts: Vec<(&str, io::Result<()>)> = vec![
        (
            "open for writing",
            std::fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .map(drop),
        ),
        (
            "open read-write",
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&file)
                .map(drop),
        ),
        (
            "open for append",
            std::fs::OpenOptions::new()
                .append(true)
                .open(&file)
                .map(drop),
        ),
        ("create", std::fs::File::create(m.path("new")).map(drop)),
        (
            "create exclusive",
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(m.path("new2"))
                .map(drop),
        ),
        (
            "truncate",
            // SAFETY: a NUL-terminated path that outlives the call; no memory is written.
            sys(unsafe { libc::truncate(c(&file).as_ptr(), 0) }),
        ),
        ("mkdir", std::fs::create_dir(m.path("newdir"))),
        ("rmdir", std::fs::remove_dir(m.path("sub/inner"))),
        ("unlink", std::fs::remove_file(&file)),
        ("rename", std::fs::rename(&file, m.path("renamed"))),
        ("rename over", std::fs::rename(&file, m.path("sub/other"))),
        ("hard link", std::fs::hard_link(&file, m.path("hard"))),
        (
            "symlink",
            std::os::unix::fs::symlink("file", m.path("soft")),
        ),
        (
            "chmod",
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)),
        ),
        ("chown", std::os::unix::fs::chown(&file, Some(1), Some(1))),
        (
            "utimes",
            // SAFETY: a NUL-terminated path that outlives the call; no memory is written.
            sys(unsafe { libc::utimensat(libc::AT_FDCWD, c(&file).as_ptr(), std::ptr::null(), 0) }),
        ),
        (
            "mknod",
            // SAFETY: a NUL-terminated path that outlives the call; no memory is written.
            sys(unsafe { libc::mknod(c(&m.path("fifo")).as_ptr(), libc::S_IFIFO | 0o644, 0) }),
        ),
        ("setxattr", xattr::set(&file, "user.test", b"x")),
        ("removexattr", xattr::remove(&file, "user.test")),
    ];
    for (what, result) in attempts {
        let err = result.expect_err(what);
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{what}: {err}");
    }

    // Reading still works, and the source is exactly as it was.
    assert_eq!(std::fs::read(&file).unwrap(), b"original");
    m.unmount();
    assert_eq!(snapshot(&src), before);
}
