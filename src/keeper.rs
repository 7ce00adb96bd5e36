//! The keeper: the small process that holds a mount's `/dev/fuse` connection, so that the mount
//! outlives its daemon.
//!
//! A FUSE connection lives as long as some process holds its descriptor. Without a keeper that
//! is the daemon alone: when it dies (a crash, `kill -9`, the OOM killer of its pod) every
//! reader gets ENOTCONN and the mount is dead. Under a keeper the daemon's death costs a pause:
//!
//! 1. `coorfs mount` (as root) forks the keeper. It mounts, holds the connection, creates the
//!    state regions (`handover/state/`) and the memory the cache lives in (the arena's memfd,
//!    the journal of its index, the tmpfs of the files the kernel reads: `cache/mod.rs`), and
//!    starts the daemon: this same binary again
//!    (`execveat` of the executable it holds), with the same arguments and working directory,
//!    told by `COORFS_HANDOFF_FD` to take its connection and state from the keeper over a unix
//!    socket (`handover/handoff.rs`, `SCM_RIGHTS`) instead of mounting.
//! 2. The keeper waits. It does no I/O for readers, and asks the OOM killer
//!    to take the daemon instead: its own `oom_score_adj` is -1000 where it may lower it
//!    (CAP_SYS_RESOURCE), the daemon's 500.
//! 3. When the daemon dies while the connection is up, the keeper logs why (the signal, the
//!    exit status, or the OOM killer, from the cgroup's `oom_kill` count) and starts another at
//!    once. The successor takes the connection over (no INIT, the node ids and handles the
//!    kernel holds, FUSE_NOTIFY_RESEND for the requests its predecessor read) and tells the
//!    keeper it serves. Readers wait meanwhile; none sees an error.
//! 4. When the connection ends (unmounted, or aborted) the daemon exits, and so does the
//!    keeper. SIGTERM, SIGINT or SIGHUP to the keeper unmount (lazily) as they do to a daemon.
//!
//! `coorfs restart MOUNTPOINT`, and `coorfs mount` over a live mount of the same source, hand
//! the mount to a new daemon on purpose (an upgrade: the binary the caller runs becomes the
//! one the keeper starts from then on). They reach the keeper through its control socket, an
//! abstract unix socket named after its pid (`coorfs-keeper-PID`), which answers root and
//! the user who mounted only (`SO_PEERCRED`).
//!
//! A daemon that dies before its first INIT ends the mount (nothing was ever served); one
//! that keeps dying before it serves is started again at most [`GIVE_UP_AFTER`] times in a
//! row, further apart each time, then the keeper gives up and lets the connection go.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use crate::config::MountConfig;
use crate::fuse::session::{connected, kernel_mount, unmount_detached};
use crate::handover::handoff::{self, Handoff};
use crate::handover::state::{CacheJournal, Cause, HandleSlots, Meta, NodeJournal, monotonic_ns};

/// The environment variable that tells a daemon which descriptor is its keeper's socket.
pub const HANDOFF_FD: &str = "COORFS_HANDOFF_FD";

/// Daemons that die before serving, in a row, before the keeper lets the mount go.
pub const GIVE_UP_AFTER: u32 = 5;

/// What the daemon tells the keeper once it serves.
pub const SERVING: &str = "serving";

/// The daemon's `oom_score_adj`: taken before the jobs it serves (0), since its death costs a
/// pause while theirs costs the job.
pub const DAEMON_OOM_SCORE_ADJ: i32 = 500;

/// The name of the control socket of the keeper with pid `pid` (abstract: no file).
pub fn control_name(pid: u32) -> String {
    format!("coorfs-keeper-{pid}")
}

/// How the keeper starts daemons: the binary, its arguments, environment and directory.
struct Launch {
    exe: OwnedFd,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: OwnedFd,
}

/// Runs the keeper of the mount of `config` until the mount ends. `ready` is where the
/// waiting `coorfs mount` hears "ready" (the first daemon takes it; the caller says why not
/// if it is still there when this fails); `cwd` is the directory `coorfs mount` ran in;
/// `mounted` is called once the kernel has the mount.
pub fn run(
    config: &MountConfig,
    ready: &mut Option<std::fs::File>,
    cwd: OwnedFd,
    mounted: impl FnOnce(),
) -> io::Result<()> {
    // Lowering it takes CAP_SYS_RESOURCE, which a container may not grant; the daemon's is
    // raised then all the same.
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-1000") {
        tracing::debug!("keeper oom_score_adj -1000: {e}");
    }
    let fuse = kernel_mount(config)?;
    mounted();
    let meta = Meta::create()?;
    let journal = NodeJournal::create()?;
    let slots = HandleSlots::create()?;
    // The cache's memory: the arena's memory file (sized by the daemon), the journal of its
    // index, and the tmpfs of the files the kernel reads (none where it cannot be made: the
    // daemon then keeps every block in the arena).
    let arena: OwnedFd = rustix::fs::memfd_create("coorfs-arena", rustix::fs::MemfdFlags::CLOEXEC)?;
    let cache_index = CacheJournal::create()?;
    let tmpfs = crate::cache::kernel_files::tmpfs(
        config
            .cache
            .ceiling
            .unwrap_or(config.cache.capacity)
            .max(config.cache.capacity),
        crate::cache::kernel_files::pages_for(&config.source),
    )
    .inspect_err(|e| tracing::debug!("no tmpfs for the cache's files: {e}"))
    .ok();
    meta.set_keeper(std::process::id());
    let launch = Launch {
        exe: open_exe(Path::new("/proc/self/exe"))?,
        argv: std::env::args_os()
            .map(cstring)
            .collect::<io::Result<_>>()?,
        env: Vec::new(),
        cwd,
    };
    let control = listen(&control_name(std::process::id()))?;
    stop_on_signals(config.mountpoint.clone())?;
    info!(
        "keeper (pid {}) holds the connection of {}",
        std::process::id(),
        config.mountpoint.display()
    );
    let mut keeper = Keeper {
        fuse,
        meta,
        journal,
        slots,
        arena,
        cache_index,
        tmpfs,
        launch,
        control,
        owner: config.owner_uid,
        mountpoint: config.mountpoint.clone(),
        chain: crate::budget::Chain::find(&|p| std::fs::read_to_string(p).ok()),
    };
    let outcome = keeper.keep(ready.take().map(OwnedFd::from));
    if outcome.is_err() {
        unmount_detached(&keeper.mountpoint);
    }
    outcome
}

struct Keeper {
    fuse: OwnedFd,
    meta: Meta,
    journal: NodeJournal,
    slots: HandleSlots,
    arena: OwnedFd,
    cache_index: CacheJournal,
    tmpfs: Option<OwnedFd>,
    launch: Launch,
    control: OwnedFd,
    owner: u32,
    mountpoint: PathBuf,
    chain: Option<crate::budget::Chain>,
}

/// A daemon the keeper started.
struct Daemon {
    pid: rustix::process::Pid,
    pidfd: OwnedFd,
    socket: OwnedFd,
    started: Instant,
    serving: bool,
    oom_kills: u64,
}

impl Keeper {
    fn keep(&mut self, mut ready: Option<OwnedFd>) -> io::Result<()> {
        let mut failures = 0u32;
        // Control clients waiting for the next daemon to serve.
        let mut waiting: Vec<OwnedFd> = Vec::new();
        let mut handing_over = false;
        loop {
            let mut daemon = self.start(ready.take())?;
            let status = loop {
                match self.wait(&mut daemon)? {
                    Event::Serving => {
                        failures = 0;
                        for client in waiting.drain(..) {
                            let _ = handoff::send(
                                client.as_fd(),
                                &format!("ok {}", daemon.pid.as_raw_nonzero()),
                                &[],
                            );
                        }
                    }
                    Event::Control(client, exe) => {
                        if let Some(exe) = exe {
                            self.launch.exe = exe;
                        }
                        info!("handing the mount over to a new daemon (asked by a control client)");
                        handing_over = true;
                        waiting.push(client);
                        // The daemon saves what it must and exits; requests it read and did
                        // not answer go to its successor.
                        let _ = rustix::process::kill_process(
                            daemon.pid,
                            rustix::process::Signal::USR2,
                        );
                    }
                    Event::Exited(status) => break status,
                }
            };
            if !connected(self.fuse.as_fd()) {
                info!("the mount ended; keeper exits");
                for client in waiting.drain(..) {
                    let _ = handoff::send(client.as_fd(), "error: the mount ended", &[]);
                }
                return Ok(());
            }
            let cause = if std::mem::take(&mut handing_over) {
                Cause::Handover
            } else {
                self.cause(&daemon, status)
            };
            self.meta.daemon_ended(cause, monotonic_ns());
            if self.meta.negotiated().is_none() {
                return Err(io::Error::other(format!(
                    "the daemon (pid {}) {cause} before the mount was up",
                    daemon.pid.as_raw_nonzero()
                )));
            }
            if cause != Cause::Handover {
                warn!(
                    "daemon (pid {}) {cause} after {:.1} s; starting another",
                    daemon.pid.as_raw_nonzero(),
                    daemon.started.elapsed().as_secs_f64()
                );
            }
            if !daemon.serving && cause != Cause::Handover {
                failures += 1;
                if failures >= GIVE_UP_AFTER {
                    error!(
                        "{failures} daemons in a row died before serving; the mount of {} ends",
                        self.mountpoint.display()
                    );
                    return Err(io::Error::other("daemons keep dying before serving"));
                }
                std::thread::sleep(Duration::from_millis(100 << failures));
            }
        }
    }

    /// Starts a daemon and hands it the connection and state (and `ready`, for the first).
    fn start(&self, ready: Option<OwnedFd>) -> io::Result<Daemon> {
        let (keeper_end, daemon_end) = handoff::pair()?;
        let pid = spawn(&self.launch, daemon_end.as_fd())?;
        drop(daemon_end);
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
        let handoff = Handoff {
            fuse: self.fuse.try_clone()?,
            meta: self.meta.fd().try_clone_to_owned()?,
            nodes: self.journal.fd().try_clone_to_owned()?,
            handles: self.slots.fd().try_clone_to_owned()?,
            arena: self.arena.try_clone()?,
            cache_index: self.cache_index.fd().try_clone_to_owned()?,
            tmpfs: self.tmpfs.as_ref().map(OwnedFd::try_clone).transpose()?,
            ready,
        };
        if let Err(e) = handoff.send(keeper_end.as_fd()) {
            warn!(
                "handing the connection to daemon {}: {e}",
                pid.as_raw_nonzero()
            );
        }
        Ok(Daemon {
            pid,
            pidfd,
            socket: keeper_end,
            started: Instant::now(),
            serving: false,
            oom_kills: self.oom_kills(),
        })
    }

    /// Waits for the next thing that happens to `daemon` or on the control socket.
    fn wait(&self, daemon: &mut Daemon) -> io::Result<Event> {
        use rustix::event::{PollFd, PollFlags, poll};
        loop {
            let mut fds = [
                PollFd::new(&daemon.pidfd, PollFlags::IN),
                PollFd::new(&daemon.socket, PollFlags::IN),
                PollFd::new(&self.control, PollFlags::IN),
            ];
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let [pidfd, socket, control] = fds.map(|f| f.revents());
            if !pidfd.is_empty() {
                let status = loop {
                    match rustix::process::waitpid(
                        Some(daemon.pid),
                        rustix::process::WaitOptions::empty(),
                    ) {
                        Ok(Some((_, status))) => break status,
                        Ok(None) => continue,
                        Err(rustix::io::Errno::INTR) => continue,
                        Err(e) => return Err(e.into()),
                    }
                };
                return Ok(Event::Exited(status));
            }
            if !socket.is_empty() {
                match handoff::recv(daemon.socket.as_fd()) {
                    Ok((text, _)) if text == SERVING => {
                        daemon.serving = true;
                        return Ok(Event::Serving);
                    }
                    Ok((text, _)) => warn!("daemon said {text:?}"),
                    // The daemon closed its end: it is exiting; its pidfd says when.
                    Err(_) => {
                        let _ = rustix::process::waitid(
                            rustix::process::WaitId::PidFd(daemon.pidfd.as_fd()),
                            rustix::process::WaitIdOptions::EXITED
                                | rustix::process::WaitIdOptions::NOWAIT,
                        );
                    }
                }
            }
            if control.contains(PollFlags::IN)
                && let Some(event) = self.accept()
            {
                return Ok(event);
            }
        }
    }

    /// A control client's request, if it is one from root or the owner.
    fn accept(&self) -> Option<Event> {
        let client =
            rustix::net::accept_with(&self.control, rustix::net::SocketFlags::CLOEXEC).ok()?;
        let peer = rustix::net::sockopt::socket_peercred(&client).ok()?;
        let uid = peer.uid.as_raw();
        // The request is read first, so that the answer reaches a client still listening.
        let (text, mut fds) = handoff::recv(client.as_fd()).ok()?;
        if uid != 0 && uid != self.owner {
            warn!("control request from uid {uid} refused");
            let _ = handoff::send(client.as_fd(), "error: permission denied", &[]);
            return None;
        }
        match text.as_str() {
            "restart" => Some(Event::Control(client, None)),
            // Only root may name the binary the keeper (root) runs next.
            "upgrade" if uid == 0 && fds.len() == 1 => Some(Event::Control(client, fds.pop())),
            _ => {
                let _ = handoff::send(client.as_fd(), "error: bad request", &[]);
                None
            }
        }
    }

    /// Why `daemon` ended with `status`.
    fn cause(&self, daemon: &Daemon, status: rustix::process::WaitStatus) -> Cause {
        if let Some(signal) = status.terminating_signal() {
            if signal == libc::SIGKILL && self.oom_kills() > daemon.oom_kills {
                return Cause::OomKill;
            }
            return Cause::Signal(signal);
        }
        Cause::Exit(status.exit_status().unwrap_or(-1))
    }

    /// The OOM kills counted in the keeper's memory cgroup and those above it (the daemon's).
    fn oom_kills(&self) -> u64 {
        let Some(chain) = &self.chain else {
            return 0;
        };
        let file = match chain.version {
            crate::budget::Version::V1 => "memory.oom_control",
            crate::budget::Version::V2 => "memory.events",
        };
        chain
            .cgroups
            .iter()
            .filter_map(|(dir, _)| std::fs::read_to_string(dir.join(file)).ok())
            .filter_map(|text| crate::budget::parse_oom_kills(&text))
            .sum()
    }
}

enum Event {
    /// The daemon serves.
    Serving,
    /// A control client asks for a handover, with the binary to run from now on.
    Control(OwnedFd, Option<OwnedFd>),
    /// The daemon exited.
    Exited(rustix::process::WaitStatus),
}

/// SIGTERM, SIGINT and SIGHUP unmount (lazily), as they do sent to a daemon: the daemon
/// then sees its connection end and exits, and the keeper after it. They are blocked in every
/// thread and taken by one with `sigwait`; daemons start with none blocked.
fn stop_on_signals(mountpoint: PathBuf) -> io::Result<()> {
    // SAFETY: sigemptyset/sigaddset initialise a set we own; pthread_sigmask blocks them in
    // this thread, which every thread started later inherits.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    std::thread::Builder::new()
        .name("coorfs-keeper-signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: `set` is an initialised set and `sig` a valid out-pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                info!("keeper: signal {sig}: unmounting");
                unmount_detached(&mountpoint);
            }
        })?;
    Ok(())
}

/// Starts a daemon: the binary `launch.exe`, given `socket` (inherited) as its keeper's.
fn spawn(launch: &Launch, socket: BorrowedFd<'_>) -> io::Result<rustix::process::Pid> {
    let fd = socket.as_raw_fd();
    // Everything the child needs is built before the fork: after it, in a process with other
    // threads, only async-signal-safe calls are allowed.
    let mut env: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| k != HANDOFF_FD)
        .map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend(v.into_vec());
            CString::new(kv).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
        })
        .collect::<io::Result<_>>()?;
    env.extend(launch.env.iter().cloned());
    env.push(cstring(format!("{HANDOFF_FD}={fd}").into())?);
    let argv: Vec<*const libc::c_char> = launch
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const libc::c_char> = env
        .iter()
        .map(|e| e.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let (exe, cwd) = (launch.exe.as_raw_fd(), launch.cwd.as_raw_fd());
    // SAFETY: the child calls only async-signal-safe functions (fcntl, fchdir, sigprocmask,
    // execveat, _exit) on descriptors and arrays built above, which stay valid in its copy of
    // the memory; the parent only reads the returned pid.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        // SAFETY: as above: the child's copy of the arrays is valid and it calls only
        // async-signal-safe functions before execveat or _exit.
        0 => unsafe {
            libc::fcntl(fd, libc::F_SETFD, 0);
            libc::fchdir(cwd);
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            libc::syscall(
                libc::SYS_execveat,
                exe,
                c"".as_ptr(),
                argv.as_ptr(),
                envp.as_ptr(),
                libc::AT_EMPTY_PATH,
            );
            libc::_exit(127)
        },
        pid => Ok(rustix::process::Pid::from_raw(pid).expect("fork returns a positive pid")),
    }
}

fn cstring(s: OsString) -> io::Result<CString> {
    CString::new(s.into_vec()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// The executable at `path`, held open so that the daemon it starts is this very binary even
/// after a package upgrade replaced the file.
pub fn open_exe(path: &Path) -> io::Result<OwnedFd> {
    Ok(std::fs::File::open(path)?.into())
}

/// A unix seqpacket socket (close-on-exec) and the abstract address `name`.
fn seqpacket(name: &str) -> io::Result<(OwnedFd, rustix::net::SocketAddrUnix)> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let socket = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    Ok((socket, SocketAddrUnix::new_abstract_name(name.as_bytes())?))
}

/// Listens on the abstract unix socket `name`.
fn listen(name: &str) -> io::Result<OwnedFd> {
    let (socket, addr) = seqpacket(name)?;
    rustix::net::bind(&socket, &addr)?;
    rustix::net::listen(&socket, 8)?;
    Ok(socket)
}

/// Asks the keeper with pid `keeper` to hand its mount to a new daemon, running `exe` from now
/// on if given (root only), and waits until that daemon serves. Returns its pid.
pub fn request_handover(keeper: u32, exe: Option<&Path>) -> io::Result<u32> {
    let (socket, addr) = seqpacket(&control_name(keeper))?;
    rustix::net::connect(&socket, &addr)?;
    match exe {
        Some(exe) => {
            let exe = open_exe(exe)?;
            handoff::send(socket.as_fd(), "upgrade", &[exe.as_fd()])?;
        }
        None => handoff::send(socket.as_fd(), "restart", &[])?,
    }
    let (reply, _) = handoff::recv(socket.as_fd())?;
    match reply.strip_prefix("ok ") {
        Some(pid) => pid
            .parse()
            .map_err(|_| io::Error::other(format!("the keeper said {reply:?}"))),
        None => Err(io::Error::other(
            reply.strip_prefix("error: ").unwrap_or(&reply).to_string(),
        )),
    }
}

/// Sets this process's `oom_score_adj` (says why not in the log).
pub fn set_oom_score_adj(adj: i32) {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", adj.to_string()) {
        warn!("oom_score_adj {adj}: {e}");
    }
}
