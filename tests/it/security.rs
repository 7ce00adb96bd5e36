//! The mount as a shared service: a root daemon, an `--allow-other` mount, and users who
//! attack it. Every case runs for real, as `nobody` where a permission is involved:
//! - a symlink swapped into the source never makes the daemon read outside it (a tripwire
//!   outside the source, watched with inotify, sees no access);
//! - permissions changed on the source take effect at the next open; ACLs are honoured;
//! - a file rewritten, truncated, replaced or removed never yields stale bytes;
//! - order hints are bounded in memory and name only files their writer may read, by the
//!   order file and by the control socket, which bounds its clients and cannot be squatted.

use std::io::Read;
use std::os::unix::fs::{FileExt, PermissionsExt, chown};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;

fn mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A source directory other users may traverse, inside a fresh temporary directory.
fn source() -> (tempfile::TempDir, PathBuf) {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    mode(&src, 0o755);
    (dir, src)
}

/// An inotify watch of a directory and of the files in it: any open or read is an event.
struct Tripwire {
    fd: std::os::fd::OwnedFd,
}

impl Tripwire {
    fn watch(dir: &Path) -> Tripwire {
        use std::os::fd::FromRawFd;
        // SAFETY: plain system calls; the path is NUL-terminated and outlives the call.
        unsafe {
            let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
            assert!(fd >= 0);
            let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
            let mask = libc::IN_OPEN | libc::IN_ACCESS | libc::IN_CLOSE_NOWRITE;
            assert!(libc::inotify_add_watch(fd, path.as_ptr(), mask) >= 0);
            Tripwire {
                fd: std::os::fd::OwnedFd::from_raw_fd(fd),
            }
        }
    }

    /// Bytes of events since the watch began (0: nothing touched the directory).
    fn events(&self) -> usize {
        let mut file = std::fs::File::from(self.fd.try_clone().unwrap());
        let mut buf = [0u8; 4096];
        match file.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(e) => panic!("inotify: {e}"),
        }
    }
}

#[test]
fn a_symlink_swapped_into_the_source_never_makes_the_daemon_read_outside_it() {
    let (dir, src) = source();
    // Outside the source: a secret only root may read, in a directory only root may enter.
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("shadow"), b"TRIPWIRE secret").unwrap();
    std::fs::create_dir(outside.join("z")).unwrap();
    std::fs::write(outside.join("z/shadow"), b"TRIPWIRE secret").unwrap();
    mode(&outside, 0o700);
    // A directory of the source that nobody owns and writes in.
    let u = src.join("u");
    std::fs::create_dir(&u).unwrap();
    chown(&u, Some(NOBODY), Some(NOBODY)).unwrap();
    for i in 0..40 {
        std::fs::write(src.join(format!("bulk{i:02}")), bytes(i, 20_000)).unwrap();
    }
    let made = sh_as_nobody(
        "mkdir \"$1/z\" && echo mine > \"$1/z/shadow\" && echo file > \"$1/f\"",
        &[&u],
    );
    assert!(made.status.success(), "{}", stderr(&made));

    let m = Mount::new(&src, &["--allow-other"]);
    wait_for_scan(&m.mnt);
    let read = sh_as_nobody("cat \"$1/z/shadow\" \"$1/f\"", &[&m.path("u")]);
    assert_eq!(read.stdout, b"mine\nfile\n", "{}", stderr(&read));

    let tripwire = Tripwire::watch(&outside);
    let inner = Tripwire::watch(&outside.join("z"));
    // The swap: a directory and a file the kernel has cached become symlinks out.
    let swap = sh_as_nobody(
        "mv \"$1/z\" \"$1/z.old\" && ln -s \"$2\" \"$1/z\" && rm \"$1/f\" && \
         ln -s \"$2/shadow\" \"$1/f\"",
        &[&u, &outside],
    );
    assert!(swap.status.success(), "{}", stderr(&swap));

    // Everything a user can do with the names, as nobody: read, list, stat, read links and
    // attributes, and name them in an order hint, which the prefetcher would then fetch.
    let attack = sh_as_nobody(
        "cat \"$1/u/z/shadow\"; cat \"$1/u/f\"; ls -l \"$1/u\" \"$1/u/z/\"; \
         stat \"$1/u/z/shadow\"; readlink \"$1/u/z\"; exit 0",
        &[&m.mnt],
    );
    let attrs = format!("{:?}", xattrs_as_nobody(&m.path("u/z/shadow")));
    // A hint naming the swapped names: refused, as names nobody may read.
    assert_eq!(
        hints_as_nobody(&m.path(".coorfs-order"), "u/z/shadow\nu/f\n", 1),
        vec![libc::ENOENT]
    );
    let hint = sh_as_nobody(
        "for f in \"$1\"/bulk*; do cat \"$f\" > /dev/null; done; exit 0",
        &[&m.mnt],
    );
    let out = format!(
        "{}{attrs}{}",
        String::from_utf8_lossy(&attack.stdout),
        String::from_utf8_lossy(&hint.stdout)
    );
    assert!(!out.contains("TRIPWIRE"), "nobody read the secret: {out}");
    // Root's own reads through the mount follow the new symlinks in the kernel (as a local
    // process would); the daemon must not have touched the tripwire for anybody.
    std::thread::sleep(Duration::from_millis(500)); // let any prefetch run
    assert_eq!(
        tripwire.events(),
        0,
        "the daemon touched the directory outside the source"
    );
    assert_eq!(
        inner.events(),
        0,
        "the daemon touched a file outside the source"
    );
    // The mount shows the swap as it is: symlinks, listed and followed by the kernel.
    let kind = std::fs::symlink_metadata(m.path("u/z")).unwrap();
    assert!(kind.file_type().is_symlink());
    assert_eq!(
        std::fs::read_link(m.path("u/f")).unwrap(),
        outside.join("shadow")
    );
    m.unmount();
}

#[test]
fn permissions_changed_on_the_source_take_effect_at_the_next_open() {
    let (_dir, src) = source();
    std::fs::write(src.join("f"), b"file f").unwrap();
    std::fs::create_dir(src.join("d")).unwrap();
    std::fs::write(src.join("d/g"), b"file g").unwrap();
    std::fs::write(src.join("h"), b"file h").unwrap();
    chown(src.join("h"), Some(NOBODY), Some(NOBODY)).unwrap();
    mode(&src.join("h"), 0o600);
    for p in ["f", "d/g"] {
        mode(&src.join(p), 0o644);
    }
    mode(&src.join("d"), 0o755);

    let m = Mount::new(&src, &["--allow-other"]); // attributes cached for a day
    let cat = |rel: &str| sh_as_nobody("cat \"$1\"", &[&m.path(rel)]);
    assert_nobody_reads(&m, &[("f", "file f"), ("d/g", "file g"), ("h", "file h")]);
    mode(&src.join("f"), 0o000);
    mode(&src.join("d"), 0o700);
    chown(src.join("h"), Some(0), Some(0)).unwrap();
    for rel in ["f", "d/g", "h"] {
        let out = cat(rel);
        assert!(!out.status.success(), "{rel} still readable");
        assert!(
            stderr(&out).contains("Permission denied"),
            "{rel}: {}",
            stderr(&out)
        );
    }
    // Root reads anything, as on the source.
    assert_eq!(std::fs::read(m.path("f")).unwrap(), b"file f");
    // And a permission given back works at the next open too.
    mode(&src.join("d"), 0o755);
    assert_eq!(cat("d/g").stdout, b"file g", "{}", stderr(&cat("d/g")));
    m.unmount();

    // stat follows the source within --metadata-ttl.
    let m = Mount::new(&src, &["--allow-other", "--metadata-ttl", "0"]);
    mode(&src.join("f"), 0o640);
    let out = output_within(
        Command::new("stat").args(["-c", "%a %u"]).arg(m.path("f")),
        COMMAND_LIMIT,
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "640 0");
    mode(&src.join("f"), 0o604);
    let again = output_within(
        Command::new("stat").args(["-c", "%a"]).arg(m.path("f")),
        COMMAND_LIMIT,
    );
    assert_eq!(String::from_utf8_lossy(&again.stdout).trim(), "604");
    m.unmount();
}

#[test]
fn posix_acls_of_the_source_are_honoured() {
    let (_dir, src) = source();
    // Readable by mode, refused to nobody by an ACL entry.
    std::fs::write(src.join("denied"), b"denied").unwrap();
    mode(&src.join("denied"), 0o644);
    // Not readable by mode, granted to nobody by an ACL entry.
    std::fs::write(src.join("granted"), b"granted").unwrap();
    mode(&src.join("granted"), 0o600);
    // A folder searchable by its modes, closed to nobody by an ACL entry.
    std::fs::create_dir(src.join("closed")).unwrap();
    std::fs::write(src.join("closed/f"), b"f").unwrap();
    mode(&src.join("closed"), 0o755);
    for (file, entry) in [
        ("denied", "u:nobody:---"),
        ("granted", "u:nobody:r--"),
        ("closed", "u:nobody:---"),
    ] {
        let set = Command::new("setfacl")
            .args(["-m", entry])
            .arg(src.join(file))
            .status()
            .expect("setfacl (apt-get install acl)");
        assert!(set.success());
    }
    // Without --acl an entry that denies is honoured (the daemon opens files as the reader);
    // one that grants cannot be, since the kernel checks the mode bits first.
    let m = Mount::new(&src, &["--allow-other"]);
    // A name in the closed folder is looked up as the reader, also once the scan has read the
    // folder (where the node table answers lookups in folders with no ACL on the way).
    wait_for_scan(&m.mnt);
    let closed = sh_as_nobody("stat \"$1\"", &[&m.path("closed/f")]);
    assert!(
        stderr(&closed).contains("Permission denied"),
        "{}",
        stderr(&closed)
    );
    let denied = sh_as_nobody("cat \"$1\"", &[&m.path("denied")]);
    assert!(
        stderr(&denied).contains("Permission denied"),
        "{}",
        stderr(&denied)
    );
    let granted = sh_as_nobody("cat \"$1\"", &[&m.path("granted")]);
    assert!(
        stderr(&granted).contains("Permission denied"),
        "{}",
        stderr(&granted)
    );
    m.unmount();

    let m = Mount::new(&src, &["--allow-other", "--acl"]);
    let denied = sh_as_nobody("cat \"$1\"", &[&m.path("denied")]);
    assert!(
        stderr(&denied).contains("Permission denied"),
        "{}",
        stderr(&denied)
    );
    let granted = sh_as_nobody("cat \"$1\"", &[&m.path("granted")]);
    assert_eq!(granted.stdout, b"granted", "{}", stderr(&granted));
    let acl = output_within(
        Command::new("getfacl")
            .args(["--omit-header"])
            .arg(m.path("granted")),
        COMMAND_LIMIT,
    );
    assert!(
        String::from_utf8_lossy(&acl.stdout).contains("user:nobody:r--"),
        "{}",
        String::from_utf8_lossy(&acl.stdout)
    );
    // An ACL changed after mounting takes effect at the next open.
    let set = Command::new("setfacl")
        .args(["-m", "u:nobody:---"])
        .arg(src.join("granted"))
        .status()
        .unwrap();
    assert!(set.success());
    let now = sh_as_nobody("cat \"$1\"", &[&m.path("granted")]);
    assert!(!now.status.success(), "the revoked ACL entry still grants");
    m.unmount();
}

#[test]
fn a_file_rewritten_in_place_with_its_mtime_restored_is_never_served_stale() {
    let (dir, src) = source();
    let f = src.join("f");
    std::fs::write(&f, bytes(1, 100_000)).unwrap();
    let reference = dir.path().join("ref");
    std::fs::write(&reference, b"").unwrap();
    let touch = |from: &Path, to: &Path| {
        let ok = Command::new("touch")
            .arg("-r")
            .arg(from)
            .arg(to)
            .status()
            .unwrap();
        assert!(ok.success());
    };
    touch(&f, &reference);
    let m = Mount::new(&src, &[]);
    for _ in 0..2 {
        assert_eq!(std::fs::read(m.path("f")).unwrap(), bytes(1, 100_000));
    }
    assert_eq!(num(&stats(&m.mnt), "cached_files"), 1);
    // The same size, other bytes, the old mtime: only the ctime tells.
    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    file.write_all_at(&bytes(2, 100_000), 0).unwrap();
    drop(file);
    touch(&reference, &f);
    assert_eq!(std::fs::read(m.path("f")).unwrap(), bytes(2, 100_000));
    m.unmount();
}

#[test]
fn a_file_truncated_while_it_is_read_yields_only_bytes_of_the_version_opened_then_ends() {
    let (_dir, src) = source();
    let big = bytes(3, 24 << 20);
    std::fs::write(src.join("big"), &big).unwrap();
    // Prefetch on (the default): staged blocks of the old version must not be served.
    let m = Mount::new(&src, &["--cache-size", "4M"]);
    wait_for_scan(&m.mnt);
    let mut file = std::fs::File::open(m.path("big")).unwrap();
    let mut first = vec![0u8; 1 << 20];
    file.read_exact(&mut first).unwrap();
    assert_eq!(first, &big[..1 << 20]);
    let keep = 3 << 20;
    std::fs::OpenOptions::new()
        .write(true)
        .open(src.join("big"))
        .unwrap()
        .set_len(keep as u64)
        .unwrap();
    let mut rest = Vec::new();
    file.read_to_end(&mut rest).unwrap();
    // A big file is read through the kernel's page cache (its small reads cost no round
    // trip): what the kernel read ahead before the change is still the version opened, as on
    // NFS. Every byte is the opened file's, never zeros or another version's, up to the new
    // end at least, and the read ends where the kernel's readahead (16 MiB) had got to.
    assert!(rest.len() >= keep - (1 << 20), "{} bytes", rest.len());
    assert!(
        rest.len() <= (1 << 20) + (16 << 20),
        "read {} bytes past the change",
        rest.len()
    );
    assert!(
        rest == big[1 << 20..(1 << 20) + rest.len()],
        "bytes of another version"
    );
    drop(file);
    // A new open reads the file as it is now.
    assert_eq!(std::fs::read(m.path("big")).unwrap(), &big[..keep]);
    m.unmount();
}

#[test]
fn a_file_replaced_or_removed_while_open_reads_as_on_the_local_filesystem() {
    let (_dir, src) = source();
    let old = bytes(4, 3 << 20);
    let new = bytes(5, 3 << 20);
    std::fs::write(src.join("f"), &old).unwrap();
    std::fs::write(src.join("g"), &old).unwrap();
    let m = Mount::new(&src, &["--no-prefetch"]);
    let f = std::fs::File::open(m.path("f")).unwrap();
    let g = std::fs::File::open(m.path("g")).unwrap();
    let mut part = vec![0u8; 4096];
    f.read_exact_at(&mut part, 0).unwrap();
    // f is replaced by a rename, g removed: a local descriptor keeps the file it opened.
    std::fs::write(src.join("f.new"), &new).unwrap();
    std::fs::rename(src.join("f.new"), src.join("f")).unwrap();
    std::fs::remove_file(src.join("g")).unwrap();
    let mut all = vec![0u8; old.len()];
    f.read_exact_at(&mut all, 0).unwrap();
    assert_eq!(all, old, "the replaced file's descriptor");
    g.read_exact_at(&mut all, 0).unwrap();
    assert_eq!(all, old, "the removed file's descriptor");
    drop((f, g));
    // A new open sees the source as it is now.
    assert_eq!(std::fs::read(m.path("f")).unwrap(), new);
    let gone = std::fs::File::open(m.path("g")).unwrap_err();
    assert_eq!(gone.kind(), std::io::ErrorKind::NotFound);
    m.unmount();
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn order_hints_cannot_take_more_memory_than_their_budget() {
    let (_dir, src) = source();
    let rels = make_dataset(&src, 200, 100, 4);
    for d in ["c000", "c001", "c002", "c003"] {
        mode(&src.join(d), 0o755);
    }
    let m = Mount::new(&src, &["--allow-other", "--hint-memory", "32M"]);
    wait_for_scan(&m.mnt);
    let before = rss_kib(m.pid());
    // 12 hints of 6 MiB at once (valid lines, repeated): nobody's share is 16 MiB.
    let line = format!("{}\n", rels[0].display());
    let hint = line.repeat((6 << 20) / line.len());
    let results = hints_as_nobody(&m.path(".coorfs-order"), &hint, 12);
    let ok = results.iter().filter(|r| **r == 0).count();
    let quota = results.iter().filter(|r| **r == libc::EDQUOT).count();
    assert_eq!(ok + quota, 12, "{results:?}");
    assert!(
        (1..=2).contains(&ok),
        "a 16 MiB share holds two 6 MiB hints: {results:?}"
    );
    let grown = rss_kib(m.pid()).saturating_sub(before);
    assert!(
        grown < 48 << 10,
        "the daemon grew by {grown} KiB for a 32 MiB hint budget"
    );
    // The budget is given back: one more hint fits.
    assert_eq!(hints_as_nobody(&m.path(".coorfs-order"), &line, 1), vec![0]);
    m.unmount();
}

#[test]
fn a_hint_cannot_tell_a_hidden_file_from_a_missing_one() {
    let (_dir, src) = source();
    std::fs::write(src.join("public.jpg"), b"x").unwrap();
    mode(&src.join("public.jpg"), 0o644);
    std::fs::create_dir(src.join("private")).unwrap();
    std::fs::write(src.join("private/hidden.jpg"), b"y").unwrap();
    mode(&src.join("private"), 0o700);
    std::fs::write(src.join("unreadable.jpg"), b"z").unwrap();
    mode(&src.join("unreadable.jpg"), 0o600);
    let m = Mount::new(&src, &["--allow-other"]);
    wait_for_scan(&m.mnt);
    let order = m.path(".coorfs-order");
    for (hint, want) in [
        ("public.jpg\n", 0),
        ("private/hidden.jpg\n", libc::ENOENT),
        ("private/missing.jpg\n", libc::ENOENT),
        ("unreadable.jpg\n", libc::ENOENT),
        ("missing.jpg\n", libc::ENOENT),
    ] {
        assert_eq!(hints_as_nobody(&order, hint, 1), vec![want], "{hint}");
    }
    // Root may name anything.
    coorfs::reader::send_hint(&m.mnt, b"private/hidden.jpg\n").unwrap();
    // Stats are for everybody and name no file.
    let all = xattrs_as_nobody(&m.mnt).expect("nobody lists the root's attributes");
    let mut text = String::new();
    for (name, value) in &all {
        let value = value
            .as_ref()
            .unwrap_or_else(|e| panic!("nobody reads {name}: errno {e}"));
        text += &format!("{name}={}\n", String::from_utf8_lossy(value));
    }
    assert!(text.contains("user.coorfs.hits"), "{text}");
    for name in ["public", "hidden", "private", "unreadable"] {
        assert!(!text.contains(name), "stats name {name}: {text}");
    }
    m.unmount();
}

#[test]
fn with_one_job_for_everybody_only_the_owner_may_hint() {
    let (_dir, src) = source();
    std::fs::write(src.join("a"), b"x").unwrap();
    mode(&src.join("a"), 0o644);
    let m = Mount::new(&src, &["--allow-other", "--job-key", "none"]);
    wait_for_scan(&m.mnt);
    assert_eq!(
        hints_as_nobody(&m.path(".coorfs-order"), "a\n", 1),
        vec![libc::EACCES]
    );
    coorfs::reader::send_hint(&m.mnt, b"a\n").unwrap();
    assert_eq!(num(&stats(&m.mnt), "hints_accepted"), 1);
    m.unmount();
}

/// Python for nobody: opens `argv[2]` connections to the control socket of the mount at
/// argv[1] and sends nothing; prints, for each, "busy" if the daemon refused it at once, or
/// "held"; then (argv[3] given) sends argv[3] as a hint on the last held one and prints the
/// daemon's answer.
const CONTROL_CLIENTS_PY: &str = r#"
import os, socket, sys, time
dev = os.stat(sys.argv[1]).st_dev
conns, out = [], []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(("\0coorfs-control-%x" % dev).encode())
    conns.append(s)
time.sleep(0.3)
held = []
for s in conns:
    s.setblocking(False)
    try:
        got = s.recv(100)
        out.append("busy" if got.startswith(b"16 ") else "other:%r" % got)
    except BlockingIOError:
        out.append("held")
        held.append(s)
if len(sys.argv) > 3 and held:
    s = held[-1]
    s.setblocking(True)
    s.sendall(sys.argv[3].encode())
    s.shutdown(socket.SHUT_WR)
    out.append(s.recv(200).decode().split()[0])
print(" ".join(out))
"#;

#[test]
fn the_control_socket_acts_as_its_client_and_bounds_each_user() {
    let (_dir, src) = source();
    std::fs::write(src.join("public.jpg"), b"x").unwrap();
    mode(&src.join("public.jpg"), 0o644);
    std::fs::write(src.join("secret.jpg"), b"y").unwrap();
    mode(&src.join("secret.jpg"), 0o600);
    let m = Mount::new(&src, &["--allow-other"]);
    wait_for_scan(&m.mnt);
    let mnt = m.mnt.as_os_str();
    // Ten idle connections of nobody's: four are held, the rest refused at once (EBUSY); a
    // hint on a held one names only what nobody may read.
    let run = |hint: &str| {
        let out = as_nobody(
            "python3",
            &[
                std::ffi::OsStr::new("-c"),
                std::ffi::OsStr::new(CONTROL_CLIENTS_PY),
                mnt,
                std::ffi::OsStr::new("10"),
                std::ffi::OsStr::new(hint),
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let words = run("secret.jpg\n");
    let said: Vec<&str> = words.split(' ').collect();
    assert_eq!(said.iter().filter(|w| **w == "held").count(), 4, "{words}");
    assert_eq!(said.iter().filter(|w| **w == "busy").count(), 6, "{words}");
    assert_eq!(
        said.last(),
        Some(&"2"),
        "ENOENT for a file nobody may read: {words}"
    );
    assert!(
        run("public.jpg\n").ends_with(" 0"),
        "nobody may hint a file it reads"
    );
    // Nobody's connections are gone; root's hint goes over the socket.
    coorfs::reader::send_hint(&m.mnt, b"secret.jpg\n").unwrap();
    assert_eq!(num(&stats(&m.mnt), "hints_accepted"), 2);
    m.unmount();
}

/// Python for nobody: binds the abstract name argv[1] (waiting up to 2 s for a daemon that is
/// exiting to let go of it), says "bound" on its output, accepts connections on it for
/// argv[2] seconds, and writes how many bytes clients sent it to argv[3].
const SQUAT_PY: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
give_up = time.time() + 2
while True:
    try:
        s.bind(("\0" + sys.argv[1]).encode())
        break
    except OSError:
        if time.time() > give_up:
            sys.exit("the name stayed taken")
        time.sleep(0.02)
s.listen(8)
print("bound", flush=True)
s.settimeout(0.2)
got, end = 0, time.time() + float(sys.argv[2])
while time.time() < end:
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    c.settimeout(0.5)
    try:
        while True:
            b = c.recv(65536)
            if not b:
                break
            got += len(b)
    except OSError:
        pass
    c.close()
open(sys.argv[3], "w").write(str(got))
"#;

#[test]
fn a_control_socket_name_taken_by_another_user_never_gets_a_hint() {
    use std::os::unix::fs::MetadataExt;
    let (dir, src) = source();
    std::fs::write(src.join("a"), b"x").unwrap();
    let got = dir.path().join("got");
    // A mount's socket is named after its device number; the kernel gives a new mount the
    // lowest free one, so nobody can take the name of the next mount's beforehand: that of
    // a mount just gone. Other tests mount meanwhile, so it may take a few tries.
    for _ in 0..5 {
        let m = Mount::new(&src, &[]);
        let dev = std::fs::metadata(&m.mnt).unwrap().dev();
        m.unmount();
        std::fs::write(&got, "").unwrap();
        std::fs::set_permissions(&got, std::fs::Permissions::from_mode(0o666)).unwrap();
        let name = coorfs::fs::control::control_name(dev);
        let mut squatter = Command::new("python3")
            .args(["-c", SQUAT_PY, &name, "3"])
            .arg(&got)
            .uid(NOBODY)
            .gid(NOBODY)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The daemon of the mount just gone may hold the name for a moment after its unmount:
        // the next mount comes once the squatter has it (or gave up: another try).
        let mut said = String::new();
        let out = squatter.stdout.take().unwrap();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut said);
        if said.trim() != "bound" {
            squatter.wait().unwrap();
            continue;
        }
        let m = Mount::new(&src, &[]);
        if std::fs::metadata(&m.mnt).unwrap().dev() != dev {
            squatter.kill().unwrap();
            squatter.wait().unwrap();
            m.unmount();
            continue;
        }
        // The hint still reaches the daemon (through the order file), and the squatter none
        // of it.
        coorfs::reader::send_hint(&m.mnt, b"a\n").unwrap();
        assert_eq!(num(&stats(&m.mnt), "hints_accepted"), 1);
        squatter.wait().unwrap();
        assert_eq!(std::fs::read_to_string(&got).unwrap(), "0");
        m.unmount();
        return;
    }
    panic!("no mount got the device number of the one before it in 5 tries");
}
