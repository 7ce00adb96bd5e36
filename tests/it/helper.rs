//! coorfs mounted like any filesystem: a real `mount -t fuse.coorfs` (util-linux) through the
//! helper `/sbin/mount.fuse.coorfs`, an fstab line, and `mount.fuse3`'s way of calling it.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;

fn mount(args: &[&str]) -> std::process::Output {
    output_within(Command::new("mount").args(args), Duration::from_secs(60))
}

/// Every file of `src` through `mnt`, compared.
fn same_bytes(src: &Path, mnt: &Path, rels: &[PathBuf]) {
    for rel in rels {
        assert!(
            std::fs::read(mnt.join(rel)).unwrap() == std::fs::read(src.join(rel)).unwrap(),
            "{}",
            rel.display()
        );
    }
}

/// Unmounts with umount(8), as an fstab user would, and waits for the daemon to go.
fn umount(mnt: &Path) {
    let pid = coorfs::daemon::daemon_pid(mnt).unwrap();
    let out = output_within(Command::new("umount").arg(mnt), Duration::from_secs(30));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(wait_for(Duration::from_secs(10), || !process_alive(pid)));
}

#[test]
fn mount_t_fuse_coorfs_and_an_fstab_line_mount_with_their_options() {
    let _helper = MountHelper::install();
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 40, 8 * 1024, 2);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    std::fs::set_permissions(&mnt, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (s, m) = (src.to_str().unwrap(), mnt.to_str().unwrap());

    // mount -t, with mount(8)'s options beside coorfs's.
    let out = mount(&[
        "-t",
        "fuse.coorfs",
        s,
        m,
        "-o",
        "cache_size=3M,allow_other,policy=lru,nosuid,nodev,_netdev,nofail",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(mounts.contains(&format!(" {m} fuse.coorfs ")), "{mounts}");
    let st = stats(&mnt);
    assert_eq!(num(&st, "cache_capacity"), 3 << 20);
    assert_eq!(st["policy"], "lru");
    same_bytes(&src, &mnt, &rels);
    // allow_other: another user reads through it.
    let file = mnt.join(&rels[0]);
    let out = as_nobody("cat", &[file.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, std::fs::read(src.join(&rels[0])).unwrap());
    umount(&mnt);
    assert!(!is_mounted(&mnt));

    // An fstab line (another fstab than the machine's: mount --fstab), mounted by its
    // mount point alone.
    let fstab = dir.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "# a dataset\n{s} {m} fuse.coorfs defaults,cache_size=2M,no_prefetch,x-systemd.requires=network-online.target 0 0\n"
        ),
    )
    .unwrap();
    let out = mount(&["--fstab", fstab.to_str().unwrap(), m]);
    assert!(out.status.success(), "{}", stderr(&out));
    let st = stats(&mnt);
    assert_eq!(num(&st, "cache_capacity"), 2 << 20);
    same_bytes(&src, &mnt, &rels);
    umount(&mnt);

    // A fake mount checks and mounts nothing.
    let out = mount(&["-f", "-t", "fuse.coorfs", s, m, "-o", "cache_size=2M"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!is_mounted(&mnt));

    // An option coorfs does not know: one line that names it, nothing mounted.
    let out = mount(&["-t", "fuse.coorfs", s, m, "-o", "cache_size=2M,bogus=1"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("mount option \"bogus\" is not one of coorfs's"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!is_mounted(&mnt));
}

#[test]
fn mount_fuse3s_command_line_mounts_too() {
    // Without the helper, mount.fuse3 runs `coorfs SOURCE MOUNTPOINT -o OPTIONS`.
    let dir = open_tempdir();
    let src = dir.path().join("src");
    let rels = make_dataset(&src, 10, 4096, 1);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let out = coorfs([
        src.as_os_str(),
        mnt.as_os_str(),
        OsStr::new("-o"),
        OsStr::new("rw,cache_size=1M,dev,suid"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(num(&stats(&mnt), "cache_capacity"), 1 << 20);
    same_bytes(&src, &mnt, &rels);
    umount(&mnt);
    // Bad input there is one line and status 2.
    let out = coorfs([
        src.as_os_str(),
        mnt.as_os_str(),
        OsStr::new("-o"),
        OsStr::new("cache_size"),
    ]);
    fails_with_line(
        &out,
        2,
        "mount option \"cache_size\" takes a value",
        "no value",
    );
}
