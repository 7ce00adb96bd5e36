//! `coorfs run [--mount MOUNTPOINT] [--group NAME] [--] CMD [ARG]...`: runs CMD so that its PyTorch
//! DataLoaders hand each epoch's order to the coorfs mount their files are on (an order hint),
//! with no change to the job.
//!
//! The work is Python's: `python/coorfs/run.py` says how the epoch's order is taken without
//! changing the job's random numbers. This side sets it up and then stays out of the way:
//! - The hook's files are compiled into the binary ([`HOOK_FILES`]) and written at each run to
//!   a private directory (mode 0700 in `$TMPDIR`, removed at exit): `sitecustomize.py` beside
//!   the package under the name `_coorfs_run`, so that nothing needs installing and an
//!   installed `coorfs` package is not shadowed. It goes first on `PYTHONPATH`, and
//!   `COORFS_RUN_DIR` names it; `--mount` travels as `COORFS_MOUNT`, `--group` as
//!   `COORFS_GROUP`.
//! - CMD runs as a child in coorfs run's own process group, so it is the job the caller started
//!   (DataLoader workers and all). Signals sent to coorfs run ([`FORWARDED`]) are passed on to
//!   it; those the kernel sends to the whole foreground process group (Ctrl-C, a hangup) reach
//!   it directly and are not sent twice. coorfs run exits with CMD's status, 128 + N when
//!   signal N ended it, 127 when CMD is not found and 126 when it cannot be executed, as a
//!   shell does.
//! - The hook's processes leave markers in the directory's `status/`: `loaded` (a Python
//!   process started the hook), `torch` (torch.utils.data was hooked), `hinted` (the mount took
//!   a hint, or a sampler hints by itself) and one for each line they said. When the run ends
//!   with no hint given and nothing said, coorfs run says why ([`Verdict`]): a job never goes
//!   without its hint silently.
//! - A directory that cannot be written costs the hint, never the job: one line, and CMD runs
//!   without the hook.

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};

/// What `coorfs run` runs.
#[derive(Clone, Debug, Default)]
pub struct RunConfig {
    /// The coorfs mount point whose datasets are hinted (absolute, as given); `None`: whichever
    /// coorfs mount a DataLoader's files are on.
    pub mount: Option<PathBuf>,
    /// `--group`: the name whose orders every DataLoader draws (a coordinated group).
    pub group: Option<String>,
    /// CMD and its arguments (at least CMD).
    pub command: Vec<OsString>,
}

/// Why `coorfs run` could not run CMD.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}: command not found")]
    NotFound(String),
    #[error("{0}: cannot run: {1}")]
    NotExecutable(String, io::Error),
    #[error("--mount {0}: not a coorfs mount point")]
    NotAMount(PathBuf),
    #[error(
        "--group {0:?}: a group is a name of 1 to {MAX_GROUP} bytes without control characters"
    )]
    BadGroup(String),
    #[error("waiting for {0}: {1}")]
    Wait(String, io::Error),
}

/// The hook, as written to the run's directory: (path there, contents). The package's modules
/// are all here (a test checks), under the private name `_coorfs_run`.
pub const HOOK_FILES: &[(&str, &str)] = &[
    (
        "sitecustomize.py",
        include_str!("../python/run-hook/sitecustomize.py"),
    ),
    (
        "_coorfs_run/__init__.py",
        include_str!("../python/coorfs/__init__.py"),
    ),
    (
        "_coorfs_run/order.py",
        include_str!("../python/coorfs/order.py"),
    ),
    (
        "_coorfs_run/run.py",
        include_str!("../python/coorfs/run.py"),
    ),
    (
        "_coorfs_run/sampler.py",
        include_str!("../python/coorfs/sampler.py"),
    ),
    (
        "_coorfs_run/stats.py",
        include_str!("../python/coorfs/stats.py"),
    ),
];

/// The environment through which the hook learns of its run (python/coorfs/run.py reads them).
pub const RUN_DIR_ENV: &str = "COORFS_RUN_DIR";
pub const MOUNT_ENV: &str = "COORFS_MOUNT";
pub const GROUP_ENV: &str = "COORFS_GROUP";
/// The longest `--group` name, in bytes.
pub const MAX_GROUP: usize = 256;
/// How every line about a missing hint starts, here and in the hook.
pub const NO_HINT: &str = "coorfs run: no order hint: ";

/// Signals sent to coorfs run that go on to CMD: the ones that stop or steer a job (SIGQUIT,
/// SIGUSR1 and SIGUSR2 too, which batch schedulers send before they preempt a job).
pub const FORWARDED: [libc::c_int; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Runs CMD with the hook; returns the exit status coorfs run should exit with.
pub fn run(config: &RunConfig) -> Result<u8, RunError> {
    let mount = match &config.mount {
        Some(m) => Some(check_mount(m)?),
        None => None,
    };
    if let Some(group) = &config.group
        && (group.is_empty() || group.len() > MAX_GROUP || group.chars().any(char::is_control))
    {
        return Err(RunError::BadGroup(group.clone()));
    }
    let name = config.command[0].to_string_lossy().into_owned();
    let hook = match HookDir::create(&std::env::temp_dir()) {
        Ok(dir) => Some(dir),
        Err(e) => {
            eprintln!(
                "{NO_HINT}cannot write the Python hook in {}: {e}",
                std::env::temp_dir().display()
            );
            None
        }
    };
    let mut command = Command::new(&config.command[0]);
    command.args(&config.command[1..]);
    if let Some(hook) = &hook {
        command.env(
            "PYTHONPATH",
            python_path(hook.path(), std::env::var_os("PYTHONPATH")),
        );
        command.env(RUN_DIR_ENV, hook.path());
    }
    if let Some(mount) = &mount {
        command.env(MOUNT_ENV, mount);
    }
    match &config.group {
        Some(group) => command.env(GROUP_ENV, group),
        // A job that coorfs run starts inside another's is not in the outer one's group.
        None => command.env_remove(GROUP_ENV),
    };
    let status = run_forwarding(&mut command, &name)?;
    if let Some(why) = hook.and_then(|h| Verdict::read(h.path()).why_no_hint(&name)) {
        eprintln!("{NO_HINT}{why}");
    }
    Ok(exit_code(status))
}

/// `--mount`: absolute as given (the dataset's paths are compared with it as they are), and the
/// mount point of a coorfs mount once symlinks are resolved.
fn check_mount(mount: &Path) -> Result<PathBuf, RunError> {
    let absolute = std::path::absolute(mount).map_err(|_| RunError::NotAMount(mount.into()))?;
    match std::fs::canonicalize(&absolute) {
        Ok(real) if crate::mountinfo::is_coorfs_mount(&real) => Ok(absolute),
        _ => Err(RunError::NotAMount(mount.into())),
    }
}

/// PYTHONPATH with the hook's directory first.
fn python_path(hook: &Path, existing: Option<OsString>) -> OsString {
    let mut path = hook.as_os_str().to_owned();
    if let Some(existing) = existing.filter(|e| !e.is_empty()) {
        path.push(":");
        path.push(existing);
    }
    path
}

/// A shell's status for how CMD ended.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        // Only the low 8 bits reach a parent.
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.wrapping_add(signal as u8),
        (None, None) => 1,
    }
}

/// The run's private directory: the hook's files and the markers of its processes. Removed,
/// with everything in it, when dropped.
struct HookDir {
    path: PathBuf,
}

impl HookDir {
    fn create(parent: &Path) -> io::Result<HookDir> {
        use rand::Rng;
        let mut builder = std::fs::DirBuilder::new();
        builder.mode(0o700);
        let path = loop {
            let name = format!("coorfs-run.{:016x}", rand::rng().random::<u64>());
            let path = parent.join(name);
            // mkdir fails on a name that exists, so nobody else's directory is ever used.
            match builder.create(&path) {
                Ok(()) => break path,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        };
        let dir = HookDir { path };
        std::fs::create_dir(dir.path.join("_coorfs_run"))?;
        std::fs::create_dir(dir.path.join(STATUS))?;
        for (name, text) in HOOK_FILES {
            std::fs::write(dir.path.join(name), text)?;
        }
        Ok(dir)
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for HookDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The markers' directory inside the run's directory.
const STATUS: &str = "status";

/// What the hook's processes left in `status/`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// A Python process started the hook.
    pub loaded: bool,
    /// torch.utils.data was imported and hooked.
    pub torch: bool,
    /// A hint was given.
    pub hinted: bool,
    /// The hook said why some DataLoader got no hint.
    pub said: bool,
}

impl Verdict {
    fn read(dir: &Path) -> Verdict {
        let mut v = Verdict::default();
        let Ok(entries) = std::fs::read_dir(dir.join(STATUS)) else {
            return v;
        };
        for entry in entries.flatten() {
            match entry.file_name().to_str() {
                Some("loaded") => v.loaded = true,
                Some("torch") => v.torch = true,
                Some("hinted") => v.hinted = true,
                Some(name) if name.starts_with("said-") => v.said = true,
                _ => {}
            }
        }
        v
    }

    /// Why CMD (`name`) ran without a hint, when nobody said so yet; None after a hint.
    pub fn why_no_hint(&self, name: &str) -> Option<String> {
        if self.hinted || self.said {
            None
        } else if self.torch {
            Some(format!("{name} imported torch but iterated no DataLoader"))
        } else if self.loaded {
            Some(format!("{name} ran Python that did not import torch"))
        } else {
            Some(format!(
                "{name} ran no Python that loaded the hook (not Python, or started with -E, -I \
                 or -S, or as another user)"
            ))
        }
    }
}

/// Spawns `command` with [`FORWARDED`] signals passed on to it, and waits for it.
fn run_forwarding(command: &mut Command, name: &str) -> Result<ExitStatus, RunError> {
    use std::os::unix::process::CommandExt;
    let signals = SignalSet::of(&FORWARDED).with(libc::SIGCHLD);
    // Blocked before the child exists, so that no signal meant for it is lost or kills coorfs
    // run first; the child gets the mask coorfs run was started with (std passes on ours).
    let inherited = signals.block();
    // SAFETY: the closure runs in the forked child before exec and only calls
    // pthread_sigmask, which is async-signal-safe, on a set it owns a copy of.
    unsafe {
        command.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_SETMASK, &inherited, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => RunError::NotFound(name.to_string()),
        _ => RunError::NotExecutable(name.to_string(), e),
    })?;
    loop {
        // SIGCHLD ends the wait at once; the timeout only bounds how long a lost one could delay
        // noticing that CMD ended.
        if let Some(signal) = signals.wait(std::time::Duration::from_secs(1)) {
            forward(&child, signal);
        }
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) => {}
            Err(e) => return Err(RunError::Wait(name.to_string(), e)),
        }
    }
}

/// A signal taken from coorfs run's queue: its number and whether a process sent it.
#[derive(Clone, Copy, Debug)]
struct Received {
    signal: libc::c_int,
    /// `kill`, `sigqueue`, `tgkill` (si_code <= 0), not the kernel (a terminal's Ctrl-C or
    /// hangup goes to the whole foreground process group, CMD included).
    from_process: bool,
}

fn forward(child: &Child, received: Received) {
    if received.from_process && FORWARDED.contains(&received.signal) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our child's, which we
        // have not reaped yet, so it names no other process.
        unsafe { libc::kill(child.id() as libc::pid_t, received.signal) };
    }
}

/// A set of signals that coorfs run blocks and takes synchronously (no handlers).
struct SignalSet(libc::sigset_t);

impl SignalSet {
    fn of(signals: &[libc::c_int]) -> SignalSet {
        // SAFETY: sigset_t is plain data; sigemptyset initializes it before any use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t and the signals are valid numbers.
        unsafe {
            libc::sigemptyset(&mut set);
            for s in signals {
                libc::sigaddset(&mut set, *s);
            }
        }
        SignalSet(set)
    }

    fn with(mut self, signal: libc::c_int) -> SignalSet {
        // SAFETY: as in `of`.
        unsafe { libc::sigaddset(&mut self.0, signal) };
        self
    }

    /// Blocks the set in this thread, the only one `coorfs run` has; returns the mask before.
    fn block(&self) -> libc::sigset_t {
        // SAFETY: sigset_t is plain data, which pthread_sigmask fills.
        let mut before: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `self.0` is an initialized set and `before` a valid out-pointer.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &self.0, &mut before) };
        before
    }

    /// The next pending signal of the set, waiting up to `timeout`.
    fn wait(&self, timeout: std::time::Duration) -> Option<Received> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: siginfo_t is plain data that sigtimedwait fills.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: the set, the info and the timeout are valid for the call.
        let signal = unsafe { libc::sigtimedwait(&self.0, &mut info, &ts) };
        (signal > 0).then_some(Received {
            signal,
            from_process: info.si_code <= 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_of_the_package_is_in_the_binary() {
        let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/coorfs");
        let mut on_disk: Vec<String> = std::fs::read_dir(package)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".py"))
            .map(|n| format!("_coorfs_run/{n}"))
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = HOOK_FILES
            .iter()
            .map(|(n, _)| n.to_string())
            .filter(|n| n.starts_with("_coorfs_run/"))
            .collect();
        embedded.sort();
        assert_eq!(embedded, on_disk);
    }

    #[test]
    fn the_hook_comes_first_on_pythonpath() {
        let hook = Path::new("/tmp/h");
        assert_eq!(python_path(hook, None), "/tmp/h");
        assert_eq!(python_path(hook, Some("".into())), "/tmp/h");
        assert_eq!(python_path(hook, Some("/a:/b".into())), "/tmp/h:/a:/b");
    }

    #[test]
    fn exit_codes_are_a_shell_s() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGTERM)), 143);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }

    #[test]
    fn the_verdict_names_the_first_thing_missing() {
        let v = |loaded, torch, hinted, said| Verdict {
            loaded,
            torch,
            hinted,
            said,
        };
        assert_eq!(v(true, true, true, false).why_no_hint("python"), None);
        assert_eq!(v(true, true, false, true).why_no_hint("python"), None);
        let why = |v: Verdict| v.why_no_hint("ls").unwrap();
        assert!(why(v(true, true, false, false)).contains("iterated no DataLoader"));
        assert!(why(v(true, false, false, false)).contains("did not import torch"));
        assert!(why(v(false, false, false, false)).starts_with("ls ran no Python"));
    }

    #[test]
    fn the_directory_is_private_holds_the_hook_and_goes_away() {
        use std::os::unix::fs::PermissionsExt;
        let parent = tempfile::tempdir().unwrap();
        let dir = HookDir::create(parent.path()).unwrap();
        let path = dir.path().to_path_buf();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        for (name, text) in HOOK_FILES {
            assert_eq!(std::fs::read_to_string(path.join(name)).unwrap(), *text);
        }
        assert_eq!(Verdict::read(&path), Verdict::default());
        std::fs::write(path.join("status/hinted"), "").unwrap();
        assert!(Verdict::read(&path).hinted);
        drop(dir);
        assert!(!path.exists());
    }
}
