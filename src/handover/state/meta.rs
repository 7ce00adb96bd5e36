//! The meta page: what INIT negotiated, the daemons of the mount so far, why the last one
//! ended and when, the longest pause a takeover caused, the keeper's pid.

use super::*;

/// What INIT negotiated with the kernel, which a successor needs and cannot ask again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// The kernel's FUSE protocol version.
    pub abi: (u32, u32),
    /// The kernel accepted FUSE passthrough.
    pub passthrough: bool,
    /// INIT negotiated FUSE over io_uring: the size of a ring entry's payload, which a
    /// successor's entries must hold (the kernel sends requests to the ring for good).
    pub io_uring: Option<u32>,
}

/// The meta page. Words (8 bytes each, after the 16-byte header):
const M_INIT: usize = 16; // 1: INIT done, 2: passthrough, 4: resend probed, 8: resends
const M_ABI: usize = 24; // major << 32 | minor
const M_DAEMONS: usize = 32; // daemons started, the first included
const M_DIED_AT: usize = 40; // CLOCK_MONOTONIC ns of the last death (0: none yet)
const M_CAUSE: usize = 48; // why the last daemon ended: [`Cause`] encoded
const M_LONGEST: usize = 56; // longest pause, ns
const M_KEEPER: usize = 64; // the keeper's pid
const M_URING: usize = 72; // io_uring entry payload bytes (0: /dev/fuse only; older daemons)

/// Why a daemon ended, as the keeper saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Killed by a signal (the number).
    Signal(i32),
    /// Killed by the OOM killer of its memory cgroup.
    OomKill,
    /// Exited with a non-zero status.
    Exit(i32),
    /// Handed the mount over on request (`coorfs restart`, or `coorfs mount` again).
    Handover,
}

impl Cause {
    fn encode(self) -> u64 {
        match self {
            Cause::Signal(s) => 1 << 32 | s as u32 as u64,
            Cause::OomKill => 2 << 32,
            Cause::Exit(c) => 3 << 32 | c as u32 as u64,
            Cause::Handover => 4 << 32,
        }
    }

    fn decode(w: u64) -> Option<Cause> {
        let n = w as u32 as i32;
        match w >> 32 {
            1 => Some(Cause::Signal(n)),
            2 => Some(Cause::OomKill),
            3 => Some(Cause::Exit(n)),
            4 => Some(Cause::Handover),
            _ => None,
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::Signal(s) => {
                let name = match *s {
                    libc::SIGKILL => "SIGKILL".to_string(),
                    libc::SIGSEGV => "SIGSEGV".to_string(),
                    libc::SIGABRT => "SIGABRT".to_string(),
                    libc::SIGBUS => "SIGBUS".to_string(),
                    libc::SIGTERM => "SIGTERM".to_string(),
                    s => format!("signal {s}"),
                };
                write!(f, "killed by {name}")
            }
            Cause::OomKill => write!(f, "killed by the OOM killer"),
            Cause::Exit(c) => write!(f, "exited with status {c}"),
            Cause::Handover => write!(f, "handed over"),
        }
    }
}

/// The meta page: INIT's outcome and the daemons' history.
#[derive(Debug)]
pub struct Meta {
    region: Region,
}

/// What the meta page says of the daemons so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct Restarts {
    /// Daemons after the first.
    pub count: u64,
    /// Why the last one before this ended.
    pub last_cause: Option<Cause>,
    /// The longest time from a daemon's death to its successor serving, in seconds.
    pub longest_pause: f64,
}

impl Meta {
    pub fn create() -> io::Result<Meta> {
        let region = Region::create("coorfs-meta", META_RESERVE as u64, META_RESERVE)?;
        write_header(&region, META_MAGIC, META_VERSION);
        Ok(Meta { region })
    }

    pub fn open(fd: OwnedFd) -> io::Result<Meta> {
        let region = Region::open(fd, META_RESERVE)?;
        check_header(&region, META_MAGIC, META_VERSION, "meta")?;
        Ok(Meta { region })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.region.fd.as_fd()
    }

    /// What INIT negotiated, once it is done.
    pub fn negotiated(&self) -> Option<Negotiated> {
        let init = self.region.word(M_INIT).load(Ordering::Acquire);
        if init & 1 == 0 {
            return None;
        }
        let abi = self.region.word(M_ABI).load(Ordering::Acquire);
        let uring = self.region.word(M_URING).load(Ordering::Acquire);
        Some(Negotiated {
            abi: ((abi >> 32) as u32, abi as u32),
            passthrough: init & 2 != 0,
            io_uring: u32::try_from(uring).ok().filter(|&n| n != 0),
        })
    }

    pub fn set_negotiated(&self, n: Negotiated) {
        let abi = (u64::from(n.abi.0) << 32) | u64::from(n.abi.1);
        self.region.word(M_ABI).store(abi, Ordering::Release);
        let uring = u64::from(n.io_uring.unwrap_or(0));
        self.region.word(M_URING).store(uring, Ordering::Release);
        let init = 1 | (u64::from(n.passthrough) << 1);
        self.region.word(M_INIT).fetch_or(init, Ordering::AcqRel);
    }

    /// Whether the kernel resends the requests a dead daemon had read (FUSE_NOTIFY_RESEND,
    /// Linux 6.9), as the first daemon found out; None before it did.
    pub fn resends(&self) -> Option<bool> {
        let init = self.region.word(M_INIT).load(Ordering::Acquire);
        (init & 4 != 0).then_some(init & 8 != 0)
    }

    pub fn set_resends(&self, yes: bool) {
        self.region
            .word(M_INIT)
            .fetch_or(4 | (u64::from(yes) << 3), Ordering::AcqRel);
    }

    /// A daemon starts; returns how many have, this one included.
    pub fn daemon_starts(&self) -> u64 {
        self.region.word(M_DAEMONS).fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The keeper saw the daemon end for `cause`, at `now` (CLOCK_MONOTONIC ns).
    pub fn daemon_ended(&self, cause: Cause, now: u64) {
        self.region
            .word(M_CAUSE)
            .store(cause.encode(), Ordering::Release);
        self.region.word(M_DIED_AT).store(now, Ordering::Release);
    }

    /// A successor serves from `now` on: the pause since its predecessor ended counts.
    pub fn serving(&self, now: u64) -> Option<f64> {
        let died = self.region.word(M_DIED_AT).load(Ordering::Acquire);
        if died == 0 {
            return None;
        }
        let pause = now.saturating_sub(died);
        self.region
            .word(M_LONGEST)
            .fetch_max(pause, Ordering::AcqRel);
        Some(pause as f64 / 1e9)
    }

    pub fn restarts(&self) -> Restarts {
        let w = |o| self.region.word(o).load(Ordering::Acquire);
        Restarts {
            count: w(M_DAEMONS).saturating_sub(1),
            last_cause: Cause::decode(w(M_CAUSE)),
            longest_pause: w(M_LONGEST) as f64 / 1e9,
        }
    }

    pub fn set_keeper(&self, pid: u32) {
        self.region
            .word(M_KEEPER)
            .store(pid.into(), Ordering::Release);
    }

    pub fn keeper(&self) -> Option<u32> {
        let pid = self.region.word(M_KEEPER).load(Ordering::Acquire);
        (pid != 0).then_some(pid as u32)
    }
}
