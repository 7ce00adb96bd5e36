//! The pacer: how many prefetch reads the storage takes, learned from how it answers.
//!
//! Pure: the fetcher reports each read's latency and the reads in flight when it was issued
//! (through the prefetcher), and the prefetcher asks how many reads
//! it may have in flight beside the readers'. See [`Pacer`] for why and how.

/// How many prefetch reads may be in flight, learned from how the storage answers.
///
/// Prefetch reads compete with demand reads for the storage. On storage bound by latency
/// (network filesystems: each read waits, and many wait at once for no extra cost) a deep
/// queue and a large staging area are free, and prefetch should use them. On storage bound
/// by bandwidth (a throttled or busy disk) prefetch cannot add bandwidth, and a staging area
/// full of files read ahead made epochs slower (measured on a 200 MiB/s throttle: 6.5 s
/// against 5.7 s without prefetch with 256 MiB staged, 5.9 s with 2 MiB): the reader falls
/// behind while the staging area fills and the storage idles at the end of the epoch.
///
/// The pacer tells the two apart from the reads themselves: reads issued alone give the base
/// latency; reads issued with many others in flight (a quarter of the depth or more) show
/// how latency grows with the queue. Where no read is ever alone (two readers that always
/// have a read in flight each), reads issued beside one other give the base instead: the
/// window stayed at one while probing, which two demand reads fill, and nothing was ever
/// prefetched from a store 150 ms away on a loaded machine. A throttled disk lets short
/// bursts through at full speed, so only a deep queue shows the difference. If a read with
/// `n` in flight takes about `n` times the base the storage serves one read after another
/// (bandwidth-bound):
/// prefetch narrows to one read, only while no demand read is in flight, into a small
/// staging area. If it takes about the base (latency-bound) the window is the depth. The
/// verdict is probed again every [`PROBE_EVERY`] reads, so storage that changes is followed.
/// A verdict turns only when the growth passes the other side by a margin (hysteresis:
/// [`SERIAL_ON`], [`SERIAL_OFF`]); the window's changes are logged at DEBUG.
///
/// Pure: the caller reports each read's latency and the reads in flight when it was issued.
#[derive(Clone, Debug)]
pub struct Pacer {
    max: usize,
    /// Latencies of reads issued alone (`low[0]`) and beside one other (`low[1]`), in
    /// seconds: the base is taken at the lowest of the two depths with enough samples.
    low: [std::collections::VecDeque<f64>; 2],
    /// Latency growth per extra read in flight, relative to the base, of deep-queue reads.
    growth: std::collections::VecDeque<f64>,
    /// Some(true): bandwidth-bound; Some(false): latency-bound; None: not known yet.
    verdict: Option<bool>,
    /// Reads since the verdict, and their latencies summed.
    since: u64,
    waited: f64,
}

/// Samples a verdict rests on.
const SAMPLES: usize = 16;
/// At least this many of each kind before a verdict, and after a verdict changed before it
/// is judged again.
const MIN_SAMPLES: usize = 4;
/// Growth per extra read above which reads are taken to queue one behind the other: 0 for
/// storage that serves all at once, 1 for storage that serves one at a time.
const SERIAL: f64 = 0.5;
/// Once there is a verdict, the growth must pass these to turn it: hysteresis. With one
/// threshold, storage whose growth hovers near it (a disk that is partly busy, noisy samples)
/// flipped the window between 1 and 16 ten times within milliseconds.
const SERIAL_ON: f64 = 0.7;
const SERIAL_OFF: f64 = 0.3;
/// Reads after which a bandwidth-bound verdict is probed again with a deep queue.
pub const PROBE_EVERY: u64 = 4096;
/// Seconds of reads (their latencies summed) after which a bandwidth-bound verdict is probed
/// again, if that comes first. A wrong verdict (a moment of a busy host taken for a serial
/// disk) costs latency-bound storage a window of one read for as long as it stands: 4,096
/// reads were 8 s of 2 ms reads with nothing prefetched, 4,000 files of a 10,000-file epoch
/// read on demand (`scripts/bench-epochs.sh prefetch`, 2 runs of 10). A probe costs
/// bandwidth-bound storage a few reads at depth.
pub const PROBE_SECS: f64 = 1.0;

/// The growth of latency per extra read in flight, relative to a read alone, of a read that
/// took `ratio` times the base, issued with `inflight` reads in flight, the base measured with
/// `depth` in flight: latency = alone x (1 + growth x (reads in flight - 1)), solved from the
/// two. A read slower than that model allows at any growth counts as serial and more.
fn growth(ratio: f64, depth: usize, inflight: usize) -> f64 {
    let room = (inflight - 1) as f64 - ratio * (depth - 1) as f64;
    if room > 0.0 {
        (ratio - 1.0) / room
    } else {
        SERIAL_MAX
    }
}

/// The growth that [`growth`] gives a read too slow for the model: well past serial.
const SERIAL_MAX: f64 = 10.0;

fn median(v: &std::collections::VecDeque<f64>) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().collect();
    s.sort_by(|a, b| a.total_cmp(b));
    s[s.len() / 2]
}

impl Pacer {
    /// A pacer that allows at most `max` reads in flight.
    pub fn new(max: usize) -> Self {
        Pacer {
            max: max.max(1),
            low: Default::default(),
            growth: std::collections::VecDeque::with_capacity(SAMPLES),
            verdict: None,
            since: 0,
            waited: 0.0,
        }
    }

    fn deep(&self) -> usize {
        (self.max / 4).max(2)
    }

    /// Records a read that took `latency` seconds and was issued with `inflight` reads in
    /// flight (itself included).
    pub fn record(&mut self, latency: f64, inflight: usize) {
        if !(latency.is_finite() && latency > 0.0) {
            return;
        }
        self.since += 1;
        self.waited += latency;
        if self.verdict == Some(true) && (self.since >= PROBE_EVERY || self.waited >= PROBE_SECS) {
            // Probe again: open the window until deep-queue samples give a new verdict.
            self.verdict = None;
            self.growth.clear();
        }
        let inflight = inflight.max(1);
        if inflight == 1 || (inflight == 2 && self.deep() > 2) {
            let low = &mut self.low[inflight - 1];
            if low.len() == SAMPLES {
                low.pop_front();
            }
            low.push_back(latency);
        } else if inflight >= self.deep()
            && let Some((base, depth)) = self.base_at()
        {
            let growth = growth(latency / base, depth, inflight);
            if self.growth.len() == SAMPLES {
                self.growth.pop_front();
            }
            self.growth.push_back(growth);
            if self.growth.len() >= MIN_SAMPLES {
                let growth = median(&self.growth);
                let serial = match self.verdict {
                    None => growth > SERIAL,
                    Some(true) => growth > SERIAL_OFF,
                    Some(false) => growth > SERIAL_ON,
                };
                if self.verdict.is_some() && self.verdict != Some(serial) {
                    // The new verdict is judged again on samples taken under it.
                    self.growth.clear();
                }
                if self.verdict != Some(serial) {
                    self.since = 0;
                    self.waited = 0.0;
                }
                self.verdict = Some(serial);
            }
        }
    }

    /// The median latency of reads at the lowest depth with enough samples, in seconds, and
    /// that depth (None before there are enough).
    fn base_at(&self) -> Option<(f64, usize)> {
        (1..=2)
            .map(|depth| (&self.low[depth - 1], depth))
            .find(|(low, _)| low.len() >= MIN_SAMPLES)
            .map(|(low, depth)| (median(low), depth))
    }

    /// The base latency, in seconds: the median of the reads issued alone from the first, or
    /// where none was, of reads beside one other once there are enough (see [`Pacer`]).
    pub fn base(&self) -> Option<f64> {
        match &self.low {
            [alone, _] if !alone.is_empty() => Some(median(alone)),
            _ => self.base_at().map(|(base, _)| base),
        }
    }

    /// True once the storage was judged bandwidth-bound.
    pub fn bandwidth_bound(&self) -> bool {
        self.verdict == Some(true)
    }

    /// The window: reads in flight, demand and prefetch together.
    pub fn window(&self) -> usize {
        match self.verdict {
            // Probing: one read at a time for the base, then a deep queue.
            None if self.base_at().is_none() => 1,
            None | Some(false) => self.max,
            Some(true) => 1,
        }
    }

    /// What the pacer concluded, for the log.
    pub fn describe(&self) -> String {
        let base = self.base().unwrap_or(0.0);
        let growth = if self.growth.is_empty() {
            0.0
        } else {
            median(&self.growth)
        };
        let verdict = match self.verdict {
            None => "probing",
            Some(true) => "reads queue one behind another: bandwidth-bound",
            Some(false) => "reads do not slow each other: latency-bound",
        };
        format!(
            "{verdict}; base {:.2} ms, growth {growth:.2} per read in flight",
            base * 1e3
        )
    }

    /// Prefetch reads that may be in flight now, with `demand` demand reads in flight.
    pub fn allowed(&self, demand: usize) -> usize {
        self.window().saturating_sub(demand)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulates reads against storage whose latency is `latency(reads in flight)`, with a
    /// reader that has a demand read in flight every other time, and returns the windows the
    /// pacer chose after settling (from read 200 on).
    fn settle(latency: impl Fn(usize) -> f64) -> Vec<usize> {
        let mut p = Pacer::new(16);
        let mut windows = Vec::new();
        for i in 0..2000 {
            let demand = i % 2;
            let inflight = (demand + p.allowed(demand)).max(1);
            p.record(latency(inflight), inflight);
            windows.push(p.window());
        }
        windows.split_off(200)
    }

    #[test]
    fn the_window_opens_on_latency_bound_storage() {
        // 2 ms whatever the queue (network storage).
        let w = settle(|_| 0.002);
        assert!(w.iter().all(|&w| w == 16), "{:?}", &w[..10]);
    }

    #[test]
    fn the_window_narrows_on_bandwidth_bound_storage() {
        // A token bucket: a read alone or with one other passes at full speed; deeper
        // queues wait 0.5 ms per read ahead (a 200 MiB/s disk and 100 KiB files).
        let w = settle(|n| if n <= 2 { 0.0005 } else { 0.0005 * n as f64 });
        assert!(w.iter().all(|&w| w == 1), "{:?}", &w[..10]);
    }

    #[test]
    fn a_bandwidth_bound_verdict_is_probed_again() {
        let mut p = Pacer::new(8);
        for i in 0..100 {
            let n = if i % 2 == 0 { 1 } else { 8 };
            p.record(0.0005 * n as f64, n);
        }
        assert!(p.bandwidth_bound());
        // The storage became a network filesystem: after the probe the window opens, a second
        // of reads later (500 of 2 ms), not PROBE_EVERY.
        let mut reads = 0;
        while p.bandwidth_bound() {
            let n = if reads % 2 == 0 { 1 } else { 8 };
            p.record(0.002, n);
            reads += 1;
            assert!(reads < 600, "still bandwidth-bound after {reads} reads");
        }
        for i in 0..100 {
            p.record(0.002, if i % 2 == 0 { 1 } else { 8 });
        }
        assert!(!p.bandwidth_bound());
        assert_eq!(p.window(), 8);
        // On storage that stays bandwidth-bound, each probe turns back within a few reads.
        let mut p = Pacer::new(8);
        let mut narrow = 0;
        for i in 0..20_000 {
            let n = if i % 2 == 0 { 1 } else { 8 };
            p.record(0.0005 * n as f64, n);
            narrow += usize::from(p.window() == 1);
        }
        assert!(narrow > 19_000, "{narrow} of 20,000 reads narrow");
    }

    #[test]
    fn two_readers_always_in_flight_still_open_the_window_on_latency_bound_storage() {
        // Two demand reads are in flight at every read: none is ever issued alone.
        let run = |latency: &dyn Fn(usize) -> f64| {
            let mut p = Pacer::new(16);
            for _ in 0..200 {
                let inflight = 2 + p.allowed(2);
                p.record(latency(inflight), inflight);
            }
            p
        };
        // A store 150 ms away, whatever the queue: the window opens.
        let p = run(&|_| 0.15);
        assert_eq!((p.window(), p.allowed(2)), (16, 14), "{}", p.describe());
        assert!(p.base().is_some_and(|b| (b - 0.15).abs() < 1e-9));
        // A disk that serves one read after another: it narrows.
        let p = run(&|n| 0.0005 * n as f64);
        assert!(p.bandwidth_bound(), "{}", p.describe());
        assert_eq!(p.allowed(2), 0);
        // A read alone is the base from the first (the prefetcher judges a remote store by
        // it), before the window opens and over reads beside one other.
        let mut p = Pacer::new(16);
        for _ in 0..MIN_SAMPLES {
            p.record(0.002, 2);
        }
        p.record(0.05, 1);
        assert_eq!(p.base(), Some(0.05));
    }

    #[test]
    fn growth_is_the_same_from_a_base_alone_or_beside_one_other() {
        for g in [0.0, 0.25, 0.5, 1.0] {
            let at = |n: usize| 0.002 * (1.0 + g * (n - 1) as f64);
            assert!((growth(at(8) / at(1), 1, 8) - g).abs() < 1e-9, "{g}");
            assert!((growth(at(8) / at(2), 2, 8) - g).abs() < 1e-9, "{g}");
        }
        // Slower than one read after another: past serial.
        assert_eq!(growth(10.0, 2, 8), SERIAL_MAX);
    }

    #[test]
    fn demand_reads_count_against_the_window() {
        let mut p = Pacer::new(4);
        assert_eq!(p.window(), 1, "a probe until the storage is known");
        for i in 0..100 {
            p.record(0.001, if i % 2 == 0 { 1 } else { 4 });
        }
        assert_eq!(
            (p.window(), p.allowed(0), p.allowed(3), p.allowed(9)),
            (4, 4, 1, 0)
        );
    }

    #[test]
    fn a_window_near_the_threshold_does_not_flap() {
        // Deep-queue reads whose growth is 0.4 or 0.6 at random: the median hovers around
        // the threshold of 0.5. The window settles once and stays.
        let mut p = Pacer::new(16);
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut changes = 0;
        let mut last = p.window();
        for i in 0..3000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = if i % 2 == 0 { 1 } else { 16 };
            let growth = if x.is_multiple_of(2) { 0.4 } else { 0.6 };
            // Microseconds, so that no time-based probe comes within the test.
            p.record(0.00001 * (1.0 + growth * (n - 1) as f64), n);
            if p.window() != last {
                changes += 1;
                last = p.window();
            }
        }
        // Probing (1), a deep queue once the base is known (16), then one verdict.
        assert!(changes <= 2, "{changes} changes");
    }
}
