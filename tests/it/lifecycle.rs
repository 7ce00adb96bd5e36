//! The daemon's life: `coorfs mount` returns with a live mount, every way of ending it leaves
//! no mount and no daemon behind, and bad input is one clear line and a non-zero exit.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;

fn small_source() -> (tempfile::TempDir, PathBuf) {
    let dir = open_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(src.join("hello"), b"hello").unwrap();
    (dir, src)
}

fn empty_dir(parent: &Path, name: &str) -> PathBuf {
    let p = parent.join(name);
    std::fs::create_dir(&p).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[test]
fn mount_is_live_when_the_command_returns_and_umount_leaves_nothing() {
    let (_dir, src) = small_source();
    let m = Mount::new(&src, &[]);
    // No waiting: the mount answers as soon as `coorfs mount` has returned.
    assert_eq!(std::fs::read(m.path("hello")).unwrap(), b"hello");
    assert!(process_alive(m.pid()));
    m.unmount();
}

#[test]
fn sigterm_and_plain_umount_end_the_daemon() {
    let (_dir, src) = small_source();
    for how in ["SIGTERM", "SIGINT", "umount"] {
        let m = Mount::new(&src, &[]);
        let pid = m.pid();
        match how {
            "umount" => assert!(
                output_within(Command::new("umount").arg(&m.mnt), COMMAND_LIMIT)
                    .status
                    .success()
            ),
            // SAFETY: signals a process this test started.
            "SIGTERM" => assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0),
            // SAFETY: as above.
            _ => assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGINT) }, 0),
        }
        assert!(
            wait_for(Duration::from_secs(10), || !is_mounted(&m.mnt)),
            "{how}: still mounted"
        );
        assert!(
            wait_for(Duration::from_secs(10), || !process_alive(pid)),
            "{how}: daemon alive"
        );
    }
}

#[test]
fn foreground_logs_to_stderr_and_ctrl_c_unmounts() {
    let (dir, src) = small_source();
    let mnt = empty_dir(dir.path(), "mnt");
    let child = Command::new(bin())
        .args([
            OsStr::new("mount"),
            OsStr::new("--foreground"),
            src.as_os_str(),
            mnt.as_os_str(),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || is_mounted(&mnt)),
        "the foreground mount not up after 10 s"
    );
    assert_eq!(std::fs::read(mnt.join("hello")).unwrap(), b"hello");
    // SAFETY: signals our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = wait_within(
        child,
        Duration::from_secs(10),
        "the foreground mount after SIGINT",
    );
    assert!(out.status.success(), "{:?}", out.status);
    assert!(!is_mounted(&mnt));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("mounted"), "{log}");
    assert!(log.contains("unmounting"), "{log}");
}

#[test]
fn a_background_daemon_logs_to_its_log_file() {
    let (dir, src) = small_source();
    let log = dir.path().join("coorfs.log");
    let m = Mount::new(
        &src,
        &["--log-file", log.to_str().unwrap(), "--log-level", "debug"],
    );
    let _ = std::fs::read(m.path("missing-file"));
    m.unmount();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("mounted"), "{text}");
    assert!(text.contains("lookup: no such file or directory"), "{text}");
}

#[test]
fn umount_refuses_a_busy_mount_unless_lazy() {
    let (_dir, src) = small_source();
    let m = Mount::new(&src, &[]);
    let pid = m.pid();
    let open = std::fs::File::open(m.path("hello")).unwrap();
    let out = coorfs([OsStr::new("umount"), m.mnt.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!(
            "coorfs: {} is busy: a process has a file open or its working directory in it (close it, or pass --lazy)",
            m.mnt.display()
        )
    );
    assert!(is_mounted(&m.mnt));
    let started = std::time::Instant::now();
    let lazy = coorfs([
        OsStr::new("umount"),
        OsStr::new("--lazy"),
        m.mnt.as_os_str(),
    ]);
    // Detached at once, which is what --lazy asks: success, and one line that says the daemon
    // stays until the open file is closed (it exited 1, "still running", once its --timeout
    // had passed).
    assert!(!is_mounted(&m.mnt));
    assert_eq!(lazy.status.code(), Some(0), "{}", stderr(&lazy));
    assert_eq!(
        stderr(&lazy),
        format!(
            "coorfs: {} is detached; its daemon (pid {pid}) serves the files still open in it and exits when the last is closed",
            m.mnt.display()
        )
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The open file is still served, from the detached mount.
    let mut read = String::new();
    std::io::Read::read_to_string(&mut &open, &mut read).unwrap();
    assert_eq!(read, "hello");
    assert!(process_alive(pid));
    drop(open);
    assert!(
        wait_for(Duration::from_secs(10), || !process_alive(pid)),
        "daemon {pid} still running 10 s after its last file was closed"
    );
}

#[test]
fn a_lazy_umount_of_an_idle_mount_waits_for_its_daemon_and_says_nothing() {
    let (_dir, src) = small_source();
    let m = Mount::new(&src, &[]);
    let pid = m.pid();
    let out = coorfs([
        OsStr::new("umount"),
        OsStr::new("--lazy"),
        m.mnt.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
    assert!(!is_mounted(&m.mnt));
    assert!(!process_alive(pid), "daemon {pid} still running");
}

/// Runs `coorfs` with `args` and checks: exit code `code`, exactly one line on stderr that
/// starts with "coorfs: " and contains `want`.
fn expect_failure(args: &[&OsStr], code: i32, want: &str) {
    let out = coorfs(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("coorfs: "), "{err}");
    assert!(err.contains(want), "{args:?}: want {want:?} in {err:?}");
}

#[test]
fn bad_input_is_one_clear_line() {
    let (dir, src) = small_source();
    let d = dir.path();
    let mnt = empty_dir(d, "mnt");
    let full = empty_dir(d, "full");
    std::fs::write(full.join("x"), b"x").unwrap();
    let file = d.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let inside = empty_dir(&src, "inside");
    let missing = d.join("missing");
    let o = |p: &Path| p.as_os_str().to_owned();
    let s = |t: &str| OsStr::new(t).to_owned();
    let cases: Vec<(Vec<std::ffi::OsString>, i32, String)> = vec![
        (
            vec![s("mount"), o(&missing), o(&mnt)],
            2,
            format!("source {}: no such file or directory", missing.display()),
        ),
        (
            vec![s("mount"), o(&file), o(&mnt)],
            2,
            format!("source {}: not a directory", file.display()),
        ),
        (
            vec![s("mount"), o(&src), o(&missing)],
            2,
            format!(
                "mount point {}: no such file or directory",
                missing.display()
            ),
        ),
        (
            vec![s("mount"), o(&src), o(&file)],
            2,
            format!("mount point {}: not a directory", file.display()),
        ),
        (
            vec![s("mount"), o(&src), o(&full)],
            2,
            format!(
                "mount point {} is not empty (pass --allow-non-empty",
                full.display()
            ),
        ),
        (
            vec![s("mount"), o(&src), o(&inside)],
            2,
            format!(
                "mount point {} is inside the source {}",
                inside.display(),
                src.display()
            ),
        ),
        (
            vec![s("mount"), o(&src), o(&src)],
            2,
            "is inside the source".into(),
        ),
        (
            vec![s("mount"), s("--bogus"), o(&src), o(&mnt)],
            2,
            "unexpected argument '--bogus'".into(),
        ),
        (
            vec![
                s("mount"),
                s("--metadata-ttl"),
                s("5parsecs"),
                o(&src),
                o(&mnt),
            ],
            2,
            "expected a duration".into(),
        ),
        (
            vec![s("mount"), s("--threads"), s("0"), o(&src), o(&mnt)],
            2,
            "--threads".into(),
        ),
        (
            vec![s("mount"), s("--block-size"), s("0"), o(&src), o(&mnt)],
            2,
            "\"0\": must be between 4K and 256M".into(),
        ),
        (
            vec![s("mount"), s("--log-level"), s("=[bad"), o(&src), o(&mnt)],
            2,
            "--log-level".into(),
        ),
        (
            vec![
                s("mount"),
                s("--log-file"),
                o(&missing.join("x.log")),
                o(&src),
                o(&mnt),
            ],
            2,
            "log file".into(),
        ),
        (
            vec![s("mount"), o(&src)],
            2,
            "required arguments were not provided: <MOUNTPOINT>".into(),
        ),
        (
            vec![s("frobnicate")],
            2,
            "unrecognized subcommand 'frobnicate'".into(),
        ),
        (
            vec![s("umount"), o(&mnt)],
            2,
            format!("{} is not a coorfs mount", mnt.display()),
        ),
        (
            vec![s("stats"), o(&mnt)],
            2,
            format!("{} is not a coorfs mount", mnt.display()),
        ),
        (
            vec![s("read"), o(&missing)],
            2,
            format!("{}: No such file or directory", missing.display()),
        ),
        (vec![s("read"), o(&mnt)], 2, "no regular files".into()),
    ];
    for (args, code, want) in &cases {
        let args: Vec<&OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        expect_failure(&args, *code, want);
    }
    // The source inside the mount point: mount a parent of the source's directory.
    let outer = open_tempdir();
    let nested_src = outer.path().join("data");
    std::fs::create_dir(&nested_src).unwrap();
    expect_failure(
        &[
            OsStr::new("mount"),
            nested_src.as_os_str(),
            outer.path().as_os_str(),
        ],
        2,
        "is inside the mount point",
    );
    // How opens are told, named wrong in the environment.
    let out = output_within(
        Command::new(bin())
            .args([OsStr::new("mount"), src.as_os_str(), mnt.as_os_str()])
            .env("COORFS_TOLD_BY", "bpf"),
        COMMAND_LIMIT,
    );
    assert_eq!(
        (out.status.code(), stderr(&out)),
        (
            Some(2),
            "coorfs: COORFS_TOLD_BY=bpf: must be ebpf or fanotify".into()
        )
    );
    // Nothing above mounted anything.
    assert!(!is_mounted(&mnt) && !is_mounted(&full) && !is_mounted(&inside));

    // --allow-non-empty mounts over the contents and hides them.
    let m = {
        let out = coorfs([
            OsStr::new("mount"),
            OsStr::new("--allow-non-empty"),
            src.as_os_str(),
            full.as_os_str(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        full.clone()
    };
    assert_eq!(std::fs::read(m.join("hello")).unwrap(), b"hello");
    assert!(!m.join("x").exists());
    // A second mount at the same place is refused.
    expect_failure(
        &[
            OsStr::new("mount"),
            OsStr::new("--allow-non-empty"),
            src.as_os_str(),
            m.as_os_str(),
        ],
        2,
        &format!("mount point {} is already a coorfs mount", m.display()),
    );
    assert!(
        coorfs([OsStr::new("umount"), m.as_os_str()])
            .status
            .success()
    );
    assert_eq!(std::fs::read(m.join("x")).unwrap(), b"x");
}

#[test]
fn a_missing_or_forbidden_fuse_device_is_reported() {
    let (dir, src) = small_source();
    let mnt = empty_dir(dir.path(), "mnt");

    // A private /dev without the fuse device.
    let out = output_within(
        Command::new("unshare")
            .args([
                "-m",
                "sh",
                "-c",
                r#"mount -t tmpfs tmpfs /dev && exec "$0" mount "$1" "$2""#,
            ])
            .arg(bin())
            .arg(&src)
            .arg(&mnt),
        COMMAND_LIMIT,
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "coorfs: /dev/fuse does not exist: load the fuse module (modprobe fuse) or pass the device into the container"
    );

    // A /dev/fuse that is root's alone (mode 600): nobody may not use it. The host's may be
    // 0666 (Ubuntu, containers), so a private /dev holds a node of its own with mode 600.
    let rdev = std::fs::metadata("/dev/fuse").unwrap().rdev();
    let out = output_within(
        Command::new("unshare")
            .args([
                "-m",
                "sh",
                "-c",
                r#"mount -t tmpfs tmpfs /dev && mknod -m 600 /dev/fuse c "$3" "$4" &&
                   exec setpriv --reuid 65534 --regid 65534 --clear-groups "$0" mount "$1" "$2""#,
            ])
            .arg(bin())
            .arg(&src)
            .arg(&mnt)
            .arg(libc::major(rdev).to_string())
            .arg(libc::minor(rdev).to_string()),
        COMMAND_LIMIT,
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "coorfs: /dev/fuse: permission denied: run as root or get read-write access to /dev/fuse"
    );
    assert!(!is_mounted(&mnt));
}

/// How many mounts of any type /proc/mounts lists at `path`.
fn mounts_at(path: &Path) -> usize {
    let text = std::fs::read_to_string("/proc/mounts").unwrap();
    let want = path.to_str().unwrap();
    text.lines()
        .filter(|l| l.split(' ').nth(1) == Some(want))
        .count()
}

#[test]
fn concurrent_mounts_at_one_mount_point_leave_exactly_one() {
    const RACERS: usize = 4;
    let (dir, src) = small_source();
    let mnt = empty_dir(dir.path(), "mnt");
    let _cleanup = UnmountOnDrop(mnt.clone());
    let setting_up = format!(
        "coorfs: mount point {}: another coorfs mount is being set up there",
        mnt.display()
    );
    let already = format!(
        "coorfs: mount point {} is already a coorfs mount (unmount it with: coorfs umount {})",
        mnt.display(),
        mnt.display()
    );
    // The race is decided in milliseconds; a few rounds give it several chances to go wrong.
    for round in 0..5 {
        let children: Vec<_> = (0..RACERS)
            .map(|_| {
                Command::new(bin())
                    .args([OsStr::new("mount"), src.as_os_str(), mnt.as_os_str()])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let outs: Vec<_> = children
            .into_iter()
            .map(|c| wait_within(c, COMMAND_LIMIT, "a racing coorfs mount"))
            .collect();
        let winners = outs.iter().filter(|o| o.status.success()).count();
        let errors: Vec<String> = outs.iter().map(stderr).collect();
        assert_eq!(winners, 1, "round {round}: {errors:?}");
        for out in outs.iter().filter(|o| !o.status.success()) {
            let err = stderr(out);
            assert_eq!(out.status.code(), Some(2), "round {round}: {err}");
            assert!(
                err == setting_up || err == already,
                "round {round}: unexpected {err:?}"
            );
        }
        assert_eq!(mounts_at(&mnt), 1, "round {round}");
        assert_eq!(std::fs::read(mnt.join("hello")).unwrap(), b"hello");
        let out = coorfs([OsStr::new("umount"), mnt.as_os_str()]);
        assert!(out.status.success(), "round {round}: {}", stderr(&out));
        assert_eq!(mounts_at(&mnt), 0, "round {round}");
    }
}

#[test]
fn a_daemon_kept_alive_by_a_lazy_unmount_does_not_block_a_new_mount() {
    let (_dir, src) = small_source();
    let old = Mount::new(&src, &[]);
    let old_pid = old.pid();
    let open = std::fs::File::open(old.path("hello")).unwrap();
    assert!(
        output_within(
            Command::new("umount").arg("-l").arg(&old.mnt),
            COMMAND_LIMIT
        )
        .status
        .success()
    );
    // The old daemon serves the open file until it is closed.
    assert!(!is_mounted(&old.mnt));
    assert!(process_alive(old_pid));
    let out = coorfs([OsStr::new("mount"), src.as_os_str(), old.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(old.path("hello")).unwrap(), b"hello");
    assert_ne!(old.pid(), old_pid);
    // Unmounts the new mount at the same place and checks that its daemon is gone.
    old.unmount();
    drop(open);
    assert!(
        wait_for(Duration::from_secs(10), || !process_alive(old_pid)),
        "the old daemon {old_pid} still running 10 s after its last file was closed"
    );
}

#[test]
fn a_coorfs_mount_is_refused_as_a_source() {
    let (dir, src) = small_source();
    empty_dir(&src, "sub");
    let m = Mount::new(&src, &[]);
    let mnt2 = empty_dir(dir.path(), "mnt2");
    let link = dir.path().join("link-to-mount");
    std::os::unix::fs::symlink(&m.mnt, &link).unwrap();
    let is_mount = format!(
        "source {} is a coorfs mount; mount its source instead",
        m.mnt.display()
    );
    expect_failure(
        &[OsStr::new("mount"), m.mnt.as_os_str(), mnt2.as_os_str()],
        2,
        &is_mount,
    );
    // Through a symlink: the same mount.
    expect_failure(
        &[OsStr::new("mount"), link.as_os_str(), mnt2.as_os_str()],
        2,
        &is_mount,
    );
    expect_failure(
        &[
            OsStr::new("mount"),
            m.path("sub").as_os_str(),
            mnt2.as_os_str(),
        ],
        2,
        &format!(
            "source {} is inside the coorfs mount {}; mount its source instead",
            m.path("sub").display(),
            m.mnt.display()
        ),
    );
    assert!(!is_mounted(&mnt2));
    // Its source is fine.
    let out = coorfs([OsStr::new("mount"), src.as_os_str(), mnt2.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        coorfs([OsStr::new("umount"), mnt2.as_os_str()])
            .status
            .success()
    );
    m.unmount();

    // A mount that caches nothing passes reads through: it may serve as (emulated) storage.
    let passthrough = Mount::new(&src, &["--policy", "none", "--read-delay", "1ms"]);
    let out = coorfs([
        OsStr::new("mount"),
        passthrough.mnt.as_os_str(),
        mnt2.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(mnt2.join("hello")).unwrap(), b"hello");
    assert!(
        coorfs([OsStr::new("umount"), mnt2.as_os_str()])
            .status
            .success()
    );
    passthrough.unmount();
}

#[test]
fn a_cache_of_zero_bytes_needs_policy_none() {
    let (dir, src) = small_source();
    let mnt = empty_dir(dir.path(), "mnt");
    let _cleanup = UnmountOnDrop(mnt.clone());
    let want = "coorfs: --cache-size 0 leaves no room to cache anything (pass --policy none to mount without a cache)";
    for policy in [&[][..], &["--policy", "minio"], &["--policy", "lru"]] {
        let mut args = vec![
            OsStr::new("mount"),
            OsStr::new("--cache-size"),
            OsStr::new("0"),
        ];
        args.extend(policy.iter().map(OsStr::new));
        args.extend([src.as_os_str(), mnt.as_os_str()]);
        let out = coorfs(&args);
        assert_eq!(out.status.code(), Some(2), "{policy:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), want, "{policy:?}");
        assert!(!is_mounted(&mnt));
    }
    let out = coorfs([
        OsStr::new("mount"),
        OsStr::new("--cache-size"),
        OsStr::new("0"),
        OsStr::new("--policy"),
        OsStr::new("none"),
        src.as_os_str(),
        mnt.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(mnt.join("hello")).unwrap(), b"hello");
    assert_eq!(stats(&mnt)["policy"], "none");
    assert!(
        coorfs([OsStr::new("umount"), mnt.as_os_str()])
            .status
            .success()
    );
}

#[test]
fn ioctl_poll_seek_and_locks_are_answered_without_a_log_line() {
    use std::io::IsTerminal;
    use std::os::fd::AsRawFd;
    let (dir, src) = small_source();
    let log = dir.path().join("coorfs.log");
    // The default level (info), as a user runs it.
    let m = Mount::new(&src, &["--log-file", log.to_str().unwrap()]);
    let file = std::fs::File::open(m.path("hello")).unwrap();
    let fd = file.as_raw_fd();
    let errno = || std::io::Error::last_os_error().raw_os_error();

    // isatty() is ioctl(TCGETS), which Python's open() sends for every file; the kernel
    // passes each one to the daemon.
    for _ in 0..1000 {
        // SAFETY: termios is plain old data; TCGETS writes one into `t`.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `t` a valid termios.
        let rc = unsafe { libc::ioctl(fd, libc::TCGETS, &mut t) };
        assert_eq!((rc, errno()), (-1, Some(libc::ENOTTY)));
    }
    assert!(!file.is_terminal());
    let out = output_within(
        Command::new("python3")
            .args([
                "-c",
                "import os, sys\n\
                 for _ in range(200):\n    open(sys.argv[1], 'rb').read()\n\
                 fd = os.open(sys.argv[1], os.O_RDONLY)\n\
                 try:\n    os.tcgetpgrp(fd)\nexcept OSError as e:\n    print(e.strerror)\n",
            ])
            .arg(m.path("hello")),
        COMMAND_LIMIT,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "Inappropriate ioctl for device"
    );

    // SEEK_DATA and SEEK_HOLE (twice: the second time the kernel answers alone), poll, and
    // the two kinds of locks: what a local 5-byte file answers.
    for _ in 0..2 {
        // SAFETY: lseek and poll on an open descriptor; `p` is a valid pollfd.
        unsafe {
            assert_eq!(libc::lseek(fd, 0, libc::SEEK_DATA), 0);
            assert_eq!(libc::lseek(fd, 0, libc::SEEK_HOLE), 5);
            assert_eq!(
                (libc::lseek(fd, 5, libc::SEEK_DATA), errno()),
                (-1, Some(libc::ENXIO))
            );
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            assert_eq!(libc::poll(&mut p, 1, 0), 1);
            assert!(p.revents & libc::POLLIN != 0);
        }
    }
    // SAFETY: flock and fcntl on an open descriptor; `lock` is a valid flock.
    unsafe {
        assert_eq!(libc::flock(fd, libc::LOCK_SH), 0);
        let mut lock: libc::flock = std::mem::zeroed();
        lock.l_type = libc::F_RDLCK as i16;
        lock.l_whence = libc::SEEK_SET as i16;
        assert_eq!(libc::fcntl(fd, libc::F_SETLK, &lock), 0);
        assert_eq!(libc::fcntl(fd, libc::F_GETLK, &mut lock), 0);
    }
    drop(file);
    m.unmount();

    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("mounted"), "{text}");
    for line in text.lines() {
        let lower = line.to_lowercase();
        assert!(
            !["warn", "error", "ioctl", "not implemented"]
                .iter()
                .any(|w| lower.contains(w)),
            "{line}\nin the log:\n{text}"
        );
    }
}
