//! Shared helpers for the tests that mount for real (root and /dev/fuse are required; CI runs
//! as root).
#![allow(dead_code)]

pub mod proxy;
pub mod stores;

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The coorfs binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_coorfs")
}

/// Runs coorfs with `args` and returns what it did (within [`COMMAND_LIMIT`]).
pub fn coorfs<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    output_within(Command::new(bin()).args(args), COMMAND_LIMIT)
}

/// How long a command a test runs may take before the test calls it hung: the slowest here
/// (a few epochs through a delayed mount, a Python DataLoader pattern) take seconds.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(300);

/// Waits for `child` to exit and collects what it wrote to its piped stdout and stderr (empty
/// for streams not piped). If it still runs after `limit`, kills it and panics naming `what`:
/// a hang (a command stuck on a mount whose daemon is stuck) fails the test instead of
/// stalling it forever.
pub fn wait_within(mut child: Child, limit: Duration, what: &str) -> Output {
    use std::io::Read;
    let start = Instant::now();
    fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// Runs `cmd` with its stdout and stderr piped and waits for it as [`wait_within`] does.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    let what = format!("{cmd:?}");
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    wait_within(child, limit, &what)
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
    /// The keeper's pid as the mount began, if it has one: read then, when the mount has
    /// nothing else to do (a read of the attribute under load failed once, and the keeper
    /// left alive by `kill` started a daemon that held the disk cache).
    keeper: Option<u32>,
    /// Let go last, once the mount is gone.
    _beside: Beside,
}

/// Who may mount now. Every area's tests share one process and its test threads; as when
/// each area was a test binary of its own, mounts of two areas are never alive at once (two
/// tests of one area may run side by side, as they always did), and a test that measures
/// (jobs in step, `sharing.rs`) runs [`alone`].
struct Turns {
    /// Mounts alive, of tests not alone.
    mounts: usize,
    /// The area (the test's first module) those mounts are of.
    area: Option<String>,
    /// The thread of the test that runs alone, if one does.
    alone: Option<std::thread::ThreadId>,
}

static TURNS: std::sync::Mutex<Turns> = std::sync::Mutex::new(Turns {
    mounts: 0,
    area: None,
    alone: None,
});
static TURN_CHANGED: std::sync::Condvar = std::sync::Condvar::new();

fn turns() -> std::sync::MutexGuard<'static, Turns> {
    TURNS.lock().unwrap_or_else(|e| e.into_inner())
}

fn wait_turn(
    t: std::sync::MutexGuard<'static, Turns>,
    mut until: impl FnMut(&mut Turns) -> bool,
) -> std::sync::MutexGuard<'static, Turns> {
    TURN_CHANGED
        .wait_while(t, |t| !until(t))
        .unwrap_or_else(|e| e.into_inner())
}

/// The area of the test this thread runs (libtest names the thread after the test, `s3::x`);
/// None on a thread a test started itself.
fn test_area() -> Option<String> {
    let current = std::thread::current();
    let (area, _) = current.name()?.split_once("::")?;
    Some(area.to_string())
}

/// Held by a test that must run with no other test's mount alive: waits until the others'
/// mounts are gone, and their next mounts wait until it is dropped (a test that failed does
/// not stop the others).
pub struct Alone(());

pub fn alone() -> Alone {
    let me = std::thread::current().id();
    let mut t = wait_turn(turns(), |t| t.alone.is_none() && t.mounts == 0);
    t.alone = Some(me);
    Alone(())
}

impl Drop for Alone {
    fn drop(&mut self) {
        turns().alone = None;
        TURN_CHANGED.notify_all();
    }
}

/// A mount's place beside the others: counted, once no test runs alone and the mounts alive
/// are of its area (or in the test that runs alone, or on a thread a test started: not
/// counted).
struct Beside(bool);

impl Beside {
    fn take() -> Beside {
        let me = std::thread::current().id();
        let Some(area) = test_area() else {
            return Beside(false);
        };
        let t = turns();
        if t.alone == Some(me) {
            return Beside(false);
        }
        let mut t = wait_turn(t, |t| {
            t.alone.is_none() && t.area.as_ref().is_none_or(|a| *a == area)
        });
        t.mounts += 1;
        t.area = Some(area);
        Beside(true)
    }
}

impl Drop for Beside {
    fn drop(&mut self) {
        if self.0 {
            let mut t = turns();
            t.mounts -= 1;
            if t.mounts == 0 {
                t.area = None;
            }
            drop(t);
            TURN_CHANGED.notify_all();
        }
    }
}

impl Mount {
    /// Mounts `source` with extra arguments; panics with coorfs's stderr on failure.
    pub fn new(source: &Path, extra: &[&str]) -> Mount {
        Mount::with_env(source, extra, &[])
    }

    /// Mounts `source` with extra arguments and environment variables `env` (an object
    /// store's endpoint and keys); panics with coorfs's stderr on failure.
    pub fn with_env(source: &Path, extra: &[&str], env: &[(&str, &str)]) -> Mount {
        Mount::by(Command::new(bin()), source, extra, env)
    }

    /// [`Mount::with_env`], the daemon inside the memory cgroup `cg` (a pod).
    pub fn in_cgroup(
        cg: &TestCgroup,
        source: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Mount {
        Mount::by(cg.command(bin()), source, extra, env)
    }

    /// Mounts `source` with `coorfs`, the command that runs coorfs.
    fn by(mut coorfs: Command, source: &Path, extra: &[&str], env: &[(&str, &str)]) -> Mount {
        let beside = Beside::take();
        let mnt_dir = open_tempdir();
        let mnt = mnt_dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::set_permissions(&mnt, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut args: Vec<&OsStr> = vec![OsStr::new("mount")];
        args.extend(extra.iter().map(OsStr::new));
        args.push(source.as_os_str());
        args.push(mnt.as_os_str());
        coorfs.args(&args).envs(env.iter().copied());
        let out = output_within(&mut coorfs, COMMAND_LIMIT);
        assert!(
            out.status.success(),
            "coorfs mount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let keeper = coorfs::daemon::keeper_pid(&mnt);
        Mount {
            source: source.to_path_buf(),
            mnt,
            _mnt_dir: mnt_dir,
            keeper,
            _beside: beside,
        }
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        coorfs::daemon::daemon_pid(&self.mnt).expect("daemon pid attribute")
    }

    /// Kills the mount's keeper and daemon with SIGKILL, as the loss of its machine would, and
    /// returns the daemon's pid: the keeper first, which would start another daemon.
    pub fn kill(&self) -> u32 {
        let pid = self.pid();
        let keeper = (self.keeper)
            .or_else(|| coorfs::daemon::keeper_pid(&self.mnt))
            .unwrap_or(0);
        for p in [keeper, pid] {
            if p != 0 {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(p as i32, libc::SIGKILL) };
            }
        }
        pid
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

/// Reads each of `rels` whole through `m` and asserts its bytes are the source's.
pub fn assert_reads_the_source(m: &Mount, rels: &[PathBuf]) {
    for rel in rels {
        assert_eq!(
            std::fs::read(m.path(rel)).unwrap(),
            std::fs::read(m.source.join(rel)).unwrap(),
            "{}",
            rel.display()
        );
    }
}

/// Unmounts (lazily) whatever is still mounted at a path when a test ends, passed or not.
pub struct UnmountOnDrop(pub PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        for _ in 0..8 {
            if !is_mounted(&self.0) {
                break;
            }
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// True while `pid` runs (zombies count as gone).
pub fn process_alive(pid: u32) -> bool {
    coorfs::daemon::alive(pid)
}

/// Waits until `cond` holds, up to `timeout`; false if it never did (callers assert it, with
/// what they waited for).
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

/// Requests a hot epoch may still send for pages the kernel was given: this machine (and
/// CI's) runs a DAMON scheme that pages out page cache in physical regions idle for a minute,
/// with gigabytes free (`/sys/kernel/mm/damon/admin`), and now and then takes a page a test
/// has just read. Such a READ is real, and counted; a regression sends one for every file.
pub const STRAY_READS: u64 = 8;

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

/// Drops the page cache's pages of every file under `root` (written to disk first), as a
/// dataset on disk that nothing has read lately: a shard the page cache holds whole is read by
/// the kernel from there, not through the daemon and its cache (`fs/plan.rs`).
pub fn evict_pages(root: &Path) {
    use std::os::fd::AsRawFd;
    for entry in files_under(root) {
        let entry = root.join(entry);
        let f = std::fs::File::open(&entry).unwrap();
        f.sync_all().unwrap();
        // SAFETY: a live descriptor; the call only advises the kernel about its pages.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "posix_fadvise {}", entry.display());
    }
}

/// Every regular file beneath `root`, relative, sorted.
pub fn files_under(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                dirs.push(e.path());
            } else {
                out.push(e.path().strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
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

/// FUSE requests of kind `op` (`"lookup"`, `"ioctl"`, ...) the mount at `mnt` answered so far.
pub fn requests(mnt: &Path, op: &str) -> u64 {
    stats(mnt)["requests"][op]["count"].as_u64().unwrap_or(0)
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
    let limit = Duration::from_secs(30);
    assert!(
        wait_for(limit, || num(&stats(mnt), "scan_complete") == 1),
        "the scan of {} not complete after {limit:?}: {}",
        mnt.display(),
        stats(mnt)
    );
}

/// Waits until the kernel opens the files of the mount at `mnt` itself and the daemon is told
/// of each open (`--opens kernel` once the scan is done; `--opens auto` once opens came fast).
pub fn wait_for_kernel_opens(mnt: &Path) {
    let limit = Duration::from_secs(30);
    let told = || {
        let s = stats(mnt);
        let how = s["opens_why"].as_str();
        s["opens"] == "kernel" && matches!(how, Some("told by eBPF" | "told by fanotify"))
    };
    assert!(
        wait_for(limit, told),
        "the kernel does not open the files of {} after {limit:?}: {}",
        mnt.display(),
        stats(mnt)
    );
}

/// Last line of stderr, trimmed.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_string()
}

/// The uid and gid of `nobody`, whom the permission tests act as.
pub const NOBODY: u32 = 65534;

/// Runs `cmd` as user and group 65534 (nobody), with no supplementary groups.
pub fn as_nobody(cmd: &str, args: &[&OsStr]) -> Output {
    output_within(
        Command::new(cmd).args(args).uid(NOBODY).gid(NOBODY),
        COMMAND_LIMIT,
    )
}

/// Extended attributes: each name with its value, or the errno of reading it.
pub type Xattrs = Vec<(String, Result<Vec<u8>, i32>)>;

/// The extended attributes of `path` as nobody (uid and gid 65534, no supplementary groups)
/// reads them, without the attr package: each name with its value or the errno of reading
/// it; the errno of listing them if that fails. A forked child drops to nobody and makes the
/// system calls itself, into buffers allocated before the fork (a child of a threaded process
/// must not allocate), and writes records to a pipe: b'E' and an errno, or b'A', the name's
/// length, the name, the value's length (negative: an errno) and the value.
pub fn xattrs_as_nobody(path: &Path) -> Result<Xattrs, i32> {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    // The kernel's limits: 64 KiB of names, 64 KiB a value.
    const MAX: usize = 64 << 10;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; MAX];
    let mut value = vec![0u8; MAX];
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: the child makes only async-signal-safe system calls on memory allocated before
    // the fork, then _exits; the parent owns the descriptors it closes.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            libc::close(fds[0]);
            let out = fds[1];
            let put = |bytes: &[u8]| {
                libc::write(out, bytes.as_ptr().cast(), bytes.len());
            };
            let errno = || *libc::__errno_location();
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(NOBODY) != 0
                || libc::setuid(NOBODY) != 0
            {
                libc::_exit(1);
            }
            let n = libc::listxattr(c_path.as_ptr(), names.as_mut_ptr().cast(), MAX);
            if n < 0 {
                put(b"E");
                put(&errno().to_le_bytes());
                libc::_exit(0);
            }
            let mut at = 0;
            while at < n as usize {
                let len = names[at..n as usize]
                    .iter()
                    .position(|&b| b == 0)
                    .unwrap_or(0);
                let name = names.as_ptr().add(at).cast();
                let got = libc::getxattr(c_path.as_ptr(), name, value.as_mut_ptr().cast(), MAX);
                put(b"A");
                put(&(len as u32).to_le_bytes());
                put(&names[at..at + len]);
                if got < 0 {
                    put(&(-errno()).to_le_bytes());
                } else {
                    put(&(got as i32).to_le_bytes());
                    put(&value[..got as usize]);
                }
                at += len + 1;
            }
            libc::_exit(0);
        }
        libc::close(fds[1]);
        let mut raw = Vec::new();
        std::fs::File::from_raw_fd(fds[0])
            .read_to_end(&mut raw)
            .unwrap();
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child reading attributes as nobody failed: status {status}"
        );
        parse_xattr_records(&raw)
    }
}

/// The records [`xattrs_as_nobody`]'s child wrote.
fn parse_xattr_records(mut rest: &[u8]) -> Result<Xattrs, i32> {
    fn take<'a>(rest: &mut &'a [u8], n: usize) -> &'a [u8] {
        let (head, tail) = rest.split_at(n);
        *rest = tail;
        head
    }
    fn word(rest: &mut &[u8]) -> i32 {
        i32::from_le_bytes(take(rest, 4).try_into().unwrap())
    }
    let mut attrs = Vec::new();
    while let Some((&tag, tail)) = rest.split_first() {
        rest = tail;
        match tag {
            b'E' => return Err(word(&mut rest)),
            b'A' => {
                let len = word(&mut rest) as usize;
                let name = String::from_utf8_lossy(take(&mut rest, len)).into_owned();
                let value = match word(&mut rest) {
                    errno if errno < 0 => Err(-errno),
                    len => Ok(take(&mut rest, len as usize).to_vec()),
                };
                attrs.push((name, value));
            }
            other => panic!("unexpected record {other} from the child"),
        }
    }
    Ok(attrs)
}

/// Asserts that `nobody` reads each `(path, bytes)` of the mount with `cat`, as the bytes.
pub fn assert_nobody_reads(m: &Mount, files: &[(&str, &str)]) {
    for (rel, want) in files {
        let out = sh_as_nobody("cat \"$1\"", &[&m.path(rel)]);
        assert_eq!(out.stdout, want.as_bytes(), "{rel}: {}", stderr(&out));
    }
}

/// Runs the shell script `script` as nobody, with `args` as $1, $2, ...
pub fn sh_as_nobody(script: &str, args: &[&Path]) -> Output {
    let mut all: Vec<&OsStr> = vec![OsStr::new("-c"), OsStr::new(script), OsStr::new("sh")];
    all.extend(args.iter().map(|p| p.as_os_str()));
    as_nobody("sh", &all)
}

/// Python that hands hints to a coorfs mount the way its order file takes them (see
/// `src/fs/order.rs`): argv[1] the order file, argv[2] a file holding the hint, argv[3] how
/// many descriptors send it, all chunks first and then every commit; prints each
/// descriptor's result (0, or the errno of its first failing call, the open's included).
pub const SEND_HINTS_PY: &str = r#"
import fcntl, os, sys
CHUNK = 16380
HINT_CHUNK = (1 << 30) | (CHUNK << 16) | (ord("C") << 8) | 1
HINT_COMMIT = (ord("C") << 8) | 2
path, times = sys.argv[1], int(sys.argv[3])
hint = open(sys.argv[2], "rb").read()
fds, results = [], []
for _ in range(times):
    try:
        fds.append(os.open(path, os.O_RDONLY))
        results.append(None)
    except OSError as e:
        fds.append(None)
        results.append(e.errno)
for i, fd in enumerate(fds):
    if fd is None:
        continue
    try:
        for at in range(0, len(hint), CHUNK - 4):
            part = hint[at:at + CHUNK - 4]
            buf = bytearray(CHUNK)
            buf[:4] = len(part).to_bytes(4, "little")
            buf[4:4 + len(part)] = part
            fcntl.ioctl(fd, HINT_CHUNK, buf, True)
    except OSError as e:
        results[i] = e.errno
for i, fd in enumerate(fds):
    if fd is None:
        continue
    try:
        fcntl.ioctl(fd, HINT_COMMIT, 0)
        if results[i] is None:
            results[i] = 0
    except OSError as e:
        if results[i] is None:
            results[i] = e.errno
print(" ".join(str(r) for r in results))
"#;

/// `hint` handed to order file `order` by nobody through `times` descriptors at once: each
/// one's result, 0 or an errno.
pub fn hints_as_nobody(order: &Path, hint: &str, times: usize) -> Vec<i32> {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), hint).unwrap();
    std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = as_nobody(
        "python3",
        &[
            OsStr::new("-c"),
            OsStr::new(SEND_HINTS_PY),
            order.as_os_str(),
            file.path().as_os_str(),
            OsStr::new(&times.to_string()),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|r| r.parse().unwrap())
        .collect()
}

/// Free TCP ports on the loopback interface, below the kernel's ephemeral range
/// (`ip_local_port_range`): a port the system hands out itself (bind to 0, or the source port
/// of a connection, of which the etcd tests make many) could be taken again between this
/// check and the test's bind, and was (`Address already in use`). Each test process draws
/// from its own stretch of 20,000-32,000, by its pid, so tests running at once differ.
pub fn free_ports(n: usize) -> Vec<u16> {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    const LOW: u16 = 20_000;
    const SPAN: u16 = 12_000;
    let start = (std::process::id() % u32::from(SPAN)) as u16;
    let mut ports = Vec::with_capacity(n);
    let mut held = Vec::with_capacity(n);
    while ports.len() < n {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(k < SPAN, "no free port left in {LOW}..{}", LOW + SPAN);
        let port = LOW + (start + k) % SPAN;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            held.push(l);
            ports.push(port);
        }
    }
    ports
}

/// A scratch place for bad mount options: an empty source and mount point, and a cluster
/// secret with file mode `mode`.
pub struct Scratch {
    _dir: tempfile::TempDir,
    pub src: String,
    pub mnt: String,
    pub secret: String,
}

pub fn scratch(mode: u32) -> Scratch {
    let dir = open_tempdir();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (src, mnt, secret) = (path("src"), path("mnt"), path("secret"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::write(&secret, "0123456789abcdef0123").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(mode)).unwrap();
    Scratch {
        _dir: dir,
        src,
        mnt,
        secret,
    }
}

/// Checks that `out` (of `what`) exited with `code` and said one line that holds `line`.
pub fn fails_with_line(out: &Output, code: i32, line: &str, what: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{what}: {err}");
    assert!(err.contains(line), "{what}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{what}: {err}");
}

/// What two epochs of shards read by 2 processes in a pod took from the source: bytes in
/// epoch 1 and in epoch 2, and the bytes cached between them ([`two_epochs_in`]).
pub struct TwoEpochs {
    pub first: u64,
    pub second: u64,
    pub cached: u64,
    /// Bytes the kernel asked for again in epoch 1, and in epoch 2 (pages it read ahead and
    /// dropped for want of memory), and bytes the cache gave back in epoch 2: the daemon
    /// reads them again by right.
    pub reasked_first: u64,
    pub reasked: u64,
    pub freed: u64,
    /// The mount's stats after epoch 2, for a failure's message.
    pub stats: serde_json::Value,
}

impl TwoEpochs {
    /// Asserts that epoch 1 read at most `first_pct`% of the `dataset`'s bytes and epoch 2
    /// at most `second_pct`% of what the cache lacked after epoch 1, which held 64 MiB or
    /// more, each with what the kernel asked for again (and in epoch 2 the cache gave back:
    /// the pod's memory, not the daemon's reads: a pod too tight for two readers' readahead
    /// windows made the kernel drop pages 10-20 ms after they came, and ask again); prints
    /// both ratios.
    pub fn assert_within(&self, dataset: u64, first_pct: u64, second_pct: u64) {
        let (first, second, cached) = (self.first, self.second, self.cached);
        let why = format!(
            "cached after epoch 1: {cached}, asked again {} and {}, freed {}; {}",
            self.reasked_first, self.reasked, self.freed, self.stats
        );
        let asked = dataset + self.reasked_first;
        let lacked = dataset - cached + self.reasked + self.freed;
        println!(
            "epoch 1: {:.4}x the dataset and what the kernel asked again ({} bytes); epoch 2: \
             {:.4}x what the cache lacked and the kernel asked again ({} bytes, {} freed)",
            first as f64 / asked as f64,
            self.reasked_first,
            second as f64 / lacked as f64,
            self.reasked,
            self.freed
        );
        assert!(
            cached >= 64 << 20,
            "the cache kept too little to tell: {why}"
        );
        assert!(
            first * 100 <= asked * first_pct,
            "epoch 1 read {first} for {asked}: {why}"
        );
        assert!(
            second * 100 <= lacked * second_pct,
            "epoch 2 read {second} for {lacked}: {why}"
        );
    }
}

/// Reads the `dataset` bytes under `mnt` twice with `coorfs read --procs 2` inside `cg`, and
/// says what each epoch read from the source.
pub fn two_epochs_in(cg: &TestCgroup, mnt: &Path, dataset: u64) -> TwoEpochs {
    let epoch = |seed: &str| {
        let out = cg.coorfs(&[
            OsStr::new("read"),
            OsStr::new("--json"),
            OsStr::new("--procs"),
            OsStr::new("2"),
            OsStr::new("--seed"),
            OsStr::new(seed),
            mnt.as_os_str(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let read: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!((num(&read, "bytes"), num(&read, "errors")), (dataset, 0));
    };
    epoch("1");
    let after = stats(mnt);
    let cached = num(&after, "cached_bytes");
    epoch("2");
    let stats = stats(mnt);
    let e = &stats["epochs"];
    let grew = |name| num(&stats, name) - num(&after, name);
    TwoEpochs {
        first: num(&e[0], "bytes_from_source"),
        second: num(&e[1], "bytes_from_source"),
        cached,
        reasked_first: num(&after, "kernel_reasked_bytes"),
        reasked: grew("kernel_reasked_bytes"),
        freed: grew("cache_freed_bytes"),
        stats: stats.clone(),
    }
}

/// A v1 memory cgroup made for a test below the test's own, with a limit; the processes in
/// it must be gone when it is dropped, which removes it.
pub struct TestCgroup {
    /// Its directory, e.g. /sys/fs/cgroup/memory/process_api/ID/coorfs-test-PID-NAME.
    pub dir: PathBuf,
    /// Its path in the hierarchy, as /proc/self/cgroup and coorfs name it.
    pub path: String,
}

impl TestCgroup {
    /// Makes one limited to `limit` bytes, named after `name`, or says why it cannot.
    pub fn new(name: &str, limit: u64) -> Result<TestCgroup, String> {
        use coorfs::budget::{Version, cgroup_dir, parse_proc_cgroup};
        let text = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let own = parse_proc_cgroup(&text("/proc/self/cgroup"))
            .ok_or("no memory cgroup in /proc/self/cgroup")?;
        if own.version != Version::V1 {
            return Err("memory is accounted by cgroup v2, not v1".into());
        }
        let parent = cgroup_dir(&own, &text("/proc/self/mountinfo"))
            .map(|d| d.dir)
            .ok_or("no cgroup v1 memory controller mounted")?;
        if !parent.join("memory.limit_in_bytes").exists() {
            return Err(format!("{} has no memory.limit_in_bytes", parent.display()));
        }
        let name = format!("coorfs-test-{}-{name}", std::process::id());
        let dir = parent.join(&name);
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let cg = TestCgroup {
            dir,
            path: own.path.join(&name).display().to_string(),
        };
        std::fs::write(cg.dir.join("memory.limit_in_bytes"), limit.to_string())
            .map_err(|e| format!("limiting {}: {e}", cg.dir.display()))?;
        Ok(cg)
    }

    /// `program`, to be run inside the cgroup (a shell moves itself in, then becomes it).
    pub fn command(&self, program: &str) -> Command {
        let script = format!(
            "echo $$ > '{}' && exec \"$0\" \"$@\"",
            self.dir.join("cgroup.procs").display()
        );
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).arg(program);
        cmd
    }

    /// Runs `coorfs ARGS` inside the cgroup.
    pub fn coorfs(&self, args: &[&OsStr]) -> Output {
        output_within(self.command(bin()).args(args), COMMAND_LIMIT)
    }

    /// Processes the kernel's OOM killer killed in it.
    pub fn oom_kills(&self) -> u64 {
        let text = std::fs::read_to_string(self.dir.join("memory.oom_control")).unwrap();
        coorfs::budget::parse_oom_kills(&text).unwrap_or(0)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // The daemon exits just after its unmount; rmdir fails while a process is inside.
        let procs = self.dir.join("cgroup.procs");
        wait_for(Duration::from_secs(10), || {
            std::fs::read_to_string(&procs).is_ok_and(|p| p.trim().is_empty())
        });
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("removing {}: {e}", self.dir.display());
        }
    }
}

/// The mount(8) helper of coorfs.
pub const HELPER: &str = "/sbin/mount.fuse.coorfs";

/// The helper, linked to the binary under test for as long as this lives (a helper that
/// was there before, an installed coorfs, is left alone).
pub struct MountHelper {
    ours: bool,
}

impl MountHelper {
    pub fn install() -> MountHelper {
        let ours = std::fs::symlink_metadata(HELPER).is_err();
        if ours {
            std::os::unix::fs::symlink(bin(), HELPER).unwrap();
        }
        MountHelper { ours }
    }
}

impl Drop for MountHelper {
    fn drop(&mut self) {
        if self.ours {
            let _ = std::fs::remove_file(HELPER);
        }
    }
}

/// The Python that has `webdataset` and `tfrecord`: `COORFS_TEST_PYTHON`, else the venv
/// scripts/test.sh makes in target/moto (with moto's server).
pub fn shard_python() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("COORFS_TEST_PYTHON") {
        return p.into();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/moto/bin/python")
}

/// Runs `tests/shard_readers.py` with `args`; returns what it printed, as JSON for `read`.
pub fn shard_readers(args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shard_readers.py");
    let out = std::process::Command::new(shard_python())
        .arg(script)
        .args(args)
        .output()
        .expect("the shard readers' Python (scripts/test.sh installs it in target/moto)");
    assert!(
        out.status.success(),
        "shard_readers.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or(serde_json::Value::Null)
}

/// The fuse module's `enable_uring`, put back as it was when dropped: a mount that wants
/// FUSE over io_uring turns it on (see `fuse/session.rs`), and a test leaves the machine as
/// it found it.
/// It also holds the switch's lock: one test at a time (of every area: they share a process)
/// may change it.
pub struct EnableUring {
    was: Option<String>,
    _alone: std::sync::MutexGuard<'static, ()>,
}

pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

static URING_SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl EnableUring {
    pub fn keep() -> EnableUring {
        EnableUring {
            _alone: URING_SWITCH.lock().unwrap_or_else(|e| e.into_inner()),
            was: std::fs::read_to_string(ENABLE_URING).ok(),
        }
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        if let Some(v) = &self.was {
            let _ = std::fs::write(ENABLE_URING, v.trim());
        }
    }
}

/// The FUSE connection's directory under fusectl (`/sys/fs/fuse/connections/DEV`), mounting
/// fusectl if it is not: its `waiting` counts the requests the daemon has not answered, and
/// writing to its `abort` ends every one of them.
pub fn fuse_connection(mnt: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let root = Path::new("/sys/fs/fuse/connections");
    let dev = std::fs::metadata(mnt).unwrap().dev();
    let dir = root.join(dev.to_string());
    if !dir.exists() {
        let _ = Command::new("mount")
            .args(["-t", "fusectl", "none"])
            .arg(root)
            .status();
    }
    assert!(dir.exists(), "no {}", dir.display());
    dir
}

/// Requests of the connection at `conn` that wait for an answer.
pub fn waiting(conn: &Path) -> u64 {
    std::fs::read_to_string(conn.join("waiting"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A reader process: reads `rounds` times every file listed on its command line, each whole,
/// and compares it with the source. The first error ends it with the errno's name, so that a
/// failed read (EIO, ENOTCONN, EINTR...) is the test's failure, not a hang.
pub const READER: &str = r#"
import errno, os, sys
src, mnt, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
rels = sys.argv[4:]
n = 0
for r in range(rounds):
    for rel in rels:
        try:
            with open(os.path.join(mnt, rel), "rb") as f:
                got = f.read()
        except OSError as e:
            print(f"ERROR {errno.errorcode.get(e.errno, e.errno)} {rel} round {r}", flush=True)
            sys.exit(1)
        with open(os.path.join(src, rel), "rb") as f:
            want = f.read()
        if got != want:
            print(f"WRONG BYTES {rel} round {r}: {len(got)} of {len(want)}", flush=True)
            sys.exit(1)
        n += 1
print(f"OK {n}", flush=True)
"#;

/// Starts `procs` reader processes over `rels`, each its share, `rounds` times.
pub fn readers(
    src: &Path,
    mnt: &Path,
    rels: &[PathBuf],
    procs: usize,
    rounds: usize,
) -> Vec<Child> {
    (0..procs)
        .map(|p| {
            let mine = rels.iter().skip(p).step_by(procs);
            Command::new("python3")
                .arg("-c")
                .arg(READER)
                .arg(src)
                .arg(mnt)
                .arg(rounds.to_string())
                .args(mine)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// Waits for each reader and checks it read every file of its share without an error.
pub fn assert_read_everything(children: Vec<Child>, what: &str) {
    for child in children {
        let out = wait_within(child, Duration::from_secs(120), "reader");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.starts_with("OK "),
            "{what}: a reader failed: {said} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
