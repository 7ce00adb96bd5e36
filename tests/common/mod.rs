//! Shared helpers for the tests that mount for real (root and /dev/fuse are required; CI runs
//! as root).
#![allow(dead_code)]

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The coorfs binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_coorfs")
}

/// Runs coorfs with `args` and returns what it did.
pub fn coorfs<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(bin()).args(args).output().expect("run coorfs")
}

/// A temporary directory that other users may traverse (tests read as `nobody`).
pub fn open_tempdir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("coorfs-test")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// True if `path` is a mount point of type fuse.coorfs.
pub fn is_mounted(path: &Path) -> bool {
    coorfs::mountinfo::is_coorfs_mount(path)
}

/// A live mount of `source`, unmounted (and its daemon gone) when dropped.
pub struct Mount {
    pub source: PathBuf,
    pub mnt: PathBuf,
    _mnt_dir: tempfile::TempDir,
}

impl Mount {
    /// Mounts `source` with extra arguments; panics with coorfs's stderr on failure.
    pub fn new(source: &Path, extra: &[&str]) -> Mount {
        let mnt_dir = open_tempdir();
        let mnt = mnt_dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::set_permissions(&mnt, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut args: Vec<&OsStr> = vec![OsStr::new("mount")];
        args.extend(extra.iter().map(OsStr::new));
        args.push(source.as_os_str());
        args.push(mnt.as_os_str());
        let out = coorfs(&args);
        assert!(
            out.status.success(),
            "coorfs mount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Mount {
            source: source.to_path_buf(),
            mnt,
            _mnt_dir: mnt_dir,
        }
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        coorfs::daemon::daemon_pid(&self.mnt).expect("daemon pid attribute")
    }

    /// The path of `rel` inside the mount.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Unmounts with `coorfs umount` and checks that nothing is left behind.
    pub fn unmount(self) {
        let pid = self.pid();
        let out = coorfs([OsStr::new("umount"), self.mnt.as_os_str()]);
        assert!(
            out.status.success(),
            "coorfs umount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!is_mounted(&self.mnt));
        assert!(!process_alive(pid), "daemon {pid} still running");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// True while `pid` runs (zombies count as gone).
pub fn process_alive(pid: u32) -> bool {
    coorfs::daemon::alive(pid)
}

/// Waits until `cond` holds, up to `timeout`.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Deterministic pseudo-random bytes (xorshift), so that files differ from each other.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes `count` files of `size` bytes in `classes` subdirectories of `root`; returns their
/// paths relative to `root`, sorted.
pub fn make_dataset(root: &Path, count: usize, size: usize, classes: usize) -> Vec<PathBuf> {
    let mut rels = Vec::new();
    for i in 0..count {
        let rel = PathBuf::from(format!("c{:03}/f{:06}.bin", i % classes, i));
        let path = root.join(&rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes(i as u64, size)).unwrap();
        rels.push(rel);
    }
    rels.sort();
    rels
}

/// The `user.coorfs.stats` document of a mount.
pub fn stats(mnt: &Path) -> serde_json::Value {
    let raw = xattr::get(mnt, "user.coorfs.stats").unwrap().unwrap();
    serde_json::from_slice(&raw).unwrap()
}

/// The job of process group `pgid` in a stats document.
pub fn job_of(s: &serde_json::Value, pgid: u32) -> &serde_json::Value {
    s["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"] == format!("pgid {pgid}"))
        .unwrap_or_else(|| panic!("no job pgid {pgid} in {s}"))
}

/// A numeric field of a stats document (or of one of its epochs).
pub fn num(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

/// Waits until the mount's scan of its source is complete, so that epochs are counted.
pub fn wait_for_scan(mnt: &Path) {
    assert!(wait_for(Duration::from_secs(30), || num(
        &stats(mnt),
        "scan_complete"
    ) == 1));
}

/// Last line of stderr, trimmed.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_string()
}

/// The uid and gid of `nobody`, whom the permission tests act as.
pub const NOBODY: u32 = 65534;

/// Runs `cmd` as user and group 65534 (nobody), with no supplementary groups.
pub fn as_nobody(cmd: &str, args: &[&OsStr]) -> Output {
    Command::new(cmd)
        .args(args)
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .unwrap()
}

/// Runs the shell script `script` as nobody, with `args` as $1, $2, ...
pub fn sh_as_nobody(script: &str, args: &[&Path]) -> Output {
    let mut all: Vec<&OsStr> = vec![OsStr::new("-c"), OsStr::new(script), OsStr::new("sh")];
    all.extend(args.iter().map(|p| p.as_os_str()));
    as_nobody("sh", &all)
}
