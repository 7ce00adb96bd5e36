//! The life of a mount: checks before mounting, the background daemon, signals, unmount.
//!
//! `coorfs mount` checks everything it can before touching the kernel (`preflight.rs`), so
//! that bad input is one clear line and a non-zero exit. It then forks: the child mounts and serves; the parent
//! waits on a pipe until the child reports that the mount is up (or why it is not), checks
//! that the mount answers, and exits. `--foreground` skips the fork. As root (unless
//! `--no-keeper`) the process that stays is a keeper (`keeper.rs`), which mounts and starts
//! the daemon as this binary again; that daemon comes back here and serves the keeper's
//! connection.
//!
//! SIGINT, SIGTERM and SIGHUP are blocked in every thread and taken by one thread with
//! `sigwait`, which unmounts; the FUSE threads then see the device close and return.
//! `coorfs umount` finds the daemon's pid (and its keeper's) through the mount root's
//! `user.coorfs.pid` (and `user.coorfs.keeper_pid`) attribute, unmounts, and waits for them
//! to exit.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::config::MountConfig;
use crate::fs::DatasetFs;
use crate::fuse::session::FuseSession;
use crate::mountinfo;
use crate::source::LocalSource;
use crate::units::format_size;

mod preflight;

use preflight::preflight_handed;
pub use preflight::{SetupLock, preflight};

/// The statfs magic of FUSE filesystems.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// Why a mount or unmount did not happen. Each is one line for the user.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("source {0}: no such file or directory")]
    SourceMissing(PathBuf),
    #[error("source {0}: not a directory")]
    SourceNotDir(PathBuf),
    #[error("source {0}: {1}")]
    SourceUnreadable(PathBuf, io::Error),
    #[error("source {0}")]
    BadUrl(String),
    #[error("mount point {0}: no such file or directory")]
    MountpointMissing(PathBuf),
    #[error("mount point {0}: not a directory")]
    MountpointNotDir(PathBuf),
    #[error("mount point {0}: {1}")]
    MountpointUnusable(PathBuf, io::Error),
    #[error("mount point {0} is not empty (pass --allow-non-empty to mount over its contents)")]
    MountpointNotEmpty(PathBuf),
    #[error("mount point {mountpoint} is inside the source {dataset}")]
    MountpointInsideSource {
        mountpoint: PathBuf,
        dataset: PathBuf,
    },
    #[error("source {dataset} is inside the mount point {mountpoint}")]
    SourceInsideMountpoint {
        mountpoint: PathBuf,
        dataset: PathBuf,
    },
    #[error("mount point {0} is already a coorfs mount (unmount it with: coorfs umount {0})")]
    AlreadyMounted(PathBuf),
    #[error("mount point {0}: another coorfs mount is being set up there")]
    MountInProgress(PathBuf),
    #[error("source {0} is a coorfs mount; mount its source instead")]
    SourceIsCoorfs(PathBuf),
    #[error("source {dataset} is inside the coorfs mount {mount}; mount its source instead")]
    SourceInsideCoorfs { dataset: PathBuf, mount: PathBuf },
    #[error(
        "mount point {0} is a dead FUSE mount (its daemon exited); clean it up with: umount -l {0}"
    )]
    DeadMount(PathBuf),
    #[error(
        "/dev/fuse does not exist: load the fuse module (modprobe fuse) or pass the device into the container"
    )]
    NoFuseDevice,
    #[error("/dev/fuse: permission denied: run as root or get read-write access to /dev/fuse")]
    FuseDenied,
    #[error("/dev/fuse: {0}")]
    FuseUnusable(io::Error),
    #[error("cache size {size} is more than this machine's memory ({total})")]
    CacheTooLarge { size: String, total: String },
    #[error(
        "--cache-size 0 leaves no room to cache anything (pass --policy none to mount without a cache)"
    )]
    CacheSizeZero,
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    #[error(transparent)]
    Disk(#[from] crate::tier::disk::DiskError),
    #[error(
        "cache directory {0} is inside the source or the mount point; coorfs never writes to the source"
    )]
    DiskInside(PathBuf),
    #[error("--cache-dir needs a cache policy that keeps files (minio or lru), not --policy none")]
    DiskWithoutPolicy,
    #[error("the metrics server cannot listen on {0}: {1}")]
    MetricsListen(std::net::SocketAddr, io::Error),
    #[error(transparent)]
    Memory(#[from] Box<crate::budget::Refusal>),
    /// An environment variable the daemon reads, set to what it cannot use.
    #[error("{0}")]
    BadEnv(String),
    #[error("log file {0}: {1}")]
    LogFile(PathBuf, io::Error),
    #[error("mounting {0}: {1}")]
    Mount(PathBuf, String),
    #[error("{0} is not a coorfs mount")]
    NotMounted(PathBuf),
    #[error(
        "{0} is busy: a process has a file open or its working directory in it (close it, or pass --lazy)"
    )]
    Busy(PathBuf),
    #[error("unmounting {0}: {1}")]
    Unmount(PathBuf, io::Error),
    #[error(
        "{0} has no keeper to hand it over (it was mounted with --no-keeper, or by a user other than root): unmount it and mount it again"
    )]
    NoKeeper(PathBuf),
    #[error("handing {0} over to a new daemon: {1}")]
    Handover(PathBuf, io::Error),
    #[error("the daemon (pid {pid}) of {mountpoint} is still running {waited:?} after unmounting")]
    DaemonLingers {
        mountpoint: PathBuf,
        pid: u32,
        waited: Duration,
    },
}

/// How the daemon runs and logs.
#[derive(Clone, Debug, Default)]
pub struct DaemonOptions {
    /// Stay attached to the terminal, log to stderr.
    pub foreground: bool,
    /// Where a background daemon logs (appended). None: nowhere.
    pub log_file: Option<PathBuf>,
    /// A tracing filter (`info`, `debug`, `coorfs=trace`); None: RUST_LOG, else `info`.
    pub log_level: Option<String>,
}

/// Mounts `config.source` at `config.mountpoint`. In the foreground this returns when the
/// mount ends; otherwise once the background daemon's mount answers.
///
/// As root (unless `--no-keeper`) the process that stays is a keeper (`keeper.rs`), which
/// starts the daemon as this binary again: that daemon comes back here with the keeper's
/// socket in [`keeper::HANDOFF_FD`] and serves the keeper's connection ([`serve_handed`]).
/// Over a live mount of the same source with a keeper, `coorfs mount` from another binary
/// than the daemon's hands the mount to a new daemon running it (an upgrade in place); from
/// the same binary it is refused as any mount over a coorfs mount is.
pub fn mount(mut config: MountConfig, options: DaemonOptions) -> Result<(), MountError> {
    if let Some(socket) = handoff_socket() {
        return serve_handed(config, options, socket);
    }
    if let Some(pid) = upgrade_in_place(&config)? {
        eprintln!(
            "coorfs: {} handed to a new daemon (pid {pid}) running this coorfs",
            config.mountpoint.display()
        );
        return Ok(());
    }
    let lock = preflight(&mut config)?;
    let log_file = match &options.log_file {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| MountError::LogFile(path.clone(), e))?,
        ),
        None => None,
    };
    let keeper = config.keeper && rustix::process::geteuid().is_root();
    let mount_err = |e: io::Error| MountError::Mount(config.mountpoint.clone(), e.to_string());
    // The daemons a keeper starts run where `coorfs mount` ran (relative paths, profiles).
    let cwd = if keeper {
        Some(open_cwd().map_err(mount_err)?)
    } else {
        None
    };
    if options.foreground {
        init_logging(options.log_level.as_deref(), log_file);
        return match cwd {
            Some(cwd) => keep(&config, &mut None, lock, cwd),
            None => serve(config, &mut None, Some(lock), None),
        };
    }

    let (read_end, write_end) = pipe().map_err(mount_err)?;
    // SAFETY: no other thread exists yet (nothing before this point spawns one), so the
    // child may go on running Rust code after fork.
    match unsafe { libc::fork() } {
        -1 => Err(mount_err(io::Error::last_os_error())),
        0 => {
            drop(read_end);
            detach(log_file.as_ref());
            init_logging(options.log_level.as_deref(), log_file);
            let mountpoint = config.mountpoint.clone();
            let mut ready = Some(File::from(write_end));
            // The daemon's (or keeper's) own status, which only the parent waits for: the
            // user sees the parent's, which reports a failure before "ready" as
            // MountError::Mount.
            let served = match cwd {
                Some(cwd) => keep(&config, &mut ready, lock, cwd),
                None => serve(config, &mut ready, Some(lock), None),
            };
            let code = exit_code(served, &mut ready);
            info!("{} unmounted; exiting", mountpoint.display());
            std::process::exit(code);
        }
        child => {
            // The child holds the lock (the same open file) until the kernel has the mount.
            drop(lock);
            drop(write_end);
            let mut report = String::new();
            let _ = File::from(read_end).read_to_string(&mut report);
            let (warnings, said): (Vec<&str>, Vec<&str>) =
                report.lines().partition(|l| l.starts_with(WARNING));
            let report = said.join("\n");
            let report = report.trim();
            if report != "ready" {
                let mut status = 0;
                // SAFETY: waits for our own child; `status` is a valid out-pointer.
                unsafe { libc::waitpid(child, &mut status, 0) };
                let reason = if report.is_empty() {
                    "the daemon exited before the mount was ready".to_string()
                } else {
                    report.to_string()
                };
                return Err(MountError::Mount(config.mountpoint, reason));
            }
            if !answers(&config.mountpoint) {
                return Err(MountError::Mount(
                    config.mountpoint,
                    "the mount does not answer".into(),
                ));
            }
            // Said once the mount is up: a failed mount is its one line of error.
            for w in warnings {
                eprintln!("coorfs: {w}");
            }
            Ok(())
        }
    }
}

/// The exit status of a daemon or keeper that `served` as it did; a failure before "ready"
/// goes to `ready`, for the waiting `coorfs mount` to say.
fn exit_code(served: Result<(), MountError>, ready: &mut Option<File>) -> i32 {
    match served {
        Ok(()) => 0,
        Err(e) => {
            if let Some(mut file) = ready.take() {
                let _ = writeln!(file, "{e}");
            }
            tracing::error!("{e}");
            1
        }
    }
}

/// Runs as the keeper of the mount (see `keeper.rs`); the mount point's `lock` goes once the
/// kernel has the mount.
fn keep(
    config: &MountConfig,
    ready: &mut Option<File>,
    lock: SetupLock,
    cwd: OwnedFd,
) -> Result<(), MountError> {
    crate::keeper::run(config, ready, cwd, move || drop(lock))
        .map_err(|e| MountError::Mount(config.mountpoint.clone(), e.to_string()))
}

/// The working directory, held open.
fn open_cwd() -> io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    Ok(std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(".")?
        .into())
}

/// The keeper's socket, if this process is a daemon a keeper started (the variable is
/// removed, so that nothing this daemon starts inherits it).
fn handoff_socket() -> Option<OwnedFd> {
    let fd: i32 = std::env::var(crate::keeper::HANDOFF_FD)
        .ok()?
        .parse()
        .ok()?;
    // SAFETY: no other thread runs yet (the daemon has not started any).
    unsafe { std::env::remove_var(crate::keeper::HANDOFF_FD) };
    // SAFETY: the keeper passed this descriptor open to this process, which owns it now; a
    // number that is not a socket of a keeper fails the handoff's recvmsg, nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Close-on-exec from here on, as every other descriptor of the daemon.
    let _ = rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC);
    Some(fd)
}

/// Serves the connection of the keeper at the other end of `socket` (see `keeper.rs`).
fn serve_handed(
    mut config: MountConfig,
    options: DaemonOptions,
    socket: OwnedFd,
) -> Result<(), MountError> {
    let log_file = match &options.log_file {
        Some(path) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok(),
        None => None,
    };
    init_logging(options.log_level.as_deref(), log_file);
    let handoff = crate::handover::handoff::Handoff::recv(socket.as_fd())
        .map_err(|e| MountError::Mount(config.mountpoint.clone(), e.to_string()))?;
    crate::keeper::set_oom_score_adj(crate::keeper::DAEMON_OOM_SCORE_ADJ);
    let mut handoff = handoff;
    let mut ready = handoff.ready.take().map(File::from);
    let handed = Handed::open(handoff, socket)
        .map_err(|e| MountError::Mount(config.mountpoint.clone(), e.to_string()));
    let served = handed.and_then(|handed| {
        preflight_handed(&mut config)?;
        serve(config, &mut ready, None, Some(handed))
    });
    let code = exit_code(served, &mut ready);
    std::process::exit(code);
}

/// What a daemon under a keeper serves with: the keeper's connection, the state regions, and
/// the socket on which it tells the keeper that it serves.
struct Handed {
    fuse: OwnedFd,
    meta: Arc<crate::handover::state::Meta>,
    journal: Arc<crate::handover::state::NodeJournal>,
    slots: Arc<crate::handover::state::HandleSlots>,
    arena: OwnedFd,
    cache_index: Arc<crate::handover::state::CacheJournal>,
    tmpfs: Option<OwnedFd>,
    keeper: OwnedFd,
}

impl Handed {
    fn open(h: crate::handover::handoff::Handoff, keeper: OwnedFd) -> io::Result<Handed> {
        use crate::handover::state::{CacheJournal, HandleSlots, Meta, NodeJournal};
        Ok(Handed {
            fuse: h.fuse,
            meta: Arc::new(Meta::open(h.meta)?),
            journal: Arc::new(NodeJournal::open(h.nodes)?),
            slots: Arc::new(HandleSlots::open(h.handles)?),
            arena: h.arena,
            cache_index: Arc::new(CacheJournal::open(h.cache_index)?),
            tmpfs: h.tmpfs,
            keeper,
        })
    }

    /// The cache's memory, for the daemon's cache (see `cache::BlockCache::kept`).
    fn cache_memory(&self) -> io::Result<crate::cache::CacheMemory> {
        Ok(crate::cache::CacheMemory {
            arena: self.arena.try_clone()?,
            journal: self.cache_index.clone(),
            tmpfs: self.tmpfs.as_ref().map(OwnedFd::try_clone).transpose()?,
        })
    }
}

/// True if this process runs another binary than daemon `pid` (a rebuilt or upgraded coorfs:
/// another file, even at the same path). False if it is the same, or cannot be told.
fn newer_than(pid: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &str| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
    match (id(&format!("/proc/{pid}/exe")), id("/proc/self/exe")) {
        (Some(running), Some(mine)) => running != mine,
        _ => false,
    }
}

/// `coorfs mount` with another binary over a live coorfs mount of the same source that has a
/// keeper (an upgrade): asks the
/// keeper to hand the mount to a daemon running this binary, and returns that daemon's pid.
/// None if the mount point is no coorfs mount (mount as usual); an error if it is one of
/// another source, or has no keeper.
fn upgrade_in_place(config: &MountConfig) -> Result<Option<u32>, MountError> {
    let Ok(mountpoint) = std::path::absolute(&config.mountpoint) else {
        return Ok(None);
    };
    if !mountinfo::is_coorfs_mount(&mountpoint) {
        return Ok(None);
    }
    let already = || MountError::AlreadyMounted(mountpoint.clone());
    let doc = crate::stats::view::fetch(&mountpoint).map_err(|_| already())?;
    let served = doc.get("source").and_then(|s| s.as_str()).unwrap_or("");
    let wanted = if crate::source::object::ObjectUrl::is_url(&config.source) {
        config.source.clone()
    } else {
        std::fs::canonicalize(&config.source).unwrap_or_else(|_| config.source.clone())
    };
    let keeper = doc.get("keeper_pid").and_then(|p| p.as_u64()).unwrap_or(0);
    let daemon = doc.get("pid").and_then(|p| p.as_u64()).unwrap_or(0);
    if Path::new(served) != wanted || keeper == 0 || !newer_than(daemon) {
        return Err(already());
    }
    let exe = std::env::current_exe()
        .map_err(|e| MountError::Mount(mountpoint.clone(), e.to_string()))?;
    crate::keeper::request_handover(keeper as u32, Some(&exe))
        .map(Some)
        .map_err(|e| MountError::Handover(mountpoint, e))
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are open descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Leaves the caller's session and terminal: stdin and stdout to /dev/null, stderr to the
/// log file (or /dev/null), working directory `/`.
fn detach(log_file: Option<&File>) {
    // SAFETY: setsid, dup2 and chdir have no memory-safety preconditions; the descriptors
    // passed are open for the duration of the calls.
    unsafe {
        libc::setsid();
        if let Ok(null) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        {
            libc::dup2(null.as_raw_fd(), 0);
            libc::dup2(null.as_raw_fd(), 1);
            let err = log_file.map(|f| f.as_raw_fd()).unwrap_or(null.as_raw_fd());
            libc::dup2(err, 2);
        }
        libc::chdir(c"/".as_ptr());
    }
}

fn init_logging(level: Option<&str>, file: Option<File>) {
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(level) => EnvFilter::new(level),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    // Spans (a FUSE operation, a fetch: debug level) are logged as they close, with their
    // time: nothing at the default level.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE);
    let _ = match file {
        Some(file) => builder
            .with_ansi(false)
            .with_writer(Arc::new(file))
            .try_init(),
        None => builder.with_writer(io::stderr).try_init(),
    };
}

/// True if `path` is the root of a FUSE mount that answers `statfs`.
fn answers(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `statfs` is plain old data; zeroed is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` a valid out-pointer.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    rc == 0 && st.f_type as i64 == FUSE_SUPER_MAGIC
}

/// Tunes glibc's allocator for buffers that come and go by the thousand a second.
///
/// Every allocation of 64 KiB or more that a heap cannot serve from its free memory is its own
/// mapping, returned to the kernel when freed. Block buffers (fetches in flight, the staging
/// area) once came from malloc's per-thread heaps, where freed ones stayed resident: in
/// `scripts/bench-epochs.sh prefetch` on latency-bound storage, where the staging area fills,
/// a daemon with a 1 GiB cache and a 256 MiB staging area reached 1,331 MiB of anonymous
/// memory and was OOM-killed in its cgroup of 1 GiB + 64 MiB + 256 MiB; glibc also raises its
/// mmap threshold to the largest buffer freed, which sends 1 MiB blocks to the heaps. (Blocks
/// of 64 KiB or more are mappings of `block.rs` now, which keeps 12 MiB of them for reuse.)
///
/// And each heap keeps [`HEAP_TOP_PAD`] free at its top rather than giving it back: the HTTP
/// client reads a GET's body into buffers of a few hundred KiB, freed as the body is copied
/// into blocks, and each was a fresh mapping, a page fault and a zeroed page for every 4 KiB
/// received. A cold read of 8 objects of 64 MiB from S3 (moto, 2 readers, 6 runs of each
/// build alternated) faulted 130,000-144,000 pages in the daemon, a page for every 4 KiB of
/// the 512 MiB; with the pad 14,000-45,000, and the daemon took 1.12-1.26 CPU-s a GiB
/// instead of 1.66-1.84 in the runs the machine did not slow down. The price: the heaps of
/// the store's two threads, which take those buffers, keep about 8 MiB each (the daemon's
/// anonymous memory after that read: 32-40 MiB, against 14-18 without).
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only tunes glibc's allocator; called before the daemon starts threads.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 * 1024);
        libc::mallopt(libc::M_TOP_PAD, HEAP_TOP_PAD);
    }
}

/// Bytes each malloc heap keeps free at its top (see [`tune_malloc`]).
const HEAP_TOP_PAD: libc::c_int = 8 << 20;

/// The signals that end a mount.
fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise the set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        // Under a keeper: hand the mount to the next daemon (see `keeper.rs`).
        libc::sigaddset(&mut set, libc::SIGUSR2);
        set
    }
}

/// Mounts and serves until the mount ends. Writes "ready" to `ready` (and closes it) once
/// the kernel has accepted the mount, and releases the mount point's `lock` then.
fn serve(
    config: MountConfig,
    ready: &mut Option<File>,
    lock: Option<SetupLock>,
    handed: Option<Handed>,
) -> Result<(), MountError> {
    tune_malloc();
    let signals = stop_signals();
    // SAFETY: blocks the stop signals in this thread; every thread spawned from here on
    // inherits the mask, so only the sigwait thread below receives them.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &signals, std::ptr::null_mut()) };

    let mount_err = |e: io::Error| MountError::Mount(config.mountpoint.clone(), e.to_string());
    let memory = match &handed {
        Some(h) => Some(h.cache_memory().map_err(mount_err)?),
        None => None,
    };
    let (fs, warnings) = open_core(&config, memory)?;
    // The user's too: `coorfs mount` says each on its stderr once the mount is up.
    for w in &warnings {
        warn!("{w}");
        if let Some(file) = ready.as_mut() {
            let _ = writeln!(file, "{WARNING}{w}");
        }
    }
    // Under a keeper: what an earlier daemon's INIT negotiated (None for the first daemon),
    // and the node ids the kernel holds, before anything reads the node table.
    let successor = handed.as_ref().and_then(|h| h.meta.negotiated());
    if let Some(h) = &handed {
        h.meta.daemon_starts();
        fs.kept_by(h.meta.clone());
        if successor.is_some() {
            let nodes = fs.take_over_nodes(h.journal.clone()).map_err(mount_err)?;
            info!("taking the mount over: {nodes} node ids");
        }
    }
    start_services(&fs, &config)?;
    if let Some(rules) = config.elastic {
        start_watcher(&fs, rules, successor.is_some()).map_err(mount_err)?;
    }
    let mut session = match &handed {
        None => FuseSession::mount(fs.clone(), &config).map_err(mount_err)?,
        Some(h) => {
            let fuse = h.fuse.try_clone().map_err(mount_err)?;
            FuseSession::over(fs.clone(), &config, fuse, successor).map_err(mount_err)?
        }
    };
    // The mount is in the mount table now, which keeps other mounts away from here.
    drop(lock);
    if let Some(h) = &handed {
        match successor {
            None => {
                if let Some(n) = session.negotiated() {
                    h.meta.set_negotiated(n);
                }
                // Nothing has been read and left unanswered yet (INIT was answered, and no
                // thread reads): a resend now changes nothing, and says if the kernel can.
                let resends = session.resend().is_ok();
                h.meta.set_resends(resends);
                if !resends {
                    warn!(
                        "this kernel does not resend requests (FUSE_NOTIFY_RESEND, Linux 6.9): \
                         a daemon that dies leaves the reads it was answering waiting"
                    );
                }
                fs.keep_for_successor(h.journal.clone(), h.slots.clone());
            }
            Some(_) => {
                let taken = fs.take_over_handles(h.slots.clone());
                // Requests the predecessor read and did not answer are queued again; this
                // daemon's threads take them first when the session runs.
                if let Err(e) = session.resend() {
                    warn!(
                        "FUSE_NOTIFY_RESEND: {e}: requests the previous daemon had read stay \
                         unanswered (Linux 6.9 or later resends them)"
                    );
                }
                let pause = h.meta.serving(crate::handover::state::monotonic_ns());
                info!(
                    "took the mount over ({} open handles, {} kept registrations given back) \
                     {:.3} s after the previous daemon ended",
                    taken.handles,
                    taken.registrations_dropped,
                    pause.unwrap_or(0.0)
                );
            }
        }
        let _ = crate::handover::handoff::send(h.keeper.as_fd(), crate::keeper::SERVING, &[]);
    }
    log_mounted(&config);
    start_control(&fs, &config.mountpoint).map_err(mount_err)?;
    let member = fs.clone();
    let scanned = fs.clone();
    fs.start_watching();
    std::thread::Builder::new()
        .name("coorfs-scan".into())
        .spawn(move || {
            scanned.scan();
            scanned.open_in_kernel_if_safe();
        })
        .map_err(mount_err)?;
    let mut unmounter = session.unmounter();
    let under_keeper = handed.is_some();
    let handing = fs.clone();
    std::thread::Builder::new()
        .name("coorfs-signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: `signals` is an initialised set and `sig` a valid out-pointer.
            if unsafe { libc::sigwait(&signals, &mut sig) } != 0 {
                return;
            }
            if sig == libc::SIGUSR2 && under_keeper {
                // The keeper hands the mount to a new daemon: what must outlive this one is
                // saved, and it goes without unmounting. Requests it read and did not answer
                // are sent to the next.
                info!("handing the mount over to the next daemon");
                handing.close_disk();
                // SAFETY: _exit ends the process at once; nothing is left to run.
                unsafe { libc::_exit(0) };
            }
            info!("signal {sig}: unmounting");
            unmounter.unmount();
        })
        .map_err(mount_err)?;
    // Once INIT is done (a stat of the root waits for it), the kernel's readahead window is
    // raised, and only then is the mount ready: no job opens a file under the old window.
    // A successor's mount was ready long ago.
    let ready = ready.take();
    let (mountpoint, readahead) = (config.mountpoint.clone(), config.readahead);
    if successor.is_none() {
        std::thread::Builder::new()
            .name("coorfs-ready".into())
            .spawn(move || {
                raise_readahead(&mountpoint, readahead);
                if let Some(mut file) = ready {
                    let _ = file.write_all(b"ready\n");
                }
            })
            .map_err(mount_err)?;
    }
    let served = session.run().map_err(mount_err);
    member.leave_cluster();
    member.close_disk();
    served
}

/// Serves the mount's control socket (`fs/control.rs`) once the mount answers (its device
/// number names the socket), on a thread of its own. A predecessor that hands the mount over
/// may hold the name for a moment longer: the bind is tried again for a few seconds.
fn start_control(fs: &Arc<DatasetFs>, mountpoint: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let (fs, mountpoint) = (fs.clone(), mountpoint.to_path_buf());
    std::thread::Builder::new()
        .name("coorfs-control".into())
        .spawn(move || {
            let mut last = None;
            for _ in 0..50 {
                if answers(&mountpoint)
                    && let Ok(meta) = std::fs::metadata(&mountpoint)
                {
                    match fs.serve_control(meta.dev()) {
                        Ok(()) => return,
                        Err(e) => last = Some(e),
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            match last {
                Some(e) => warn!("no control socket ({e}): hints come through the order file"),
                None => warn!("no control socket: the mount did not answer"),
            }
        })?;
    Ok(())
}

/// How the daemon's report to `coorfs mount` marks a warning for the user: lines before
/// `ready` (or the reason the mount failed).
const WARNING: &str = "warning: ";

/// The core of the mount of `config`: its source (delayed with `--read-delay`), its disk
/// tier if it has one, and the filesystem over them (in `memory`, a keeper's, if given); and
/// what the user is to be warned of.
fn open_core(
    config: &MountConfig,
    memory: Option<crate::cache::CacheMemory>,
) -> Result<(Arc<DatasetFs>, Vec<String>), MountError> {
    let unreadable = |e| MountError::SourceUnreadable(config.source.clone(), e);
    // With a cache of its own, coorfs keeps read bytes out of the source's page cache.
    let drop_pages = config.cache.policy.caches();
    let stats = Arc::new(crate::stats::Stats::default());
    let mut warnings = Vec::new();
    let source: Arc<dyn crate::source::DatasetSource> = if crate::source::object::ObjectUrl::is_url(
        &config.source,
    ) {
        let url =
            crate::source::object::ObjectUrl::parse(&config.source).map_err(MountError::BadUrl)?;
        let store = crate::source::object::ObjectSource::open(
            url,
            config.metadata_ttl,
            stats.store.clone(),
            config.manifest.as_deref(),
        )
        .map_err(unreadable)?;
        // Mounted all the same (the prefix may be filled later), but most often a typo.
        if store.root_entries() == 0 {
            warnings.push(format!(
                    "source {}: no object has this prefix (keys are case-sensitive): mounted empty; objects put there show once --metadata-ttl ({}) has passed",
                    config.source.display(),
                    crate::units::format_duration(config.metadata_ttl)
                ));
        }
        delayed(store, config.read_delay)
    } else {
        let local = LocalSource::new(config.source.clone(), drop_pages);
        delayed(local.map_err(unreadable)?, config.read_delay)
    };
    let disk = match &config.disk {
        Some(d) => {
            let blocks = crate::block::BlockSize::new(config.cache.block_size);
            Some(crate::tier::disk::DiskTier::open(
                d,
                &config.source,
                blocks,
                stats.clone(),
            )?)
        }
        None => None,
    };
    let fs = DatasetFs::with_tiers(source, config, stats, disk, memory).map_err(unreadable)?;
    Ok((Arc::new(fs), warnings))
}

/// `source`, with `delay` added to every read (`--read-delay`) if it is not zero.
fn delayed<S: crate::source::DatasetSource>(
    source: S,
    delay: std::time::Duration,
) -> Arc<dyn crate::source::DatasetSource> {
    if delay.is_zero() {
        return Arc::new(source);
    }
    let slow = crate::source::FaultySource::new(source);
    *slow.read_delay.lock() = delay;
    Arc::new(slow)
}

/// Starts what serves the mount besides the kernel: the prefetcher, the cluster member's
/// peer server and registration, the metrics server.
fn start_services(fs: &Arc<DatasetFs>, config: &MountConfig) -> Result<(), MountError> {
    (fs.start_prefetcher())
        .map_err(|e| MountError::Mount(config.mountpoint.clone(), e.to_string()))?;
    fs.start_cluster()?;
    if let Some(addr) = config.metrics_addr {
        let fail = |e| MountError::MetricsListen(addr, e);
        let listener = std::net::TcpListener::bind(addr).map_err(fail)?;
        let stats = fs.clone();
        let snapshots = Box::new(move || stats.snapshot());
        crate::stats::metrics::serve(snapshots, listener, fs.runtime()).map_err(fail)?;
        info!("Prometheus metrics at http://{addr}/metrics");
    }
    Ok(())
}

/// Starts the thread that resizes an elastic cache budget as the memory it may use changes;
/// it ends with the mount.
fn start_watcher(
    fs: &Arc<DatasetFs>,
    rules: crate::elastic::Rules,
    taken_over: bool,
) -> io::Result<()> {
    let watcher = crate::elastic::Watcher {
        rules,
        watched: crate::elastic::Watched::probe(),
        state: fs.budget_state(),
        beside: Default::default(),
        windows: parking_lot::Mutex::new(crate::elastic::Highest::over(
            crate::elastic::WINDOWS_SETTLE,
        )),
    };
    // One look now for a cache taken over: one from a daemon the OOM killer took may hold
    // more than the pod can spare, and gives it back before the mount is served.
    if taken_over {
        watcher.look(&**fs, false, &mut None);
    }
    let target: std::sync::Weak<dyn crate::elastic::Elastic> =
        Arc::downgrade(&(fs.clone() as Arc<dyn crate::elastic::Elastic>));
    std::thread::Builder::new()
        .name("coorfs-budget".into())
        .spawn(move || watcher.run(target))?;
    Ok(())
}

/// Logs what was mounted, and with which cache and prefetch.
fn log_mounted(config: &MountConfig) {
    info!(
        "mounted {} at {} ({} FUSE threads, pid {})",
        config.source.display(),
        config.mountpoint.display(),
        config.threads,
        std::process::id()
    );
    let cache = config.cache;
    if !cache.policy.caches() {
        info!("cache: none ({})", config.cache_size_why);
    } else {
        info!(
            "cache: {} ({})",
            format_size(cache.capacity),
            config.cache_size_why
        );
        info!(
            "cache policy: {}, {} blocks",
            cache.policy.name(),
            format_size(cache.block_size.get())
        );
    }
    let prefetch = config.prefetch;
    if prefetch.enabled {
        info!(
            "prefetch: {} staging, {} in flight; jobs by {:?}",
            format_size(prefetch.memory),
            prefetch.depth,
            config.jobs.key
        );
    } else {
        info!("prefetch: off; jobs by {:?}", config.jobs.key);
    }
    if !config.read_delay.is_zero() {
        info!("every source read is delayed by {:?}", config.read_delay);
    }
}

/// Sets the kernel's readahead window for files of the mount at `mountpoint` to `bytes`
/// (`--readahead`; 0 leaves it): INIT can only lower it, the mount's backing device info
/// (`/sys/class/bdi/MAJ:MIN`, named after the mount's device number) raises it, as root. Waits
/// for INIT: a STATFS is always sent to the daemon, and answered after INIT set the window.
/// Says why in the log if it cannot.
fn raise_readahead(mountpoint: &Path, bytes: u64) {
    use std::os::unix::fs::MetadataExt;
    if !answers(mountpoint) {
        return warn!("readahead: {} does not answer", mountpoint.display());
    }
    let dev = match std::fs::metadata(mountpoint) {
        Ok(m) => m.dev(),
        Err(e) => return warn!("readahead: {}: {e}", mountpoint.display()),
    };
    if bytes == 0 || !rustix::process::geteuid().is_root() {
        return;
    }
    let bdi = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    match std::fs::write(&bdi, format!("{}", bytes.div_ceil(1024))) {
        Ok(()) => tracing::debug!("readahead {} KiB ({bdi})", bytes.div_ceil(1024)),
        Err(e) => warn!("readahead: {bdi}: {e}; the kernel's window stays as it is"),
    }
}

/// Hands the coorfs mount at `mountpoint` to a new daemon (see `keeper.rs`), running this
/// binary if the caller is root. Returns the new daemon's pid once it serves.
pub fn restart(mountpoint: &Path) -> Result<u32, MountError> {
    let mountpoint = std::path::absolute(mountpoint)
        .map_err(|e| MountError::MountpointUnusable(mountpoint.to_path_buf(), e))?;
    if !mountinfo::is_coorfs_mount(&mountpoint) {
        return Err(MountError::NotMounted(mountpoint));
    }
    let keeper = keeper_pid(&mountpoint).ok_or_else(|| MountError::NoKeeper(mountpoint.clone()))?;
    let exe = if rustix::process::geteuid().is_root() {
        std::env::current_exe().ok()
    } else {
        None
    };
    crate::keeper::request_handover(keeper, exe.as_deref())
        .map_err(|e| MountError::Handover(mountpoint, e))
}

/// The pid of the keeper of `mountpoint`, from its `user.coorfs.keeper_pid` attribute (None
/// without a keeper).
pub fn keeper_pid(mountpoint: &Path) -> Option<u32> {
    pid_stat(mountpoint, crate::stats::Stat::KeeperPid).filter(|&pid| pid != 0)
}

/// The pid of the daemon serving `mountpoint`, from its `user.coorfs.pid` attribute.
pub fn daemon_pid(mountpoint: &Path) -> Option<u32> {
    pid_stat(mountpoint, crate::stats::Stat::Pid)
}

/// A pid the mount's root says in the attribute of `stat`.
fn pid_stat(mountpoint: &Path, stat: crate::stats::Stat) -> Option<u32> {
    let value = xattr::get(mountpoint, crate::stats::xattr_name(stat)).ok()??;
    String::from_utf8(value).ok()?.trim().parse().ok()
}

/// True while any thread of process `pid` is not a zombie. Its main thread may be one while
/// another still exits (in the middle of an `fsync` of the disk cache, under load): until the
/// last thread is gone the process holds its files, the disk cache directory's lock among
/// them, and a mount that follows `coorfs umount` at once would find it in use.
pub fn alive(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks
        .flatten()
        .any(|task| thread_running(&task.path().join("stat")))
}

/// True if the thread whose `/proc/.../stat` is at `stat` exists and is not a zombie.
fn thread_running(stat: &Path) -> bool {
    match std::fs::read_to_string(stat) {
        // The state follows the parenthesised command name.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z') | Some('X') | None
        ),
        Err(_) => false,
    }
}

/// Unmounts a coorfs mount and waits up to `timeout` for its daemon to exit. `lazy` detaches
/// a busy mount instead of failing: done, whose daemon stays while a file is open in it (one
/// line on stderr says so).
pub fn unmount(mountpoint: &Path, lazy: bool, timeout: Duration) -> Result<(), MountError> {
    let mountpoint = std::path::absolute(mountpoint)
        .map_err(|e| MountError::Unmount(mountpoint.to_path_buf(), e))?;
    if !mountinfo::is_coorfs_mount(&mountpoint) {
        return Err(MountError::NotMounted(mountpoint));
    }
    let pid = daemon_pid(&mountpoint);
    let keeper = keeper_pid(&mountpoint);
    let c = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| MountError::NotMounted(mountpoint.clone()))?;
    // Closing a file returns before the kernel has sent its RELEASE to the daemon, and
    // until that is answered the mount may still count as busy: a job that just finished
    // must not see "busy", so EBUSY is retried for a moment. With --lazy a busy mount is
    // detached instead (MNT_DETACH): it is gone from the mount table, and the daemon serves
    // the files still open in it until the last is closed.
    let busy_until = Instant::now() + Duration::from_secs(1);
    let mut detached = false;
    loop {
        let flags = if detached { libc::MNT_DETACH } else { 0 };
        // SAFETY: `c` is a NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EBUSY) if lazy && !detached => detached = true,
            Some(libc::EBUSY) if Instant::now() < busy_until => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Some(libc::EBUSY) => return Err(MountError::Busy(mountpoint)),
            _ => return Err(MountError::Unmount(mountpoint, e)),
        }
    }
    let Some(pid) = pid else { return Ok(()) };
    // A detached mount's daemon stays while a file is open in it, as --lazy asked: that is
    // no failure (it was one, "still running", once the timeout had passed). It is waited for
    // a moment only, for the RELEASE of a file closed just before.
    let wait = if detached {
        timeout.min(Duration::from_secs(1))
    } else {
        timeout
    };
    // The daemon exits once the connection ends, and its keeper right after.
    let start = Instant::now();
    for p in [Some(pid), keeper].into_iter().flatten() {
        while alive(p) {
            if start.elapsed() >= wait {
                if detached {
                    eprintln!(
                        "coorfs: {} is detached; its daemon (pid {pid}) serves the files still open in it and exits when the last is closed",
                        mountpoint.display()
                    );
                    return Ok(());
                }
                return Err(MountError::DaemonLingers {
                    mountpoint,
                    pid: p,
                    waited: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_alive_until_it_is_a_zombie_or_gone() {
        assert!(alive(std::process::id()));
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(alive(pid));
        child.kill().unwrap();
        // Killed and not yet reaped: a zombie, which holds nothing.
        assert!(
            wait_until(|| !alive(pid)),
            "{pid} still alive after SIGKILL"
        );
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
        child.wait().unwrap();
        assert!(!alive(pid));
    }

    fn wait_until(cond: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }
}
