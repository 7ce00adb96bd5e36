//! The elastic cache budget (`--cache-size auto`, the default): the cache takes the memory
//! the daemon's memory cgroup (or, without a limit, the host) leaves free, and gives it back
//! before anyone is OOM-killed, the way the page cache does, but in MinIO's order.
//!
//! # The rule
//!
//! Every tick the watcher reads what the memory the daemon may use has *free*: the limited
//! memory cgroup that leaves the least (`limit - (usage - reclaimable page cache)`, see
//! [`crate::budget`]), or the host's `MemAvailable`. The daemon's own memory, the cache
//! included, is in `usage`, so
//!
//! ```text
//! spare    = free - (what the staging area held at its fullest - what it holds)
//!                 - (what the parts in flight held at their most - what they hold)
//!                 - (the readahead buffer's room)
//! beside   = limit - spare - used             (the rest of the memory: the job, the daemon)
//! calm     = spare - (the highest `beside` of the last 10 s - `beside`)
//!                  - (the most the kernel's readahead windows took in the last 2 min)
//! capacity = used + calm - reserve                       (whole MiB, at most the ceiling)
//! ```
//!
//! The windows are what the kernel reads ahead of the readers of open files that stream
//! through the page cache: 3 x `--readahead` each, at most the file (`crate::fs`'s
//! `HandleTable::windows_peak`). They are page cache, reclaimable, so `free` counts them; but were
//! they reclaimed before their reader got to them, the kernel would read them again: 2 shards
//! of 1 GiB read by 2 readers with 16 MiB windows in a 384 MiB pod read 1.64x the dataset from
//! the source in epoch 1 while the cache took all but the reserve; with room left for the
//! windows, 1.000-1.005x, and later epochs exactly what the cache lacked. So the cache grows
//! only into what leaves them room, and holds when it does not. They never make it shrink:
//! dropping cached blocks for readahead would trade a sure read in every later epoch for a
//! possible one now. A reader that opens a shard wakes the watcher at once (a shard read at
//! the disk's speed fills a small pod's cache between two ticks), and the most they took
//! since the last look counts, so a shard read between two looks is not missed.
//!
//! It keeps `reserve` bytes free for the job: its next allocations come out of the reserve (and
//! the reclaimable page cache) while the cache shrinks. Then:
//!
//! - **Grow** while `calm > reserve`: the capacity rises, and MinIO admits files until it
//!   holds it. Steps under [`Rules::step`] are ignored, so the budget does not churn. The
//!   cache grows only into what stayed free while the rest of the memory swung ([`Spare`]):
//!   memory a job gave back returns to the cache 10 s ([`SETTLE`]) after the job's peak.
//! - **Hold** while `spare` is between 3/4 of the reserve and the reserve: the capacity
//!   drops to what is held, nothing more is admitted, nothing is dropped.
//! - **Shrink** when `spare < 3/4 reserve`, or the kernel reports memory pressure (v1
//!   `memory.pressure_level` at `medium`, a v2 PSI trigger on `memory.pressure`): the cache
//!   drops its newest blocks until the reserve is free again (under pressure, one reserve
//!   more), and gives their memory back ([`crate::cache::BlockCache::resize`]). A pressure
//!   report while two reserves are spare (the kernel reclaiming page cache a reader streams
//!   through) holds instead: nothing is short.
//!
//! The staging area follows the cache: its budget is an eighth of the cache's, at least
//! 8 MiB and at most what it was given at mount ([`staging_beside`]); shared blocks and
//! spares give way at once when it shrinks, blocks fetched ahead for a job when they are read.
//!
//! The reserve is a sixteenth of the cgroup's limit (32 MiB to 1 GiB), or of the host's memory
//! (256 MiB to 4 GiB): with the reclaimable page cache, what a job may allocate before the
//! watcher has made room. A job that allocated 700 MiB at once in a 1 GiB pod (in 0.46 s: the
//! kernel's reclaim slows it) was not killed. The tick is 20 ms while `spare` is under two
//! reserves or readers stream shards through the page cache, 100 ms otherwise; a pressure
//! event, and the open of a shard read through the page cache, wake the watcher at once. A
//! tick reads three small files of one cgroup and `/proc/meminfo` (about 60 us).
//!
//! Pure rules ([`Rules::next`]) are apart from the thread that reads and applies them
//! ([`Watcher`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::budget::{Chain, Version};
use crate::units::format_size;

const MIB: u64 = 1 << 20;

/// Readahead windows of open files from which readers stream shards: a shard's (the kernel's
/// windows of a file of `fs/plan.rs`'s `STREAMED_MISS_MIN`), not a few small files'. The
/// open of one wakes the watcher, and while they are open it looks at [`TICK_NEAR`].
pub const STREAM_MIN: u64 = 4 << 20;

/// The watcher's tick while memory is short (spare under two reserves), or readers stream
/// shards through the page cache.
pub const TICK_NEAR: Duration = Duration::from_millis(20);
/// Its tick otherwise.
pub const TICK_FAR: Duration = Duration::from_millis(100);
/// Pressure events closer together than this shrink once.
const PRESSURE_GAP: Duration = Duration::from_secs(1);

/// How an elastic budget moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Bytes kept free for the job's next allocations.
    pub reserve: u64,
    /// The most the cache may take (what its arena and tmpfs reserve).
    pub ceiling: u64,
}

/// What the watcher decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    /// More room: the cache may admit up to the new capacity.
    Grow,
    /// Short of the reserve: admit nothing more.
    Hold,
    /// Well short of it, or memory pressure: drop files down to the new capacity.
    Shrink,
}

impl Move {
    pub fn name(self) -> &'static str {
        match self {
            Move::Grow => "grew",
            Move::Hold => "held",
            Move::Shrink => "shrank",
        }
    }
}

impl Rules {
    /// The rules inside a memory cgroup limited to `limit` bytes, for a cache that may grow
    /// to `ceiling`.
    pub fn for_cgroup(limit: u64) -> Self {
        Rules {
            reserve: (limit / 16).clamp(32 * MIB, 1 << 30),
            ceiling: limit,
        }
    }

    /// The rules on a host with `total` bytes of memory and no cgroup limit.
    pub fn for_host(total: u64) -> Self {
        Rules {
            reserve: (total / 16).clamp(256 * MIB, 4 << 30),
            ceiling: total,
        }
    }

    /// Changes smaller than this are not made (growing), so the budget does not churn.
    pub fn step(&self) -> u64 {
        (self.reserve / 8).max(MIB)
    }

    /// The next capacity of a cache of `capacity` bytes that holds `used`, with the memory's
    /// `spare` bytes ([`Spare`]); `pressure` if the kernel reported memory pressure. None: no
    /// change.
    pub fn next(
        &self,
        capacity: u64,
        used: u64,
        spare: Spare,
        pressure: bool,
    ) -> Option<(u64, Move)> {
        let whole_mib = |b: u64| b / MIB * MIB;
        let Spare { now, calm } = spare;
        if pressure || now < self.reserve / 4 * 3 {
            let extra = if pressure { self.reserve } else { 0 };
            let short = (self.reserve + extra).saturating_sub(now);
            let to = whole_mib(used.saturating_sub(short)).min(capacity);
            if short > 0 {
                return (to < capacity || to < used).then_some((to, Move::Shrink));
            }
            // Nothing is short (the report came while the page cache was being reclaimed,
            // as it is under a reader streaming through a pod at its limit): admit nothing
            // more, drop nothing.
            let held = used.min(capacity);
            return (held < capacity).then_some((held, Move::Hold));
        }
        let held = used.min(capacity);
        if now < self.reserve {
            return (held < capacity).then_some((held, Move::Hold));
        }
        // What the calm spare allows, never below what is held: a swing of the rest of the
        // memory stops admission, it does not drop what was admitted.
        let to = whole_mib(
            (used + calm.min(now))
                .saturating_sub(self.reserve)
                .min(self.ceiling),
        )
        .max(held);
        if to > capacity && to - capacity >= self.step() {
            return Some((to, Move::Grow));
        }
        if to < capacity && capacity - to >= self.step() {
            return Some((to, Move::Hold));
        }
        None
    }
}

/// The memory's spare bytes as the budget sees them: free beyond what the staging area and the
/// parts in flight may still take, `now` and `calm`: what it would be had the rest of the
/// memory (all but the cache) been at its highest of the last [`SETTLE`].
///
/// Why both: the rest of the memory swings (an object store's parts and the blocks read ahead
/// come and go, a job's buffers grow and shrink between batches). A cache grown into a trough
/// shrank at the next crest and dropped whole files, which MinIO had meant to keep and
/// which the next epoch read from the source again: 32 shards of 24 MiB from S3 in a 384 MiB
/// pod, 2 readers, 3 epochs, the budget moved 190 times and dropped 818 MB of cached blocks,
/// and epochs 2-3 read 1.6x what the cache lacked. So the cache shrinks on `now` (a job's
/// memory comes first) and grows only into `calm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spare {
    pub now: u64,
    pub calm: u64,
}

impl Spare {
    /// Spare memory that has not swung.
    pub fn steady(bytes: u64) -> Self {
        Spare {
            now: bytes,
            calm: bytes,
        }
    }
}

/// How long the rest of the memory's highest use holds the cache back from growing into what
/// it gave back ([`Spare::calm`]): longer than a training step or an object-store part, short
/// beside an epoch.
pub const SETTLE: Duration = Duration::from_secs(10);

/// How long the kernel's readahead windows the readers of open files took at their most keep
/// the cache from growing into them: longer than the pause between two epochs (a validation
/// pass, a checkpoint), so that the next epoch's readers find the room.
pub const WINDOWS_SETTLE: Duration = Duration::from_secs(120);

/// The highest of a value over the last [`SETTLE`], or another span (a sliding maximum: the
/// values that a later, higher one hides are dropped, so it holds a handful).
#[derive(Debug)]
pub struct Highest {
    seen: std::collections::VecDeque<(Instant, u64)>,
    span: Duration,
}

impl Default for Highest {
    fn default() -> Self {
        Highest::over(SETTLE)
    }
}

impl Highest {
    /// The highest over the last `span`.
    pub fn over(span: Duration) -> Self {
        Highest {
            seen: Default::default(),
            span,
        }
    }

    /// Notes `value` at `at` and returns the highest since `at - span`.
    pub fn note(&mut self, at: Instant, value: u64) -> u64 {
        while self.seen.back().is_some_and(|&(_, v)| v <= value) {
            self.seen.pop_back();
        }
        self.seen.push_back((at, value));
        while self
            .seen
            .front()
            .is_some_and(|&(t, _)| at.saturating_duration_since(t) > self.span)
        {
            self.seen.pop_front();
        }
        self.seen.front().map_or(value, |&(_, v)| v)
    }
}

/// An elastic budget as it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    pub rules: Rules,
    /// Its first size, bytes.
    pub capacity: u64,
    /// Why, for the log.
    pub why: String,
}

/// The elastic budget of a daemon that watches `watched` and whose staging area holds
/// `staging` bytes; None if the memory cannot be read.
pub fn start(watched: &Watched, staging: u64) -> Option<Start> {
    let reading = watched.read()?;
    let rules = match watched {
        Watched::Cgroup(_) => Rules::for_cgroup(reading.limit),
        Watched::Host => Rules::for_host(reading.limit),
    };
    let spare = reading.free.saturating_sub(staging);
    let capacity = rules
        .next(0, 0, Spare::steady(spare), false)
        .map_or(0, |(c, _)| c);
    let why = format!(
        "auto: {} now; grows while {} has more than {} free, shrinks when it has less \
         (limit {}, {} free, {} staging)",
        format_size(capacity),
        reading.of,
        format_size(rules.reserve),
        format_size(reading.limit),
        format_size(reading.free),
        format_size(staging)
    );
    Some(Start {
        rules,
        capacity,
        why,
    })
}

/// The size an elastic budget (`--cache-size auto`) starts at here, with the default staging
/// area: what the daemon's memory cgroup (or the host) has free beyond the staging area and
/// the reserve kept for the job. `coorfs mount` decides in `preflight`, with the mount's own
/// options; `coorfs analyze` predicts with this. 0 when nothing is free.
pub fn default_capacity() -> u64 {
    let view = crate::budget::MemoryView::probe();
    let staging = default_staging(view.cgroup.map(|cg| cg.limit));
    start(&Watched::probe(), staging).map_or(0, |s| s.capacity)
}

/// The staging area's default size: [`staging_for_cgroup`] in a memory cgroup limited to
/// `cgroup_limit` bytes, `--prefetch-memory`'s default (256 MiB) without one.
pub fn default_staging(cgroup_limit: Option<u64>) -> u64 {
    cgroup_limit.map_or(
        crate::prefetch::PrefetchConfig::default().memory,
        staging_for_cgroup,
    )
}

/// The staging area's default size in a memory cgroup limited to `limit` bytes: a sixteenth
/// of it, 8 MiB to 256 MiB (on a host, `--prefetch-memory`'s default, 256 MiB).
pub fn staging_for_cgroup(limit: u64) -> u64 {
    (limit / 16).clamp(8 * MIB, 256 * MIB) / MIB * MIB
}

/// The staging area's budget beside a cache of `cache` bytes, for a staging area set to
/// `configured` at mount: it follows the cache down to an eighth of it (8 MiB at least: on
/// bandwidth-bound storage the prefetcher uses a block or two), and back up to `configured`.
pub fn staging_beside(cache: u64, configured: u64) -> u64 {
    (cache / 8).max(8 * MIB).min(configured)
}

/// What the watcher resizes: the mount's cache, with its staging area beside it.
pub trait Elastic: Send + Sync {
    /// Bytes the cache may hold now.
    fn capacity(&self) -> u64;
    /// Bytes it holds.
    fn used(&self) -> u64;
    /// Bytes the staging area may take back: what it held at its fullest less what it holds
    /// (on bandwidth-bound storage the prefetcher uses a block or two of it), and likewise
    /// the memory of an object store's parts in flight.
    fn staging_unfilled(&self) -> u64;
    /// Page cache the kernel may read ahead of the readers of open files, not read yet, at
    /// its most since the last call (`crate::fs`'s `HandleTable::windows_peak`).
    fn kernel_windows(&self) -> u64;
    /// Sets the cache's capacity (dropping files if it holds more) and the staging area's
    /// ([`staging_beside`]); returns the bytes given back.
    fn resize(&self, capacity: u64) -> u64;
    /// Sets the cache's capacity to `capacity` or what it holds, whichever is more: nothing
    /// is dropped. And the staging area's, as [`Elastic::resize`] does.
    fn hold(&self, capacity: u64) -> u64;
}

/// The budget as the stats show it.
#[derive(Debug, Default)]
pub struct BudgetState {
    /// Times the budget grew, held, shrank.
    pub grows: AtomicU64,
    pub holds: AtomicU64,
    pub shrinks: AtomicU64,
    /// Pressure events the kernel sent.
    pub pressure_events: AtomicU64,
    /// Bytes the memory had free at the last tick (0 before the first).
    pub free: AtomicU64,
    /// Why the budget is what it is: its last change.
    pub why: Mutex<String>,
    /// Wakes the watcher before its tick.
    pub wake: Wake,
}

/// Wakes the watcher at once (an eventfd it polls beside the pressure events): a reader that
/// starts streaming a shard may fill the cache at the disk's speed before the next tick would
/// have made room for its readahead.
#[derive(Debug)]
pub struct Wake(Option<std::os::fd::OwnedFd>);

impl Default for Wake {
    fn default() -> Self {
        let fd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        );
        Wake(fd.ok())
    }
}

impl Wake {
    /// Wakes the watcher (if it waits: a wake while it looks is taken at its next wait).
    pub fn wake(&self) {
        if let Some(fd) = &self.0 {
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }

    /// Waits up to `timeout` for a wake or the pressure events `events`; true if the latter
    /// fired.
    fn wait(&self, events: Option<&mut PressureEvents>, timeout: Duration) -> bool {
        use std::os::fd::AsRawFd;
        let mut fds = Vec::with_capacity(2);
        if let Some(e) = &events {
            fds.push(libc::pollfd {
                fd: e.fd.as_raw_fd(),
                events: e.events,
                revents: 0,
            });
        }
        if let Some(fd) = &self.0 {
            fds.push(libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        if fds.is_empty() {
            std::thread::sleep(timeout);
            return false;
        }
        let ms = timeout.as_millis() as libc::c_int;
        // SAFETY: `fds` holds valid pollfds, as many as passed.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n <= 0 {
            return false;
        }
        if let Some(fd) = &self.0
            && fds.last().is_some_and(|p| p.revents & libc::POLLIN != 0)
        {
            let mut count = [0u8; 8];
            let _ = rustix::io::read(fd, &mut count);
        }
        match events {
            Some(e) => fds[0].revents & e.events != 0 && e.consume(),
            None => false,
        }
    }
}

/// Where the watcher reads how much memory is free.
#[derive(Debug)]
pub enum Watched {
    /// A memory cgroup chain (the tightest limited one counts).
    Cgroup(Chain),
    /// The host's `MemAvailable`.
    Host,
}

impl Watched {
    /// This process's: its cgroup chain if one of them has a limit, else the host.
    pub fn probe() -> Self {
        let read = |p: &Path| std::fs::read_to_string(p).ok();
        match Chain::find(&read) {
            Some(chain) if chain.tightest(&read).is_some() => Watched::Cgroup(chain),
            _ => Watched::Host,
        }
    }

    /// Bytes free now, the limit they are of, and what they are of (for the log); with the
    /// cgroup's directory, where pressure events are.
    pub fn read(&self) -> Option<Reading> {
        let read = |p: &Path| std::fs::read_to_string(p).ok();
        match self {
            Watched::Cgroup(chain) => {
                let (cg, dir) = chain.tightest(&read)?;
                // A limit above what the host has left says nothing: the host's counts then.
                let host = read(Path::new("/proc/meminfo"))
                    .and_then(|t| crate::budget::meminfo_field(&t, "MemAvailable:"));
                Some(Reading {
                    free: cg.free().min(host.unwrap_or(u64::MAX)),
                    limit: cg.limit,
                    of: format!("memory cgroup {}", cg.path),
                    dir: Some((chain.version, dir.to_path_buf())),
                })
            }
            Watched::Host => {
                let text = std::fs::read_to_string("/proc/meminfo").ok()?;
                let field = |name| crate::budget::meminfo_field(&text, name);
                Some(Reading {
                    free: field("MemAvailable:")?,
                    limit: field("MemTotal:")?,
                    of: "the host".into(),
                    dir: None,
                })
            }
        }
    }
}

/// One look at the memory.
#[derive(Clone, Debug)]
pub struct Reading {
    pub free: u64,
    pub limit: u64,
    pub of: String,
    pub dir: Option<(Version, PathBuf)>,
}

/// The thread that watches the memory and resizes the cache.
pub struct Watcher {
    pub rules: Rules,
    pub watched: Watched,
    pub state: Arc<BudgetState>,
    /// The highest the memory beside the cache took lately ([`Spare::calm`]).
    pub beside: Mutex<Highest>,
    /// The most the kernel's readahead windows took lately ([`WINDOWS_SETTLE`]).
    pub windows: Mutex<Highest>,
}

impl Watcher {
    /// Watches until `target` is gone (the mount ended).
    pub fn run(self, target: std::sync::Weak<dyn Elastic>) {
        let mut events =
            self.watched.read().and_then(|r| r.dir).and_then(
                |(v, dir)| match PressureEvents::open(v, &dir) {
                    Ok(e) => Some(e),
                    Err(e) => {
                        tracing::info!(
                            "elastic cache: no memory pressure events ({e}); watching usage only"
                        );
                        None
                    }
                },
            );
        let mut last_pressure: Option<Instant> = None;
        let mut tick = TICK_FAR;
        let mut looked = Instant::now();
        loop {
            let fired = self.state.wake.wait(events.as_mut(), tick);
            // Opens wake it at most once a near tick: any user may open shards in a loop.
            if !fired && let Some(rest) = TICK_NEAR.checked_sub(looked.elapsed()) {
                std::thread::sleep(rest);
            }
            looked = Instant::now();
            let Some(target) = target.upgrade() else {
                return;
            };
            tick = self.look(&*target, fired, &mut last_pressure);
        }
    }

    /// Reads the memory once and resizes the cache as the rules say: what the thread does at
    /// each tick, and what a daemon that takes over a cache does once before it serves (a pod
    /// just out of an OOM kill gets its memory back first). Returns how long to wait for the
    /// next look. `fired`: a memory pressure event came.
    pub fn look(
        &self,
        target: &dyn Elastic,
        fired: bool,
        last_pressure: &mut Option<Instant>,
    ) -> Duration {
        let Some(reading) = self.watched.read() else {
            return TICK_FAR;
        };
        let pressure = fired && last_pressure.is_none_or(|t| t.elapsed() >= PRESSURE_GAP);
        if fired {
            self.state.pressure_events.fetch_add(1, Ordering::Relaxed);
        }
        if pressure {
            *last_pressure = Some(Instant::now());
        }
        self.state.free.store(reading.free, Ordering::Relaxed);
        let now = reading.free.saturating_sub(target.staging_unfilled());
        let (capacity, used) = (target.capacity(), target.used());
        let beside = reading.limit.saturating_sub(now).saturating_sub(used);
        let highest = self.beside.lock().note(Instant::now(), beside);
        let streaming = target.kernel_windows();
        let windows = (self.windows.lock()).note(Instant::now(), streaming);
        let spare = Spare {
            now,
            calm: now.saturating_sub(highest - beside).saturating_sub(windows),
        };
        // A reader streaming through the page cache may fill the cache at the disk's speed
        // before the next look has made room for its windows.
        let tick = if now < 2 * self.rules.reserve || streaming >= STREAM_MIN {
            TICK_NEAR
        } else {
            TICK_FAR
        };
        let Some((to, how)) = self.rules.next(capacity, used, spare, pressure) else {
            return tick;
        };
        let freed = match how {
            Move::Hold => target.hold(to),
            Move::Grow | Move::Shrink => target.resize(to),
        };
        let counter = match how {
            Move::Grow => &self.state.grows,
            Move::Hold => &self.state.holds,
            Move::Shrink => &self.state.shrinks,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let why = format!(
            "{} {} -> {}: {} has {} free of {} ({}{} reserved for the job{}){}",
            how.name(),
            format_size(capacity),
            format_size(to),
            reading.of,
            format_size(reading.free),
            format_size(reading.limit),
            if pressure { "memory pressure; " } else { "" },
            format_size(self.rules.reserve),
            if windows > 0 {
                format!(", {} for readahead", format_size(windows))
            } else {
                String::new()
            },
            if freed > 0 {
                format!("; gave back {}", format_size(freed))
            } else {
                String::new()
            }
        );
        match how {
            Move::Shrink => tracing::info!("cache budget {why}"),
            Move::Grow | Move::Hold => tracing::debug!("cache budget {why}"),
        }
        *self.state.why.lock() = why;
        tick
    }
}

/// The kernel's memory pressure notifications for one cgroup: v1 `memory.pressure_level`
/// through `cgroup.event_control` and an eventfd, v2 a PSI trigger on `memory.pressure`.
struct PressureEvents {
    fd: std::os::fd::OwnedFd,
    /// POLLIN for the eventfd, POLLPRI for a PSI trigger.
    events: libc::c_short,
    version: Version,
    /// Kept open: the v1 registration lasts while it is.
    _level: Option<std::fs::File>,
}

impl PressureEvents {
    fn open(version: Version, dir: &Path) -> std::io::Result<Self> {
        use std::io::Write;
        use std::os::fd::{AsRawFd, FromRawFd};
        match version {
            Version::V1 => {
                let level = std::fs::File::open(dir.join("memory.pressure_level"))?;
                // SAFETY: eventfd has no memory preconditions; the result is checked.
                let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
                if efd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // SAFETY: efd is a new descriptor that nothing else owns.
                let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(efd) };
                let line = format!("{} {} medium", fd.as_raw_fd(), level.as_raw_fd());
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(dir.join("cgroup.event_control"))?
                    .write_all(line.as_bytes())?;
                Ok(PressureEvents {
                    fd,
                    events: libc::POLLIN,
                    version,
                    _level: Some(level),
                })
            }
            Version::V2 => {
                let mut file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(dir.join("memory.pressure"))?;
                // Some task stalled on memory for 50 ms within 500 ms.
                file.write_all(b"some 50000 500000")?;
                Ok(PressureEvents {
                    fd: file.into(),
                    events: libc::POLLPRI,
                    version,
                    _level: None,
                })
            }
        }
    }

    /// Takes the event that fired (poll said so): true.
    fn consume(&mut self) -> bool {
        use std::os::fd::AsRawFd;
        if self.version == Version::V1 {
            let mut count = [0u8; 8];
            // SAFETY: reads 8 bytes into a buffer of 8.
            unsafe { libc::read(self.fd.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_default_cache_starts_at_what_is_free_beyond_the_reserve_and_staging() {
        let available = crate::config::meminfo("MemAvailable:").unwrap();
        let total = crate::config::meminfo("MemTotal:").unwrap();
        let size = default_capacity();
        assert!(size < available, "{size} >= {available}");
        // Without a memory cgroup limit (on this machine, outside the tests that make one),
        // it is what the host has available beyond the staging area and the reserve, in whole
        // MiB (other processes may have taken or freed a little meanwhile).
        if crate::budget::MemoryView::probe().cgroup.is_none() {
            let reserve = Rules::for_host(total).reserve;
            let want = available - reserve - (256 << 20);
            assert!(size.abs_diff(want) < 64 << 20, "{size} vs {want}");
        }
    }

    #[test]
    fn reserves_scale_with_the_memory_and_stay_in_bounds() {
        assert_eq!(Rules::for_cgroup(GIB).reserve, 64 * MIB);
        assert_eq!(Rules::for_cgroup(128 * MIB).reserve, 32 * MIB);
        assert_eq!(Rules::for_cgroup(64 * GIB).reserve, GIB);
        assert_eq!(Rules::for_host(24 * GIB).reserve, 1536 * MIB);
        assert_eq!(Rules::for_host(2 * GIB).reserve, 256 * MIB);
        assert_eq!(staging_for_cgroup(128 * MIB), 8 * MIB);
        assert_eq!(staging_for_cgroup(GIB), 64 * MIB);
        assert_eq!(staging_for_cgroup(64 * GIB), 256 * MIB);
        // Beside the cache: an eighth of it, 8 MiB at least, at most what was set at mount.
        assert_eq!(staging_beside(900 * MIB, 64 * MIB), 64 * MIB);
        assert_eq!(staging_beside(300 * MIB, 64 * MIB), 300 * MIB / 8);
        assert_eq!(staging_beside(0, 64 * MIB), 8 * MIB);
        assert_eq!(staging_beside(0, 4 * MIB), 4 * MIB);
        assert_eq!(staging_beside(0, 0), 0, "prefetch off");
    }

    #[test]
    fn grows_into_what_is_free_beyond_the_reserve() {
        let r = Rules::for_cgroup(GIB); // reserve 64 MiB, step 8 MiB
        // Nothing held, 900 MiB free: the cache may take 836 MiB.
        assert_eq!(
            r.next(0, 0, Spare::steady(900 * MIB), false),
            Some((836 * MIB, Move::Grow))
        );
        // As it fills, free falls by what it takes: the capacity stays.
        assert_eq!(
            r.next(836 * MIB, 500 * MIB, Spare::steady(400 * MIB), false),
            None
        );
        // Small moves are not made.
        assert_eq!(
            r.next(836 * MIB, 500 * MIB, Spare::steady(405 * MIB), false),
            None
        );
        // Never past the ceiling.
        assert_eq!(
            r.next(0, 0, Spare::steady(100 * GIB), false),
            Some((GIB, Move::Grow))
        );
    }

    #[test]
    fn holds_short_of_the_reserve_and_shrinks_well_short_of_it() {
        let r = Rules::for_cgroup(GIB);
        // 55 MiB spare: between 3/4 of the reserve (48) and the reserve: admit nothing more.
        assert_eq!(
            r.next(836 * MIB, 600 * MIB, Spare::steady(55 * MIB), false),
            Some((600 * MIB, Move::Hold))
        );
        assert_eq!(
            r.next(600 * MIB, 600 * MIB, Spare::steady(55 * MIB), false),
            None
        );
        // The job took 300 MiB: 10 MiB spare. Drop files until the reserve is free again.
        assert_eq!(
            r.next(600 * MIB, 600 * MIB, Spare::steady(10 * MIB), false),
            Some((546 * MIB, Move::Shrink))
        );
        // Pressure: one reserve more.
        assert_eq!(
            r.next(600 * MIB, 600 * MIB, Spare::steady(55 * MIB), true),
            Some((527 * MIB, Move::Shrink))
        );
        // Pressure with two reserves spare (the kernel reclaiming page cache): nothing is
        // dropped; the cache admits nothing more.
        assert_eq!(
            r.next(700 * MIB, 600 * MIB, Spare::steady(200 * MIB), true),
            Some((600 * MIB, Move::Hold))
        );
        assert_eq!(
            r.next(600 * MIB, 600 * MIB, Spare::steady(200 * MIB), true),
            None
        );
        // Nothing held, nothing to drop: the capacity goes to zero.
        assert_eq!(
            r.next(50 * MIB, 0, Spare::steady(0), false),
            Some((0, Move::Shrink))
        );
        assert_eq!(r.next(0, 0, Spare::steady(0), false), None);
        // The job gave its memory back: grow again.
        assert_eq!(
            r.next(546 * MIB, 546 * MIB, Spare::steady(300 * MIB), false),
            Some((782 * MIB, Move::Grow))
        );
    }

    #[test]
    fn grows_only_into_what_stayed_free_while_the_rest_of_the_memory_swung() {
        let r = Rules::for_cgroup(GIB); // reserve 64 MiB, step 8 MiB
        let spare = |now, calm| Spare {
            now: now * MIB,
            calm: calm * MIB,
        };
        // 300 MiB free now, but 100 MiB of it was taken moments ago: grow into 200.
        assert_eq!(
            r.next(400 * MIB, 400 * MIB, spare(300, 200), false),
            Some((536 * MIB, Move::Grow))
        );
        // A crest that leaves less calm than the reserve lowers the capacity to what is held
        // and drops nothing.
        let crest = spare(100, 10);
        assert_eq!(
            r.next(600 * MIB, 500 * MIB, crest, false),
            Some((500 * MIB, Move::Hold))
        );
        assert_eq!(r.next(500 * MIB, 500 * MIB, crest, false), None);
        // Only `now` short of the reserve shrinks.
        assert_eq!(
            r.next(500 * MIB, 500 * MIB, spare(20, 20), false),
            Some((456 * MIB, Move::Shrink))
        );
    }

    #[test]
    fn the_highest_value_holds_for_the_settling_time() {
        let mut h = Highest::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(h.note(at(0), 50), 50);
        assert_eq!(h.note(at(100), 80), 80);
        assert_eq!(h.note(at(200), 30), 80);
        // 80 holds for SETTLE after it was seen, then the highest since (30, then 40) counts.
        let settle = SETTLE.as_millis() as u64;
        assert_eq!(h.note(at(100 + settle), 40), 80);
        assert_eq!(h.note(at(101 + settle), 35), 40);
        assert_eq!(h.note(at(300 + settle), 10), 40);
        assert_eq!(h.note(at(400 + 2 * settle), 5), 5);
        assert!(
            h.seen.len() <= 2,
            "a lower value behind a higher one is kept, no more"
        );
    }
}
