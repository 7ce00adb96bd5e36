//! The FUSE session's life: the kernel mount, the `/dev/fuse` connection, INIT, a connection
//! handed over from an earlier daemon, and unmounting.
//!
//! Two ways to a session:
//! - [`FuseSession::mount`]: this daemon mounts and holds the connection alone (no keeper:
//!   `--no-keeper`, or a user other than root, who mounts through fusermount3). The mount dies
//!   with the daemon.
//! - [`FuseSession::over`]: a keeper (`keeper.rs`) mounted and holds the connection, and hands
//!   this daemon a duplicate. The first daemon answers INIT; a successor must not wait for
//!   one (the kernel sends it once per connection), so it resumes from what the first
//!   negotiated ([`Negotiated`], kept in the keeper's meta page), and asks the kernel to send
//!   again every request its predecessor read but did not answer ([`FuseSession::resend`]).
//!   All worker threads read the handed descriptor itself, never a clone: a clone's requests
//!   in flight are failed with ECONNABORTED when the process that cloned it dies, those of the
//!   keeper's descriptor wait for a successor.
//!
//! As root, coorfs mounts by itself (`mount(2)` with type `fuse.coorfs`, which is how
//! `mountinfo.rs` recognises its mounts; fuser's own mount says "fuse").

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use tracing::{info, warn};

use super::FuseAdapter;
use crate::config::{IoUring, MountConfig};
use crate::fs::DatasetFs;
use crate::handover::state::Negotiated;
use crate::mountinfo;

/// A FUSE session of a mount, ready to run.
pub struct FuseSession {
    session: fuser::Session<FuseAdapter>,
    unmounter: Option<Unmounter>,
    notifier: fuser::Notifier,
    passthrough: bool,
}

/// Whether this daemon asks for FUSE over io_uring (`--io-uring`): root only (only root may
/// turn the kernel's `enable_uring` on, and the kernel's ring lives as long as the
/// connection); `auto` only where no keeper holds the connection.
fn io_uring_wanted(config: &MountConfig, under_keeper: bool) -> bool {
    let root = rustix::process::geteuid().is_root();
    root && match config.io_uring {
        IoUring::Off => false,
        IoUring::On => true,
        IoUring::Auto => !under_keeper,
    }
}

/// The fuse module's switch for FUSE over io_uring; the kernel offers it at INIT only while
/// it is on.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Turns the kernel's `enable_uring` on before a mount that wants io_uring (root): INIT, which
/// the kernel sends at mount, offers io_uring only then. A kernel without it (before 6.14, or
/// built without `CONFIG_FUSE_IO_URING`) or a refusal leaves `/dev/fuse`, never the mount.
fn enable_uring() {
    match std::fs::read_to_string(ENABLE_URING) {
        Ok(v) if v.trim() == "Y" => {}
        Ok(_) => match std::fs::write(ENABLE_URING, "Y") {
            Ok(()) => info!(
                "io_uring: turned the fuse module's enable_uring on ({ENABLE_URING};                  --io-uring off leaves it)"
            ),
            Err(e) => warn!("io_uring: cannot turn {ENABLE_URING} on: {e}; using /dev/fuse"),
        },
        Err(e) => info!("io_uring: {ENABLE_URING}: {e}: this kernel has no FUSE over io_uring"),
    }
}

impl FuseSession {
    /// Mounts `fs` at the mount point of `config`, with a connection of its own.
    pub fn mount(fs: Arc<DatasetFs>, config: &MountConfig) -> io::Result<FuseSession> {
        let (adapter, cells) = adapter(fs.clone(), config);
        let mut options = options(config);
        options.clone_fd = true;
        options.io_uring = io_uring_wanted(config, false);
        let (session, unmounter) = if rustix::process::geteuid().is_root() {
            let fd = kernel_mount(config)?;
            let session = fuser::Session::from_fd(adapter, fd, options.acl, options)
                .inspect_err(|_| unmount_detached(&config.mountpoint))?;
            (session, Unmounter::Own(config.mountpoint.clone()))
        } else {
            options.mount_options = vec![
                fuser::MountOption::FSName(fs_name(&config.source)),
                fuser::MountOption::Subtype("coorfs".into()),
                fuser::MountOption::DefaultPermissions,
                fuser::MountOption::NoAtime,
                fuser::MountOption::RO,
            ];
            let mut session = fuser::Session::new(adapter, &config.mountpoint, &options)?;
            let unmounter = session.unmount_callable();
            (session, Unmounter::Fuser(unmounter))
        };
        Ok(FuseSession::ready(
            session,
            unmounter,
            cells,
            &fs,
            &config.mountpoint,
        ))
    }

    /// Serves `fs` over `fuse`, a connection a keeper mounted and holds. `negotiated` is what
    /// an earlier daemon's INIT agreed, if one did: then there is no INIT to answer.
    pub fn over(
        fs: Arc<DatasetFs>,
        config: &MountConfig,
        fuse: OwnedFd,
        negotiated: Option<Negotiated>,
    ) -> io::Result<FuseSession> {
        let (adapter, cells) = adapter(fs.clone(), config);
        let mut options = options(config);
        options.clone_fd = false;
        options.io_uring = io_uring_wanted(config, true);
        let unmounter = Unmounter::Own(config.mountpoint.clone());
        let session = match negotiated {
            None => fuser::Session::from_fd(adapter, fuse, options.acl, options)?,
            Some(n) => {
                // Backing files are registered on the device before any request is served.
                let _ = cells.device.set(fuse.try_clone()?);
                adapter.resume(n.passthrough);
                let abi = fuser::Version(n.abi.0, n.abi.1);
                // A connection whose first daemon took io_uring sends every request to the
                // ring (the kernel never goes back): this daemon registers its own entries.
                let ring = n.io_uring.map(|p| p as usize);
                fuser::Session::from_fd_initialized(adapter, fuse, options.acl, options, abi, ring)
            }
        };
        Ok(FuseSession::ready(
            session,
            unmounter,
            cells,
            &fs,
            &config.mountpoint,
        ))
    }

    fn ready(
        session: fuser::Session<FuseAdapter>,
        unmounter: Unmounter,
        cells: Cells,
        fs: &DatasetFs,
        mountpoint: &Path,
    ) -> FuseSession {
        let notifier = session.notifier();
        let _ = cells.notifier.set(notifier.clone());
        let status = session.io_uring_status();
        if session.io_uring_payload().is_some() {
            drain_queues(status.clone(), mountpoint.to_path_buf());
        }
        fs.set_transport(Box::new(move || status.registered()));
        if cells.device.get().is_none() {
            match std::os::fd::AsFd::as_fd(&session).try_clone_to_owned() {
                Ok(fd) => {
                    let _ = cells.device.set(fd);
                }
                Err(e) => warn!("no descriptor to register backing files on: {e}"),
            }
        }
        FuseSession {
            session,
            unmounter: Some(unmounter),
            notifier,
            passthrough: fs.passthrough_started(),
        }
    }

    /// What INIT negotiated with the kernel, for a successor (None before INIT).
    pub fn negotiated(&self) -> Option<Negotiated> {
        let abi = self.session.kernel_abi()?;
        Some(Negotiated {
            abi: (abi.0, abi.1),
            passthrough: self.passthrough,
            io_uring: self
                .session
                .io_uring_payload()
                .and_then(|p| u32::try_from(p).ok()),
        })
    }

    /// Asks the kernel to send again the requests an earlier daemon read and did not answer
    /// (FUSE_NOTIFY_RESEND, Linux 6.9 and later).
    pub fn resend(&self) -> io::Result<()> {
        self.notifier.resend()
    }

    /// How to end the mount from another thread (once).
    pub fn unmounter(&mut self) -> Unmounter {
        self.unmounter.take().expect("the unmounter is taken once")
    }

    /// Serves requests until the connection ends (unmounted, or aborted).
    pub fn run(self) -> io::Result<()> {
        self.session.run()
    }
}

/// The cells an adapter shares with its session, filled once the session exists.
struct Cells {
    notifier: Arc<OnceLock<fuser::Notifier>>,
    device: Arc<OnceLock<OwnedFd>>,
}

fn adapter(fs: Arc<DatasetFs>, config: &MountConfig) -> (FuseAdapter, Cells) {
    let cells = Cells {
        notifier: Arc::new(OnceLock::new()),
        device: Arc::new(OnceLock::new()),
    };
    let adapter = FuseAdapter::new(fs, cells.notifier.clone(), cells.device.clone(), config.acl);
    (adapter, cells)
}

fn options(config: &MountConfig) -> fuser::Config {
    let mut options = fuser::Config::default();
    options.acl = if config.allow_other {
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    options.n_threads = Some(config.threads.max(1));
    options
}

/// How the signal thread ends the mount.
pub enum Unmounter {
    Own(PathBuf),
    Fuser(fuser::SessionUnmounter),
}

impl Unmounter {
    pub fn unmount(&mut self) {
        match self {
            Unmounter::Own(path) => unmount_detached(path),
            Unmounter::Fuser(u) => {
                if let Err(e) = u.unmount() {
                    warn!("unmount: {e}");
                }
            }
        }
    }
}

/// Once the ring's queues have their entries, one STATFS from each CPU (a request the kernel
/// never answers from its caches) through each CPU's queue. A request made while no daemon
/// had entries (between a daemon's death and its successor's REGISTER) waits in its CPU's
/// queue, and the kernel hands it out only when a reply is committed on that queue, not at
/// REGISTER: measured on Linux 6.18, a `getfattr` made just after a SIGKILL waited 39 minutes,
/// until a read on its CPU let it through. A first daemon has nothing waiting; this costs it
/// one request per CPU.
fn drain_queues(status: fuser::IoUringStatus, mountpoint: PathBuf) {
    let spawned = std::thread::Builder::new()
        .name("coorfs-ring-drain".into())
        .spawn(move || {
            let start = std::time::Instant::now();
            while !status.registered() {
                if start.elapsed() > std::time::Duration::from_secs(10) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            for cpu in online_cpus() {
                let path = mountpoint.clone();
                let pinned = std::thread::Builder::new()
                    .name("coorfs-ring-drain".into())
                    .spawn(move || {
                        // SAFETY: a zeroed cpu_set_t is an empty set, `cpu` < CPU_SETSIZE, and
                        // sched_setaffinity(0, ...) acts on this thread alone.
                        let pinned = unsafe {
                            let mut set: libc::cpu_set_t = std::mem::zeroed();
                            libc::CPU_SET(cpu, &mut set);
                            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) == 0
                        };
                        if pinned {
                            let _ = rustix::fs::statfs(&path);
                        }
                    });
                if let Ok(h) = pinned {
                    let _ = h.join();
                }
            }
        });
    if let Err(e) = spawned {
        warn!("io_uring: no thread to drain the queues: {e}");
    }
}

/// The online CPUs (`/sys/devices/system/cpu/online`, e.g. `0-1,4`).
fn online_cpus() -> Vec<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let max = libc::CPU_SETSIZE as usize - 1;
    text.trim()
        .split(',')
        .flat_map(|range| {
            let mut ends = range.split('-').filter_map(|n| n.parse::<usize>().ok());
            // An unreadable range yields no CPU (an empty range, not a reversed one).
            let (first, last) = match (ends.next(), ends.next()) {
                (Some(a), Some(b)) => (a, b),
                (Some(a), None) => (a, a),
                _ => (1, 0),
            };
            first.min(max)..last.min(max).saturating_add(1)
        })
        .collect()
}

/// Detaches the mount at `path`: it disappears now, and its connection ends when the last
/// open file in it is closed.
pub fn unmount_detached(path: &Path) {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: `c` is a NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        warn!(
            "unmounting {}: {}",
            path.display(),
            io::Error::last_os_error()
        );
    }
}

/// Opens /dev/fuse and mounts it at the mount point with type `fuse.coorfs` (root only).
pub fn kernel_mount(config: &MountConfig) -> io::Result<OwnedFd> {
    use std::os::unix::fs::MetadataExt;
    // The keeper mounts when there is one (`config.keeper` as root), the daemon otherwise.
    if io_uring_wanted(config, config.keeper) {
        enable_uring();
    }
    let dev: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?
        .into();
    let root_mode = std::fs::metadata(&config.mountpoint)?.mode() & libc::S_IFMT;
    let mut data = format!(
        "fd={},rootmode={:o},user_id=0,group_id=0,default_permissions",
        dev.as_raw_fd(),
        root_mode
    );
    if config.allow_other {
        data.push_str(",allow_other");
    }
    let to_c = |b: &[u8]| CString::new(b).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    let source = to_c(fs_name(&config.source).as_bytes())?;
    let target = to_c(config.mountpoint.as_os_str().as_bytes())?;
    let fstype = to_c(mountinfo::FS_TYPE.as_bytes())?;
    let data = to_c(data.as_bytes())?;
    // Read-only down to the superblock: the kernel then keeps a file's attributes across its
    // reads instead of forgetting its access time at each, which cost every `stat` after a
    // read a GETATTR round trip (see fs/order.rs for how hints still get in).
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME | libc::MS_RDONLY;
    // SAFETY: all pointers are NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(dev)
}

/// The name the mount table shows as the mount's source: the source path, unless it holds
/// characters that the mount option syntax cannot carry.
fn fs_name(source: &Path) -> String {
    match source.to_str() {
        Some(s) if !s.contains([',', ' ', '\t', '\n', '\\']) => s.to_string(),
        _ => "coorfs".to_string(),
    }
}

/// True while the FUSE connection of `fd` is up: the kernel marks a connection that was
/// unmounted or aborted with POLLERR (and never blocks this poll).
pub fn connected(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    match rustix::event::poll(&mut fds, Some(&rustix::time::Timespec::default())) {
        Ok(_) => !fds[0].revents().contains(rustix::event::PollFlags::ERR),
        Err(_) => true,
    }
}
