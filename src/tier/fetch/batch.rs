//! Prefetches of small files, read together.
//!
//! Where the source reads small files together (a directory's, through io_uring:
//! `crate::source::ring`), a prefetch of a whole small file does not take an I/O thread of
//! its own: it waits in a queue, and a few drainers on the I/O pool each take up to
//! [`BATCH`] of them at a time, read them in one batch ([`super::Tier::get_small`]) and end
//! each fetch as [`Fetcher::run`] would (the cache, the report, the waiters). One thread wakes
//! for a batch, not for a file, and the batch's opens and reads each go to the kernel in one
//! call. A reader's own READ that finds the file in the queue joins its fetch as it would any
//! fetch in flight.
//!
//! Drainers: another for each [`BATCH`] files waiting beyond what the drainers about to take
//! a batch will take, at most [`DRAINERS`]: the disk keeps several batches in flight while
//! the prefetcher refills the queue as fetches end. (One more only once the waiting files
//! outnumbered all drainers' batches kept 8 of the prefetcher's 16 reads waiting while 8 were
//! read: half the reads in flight.)
//!
//! Only while the storage answers fast (demand reads under [`super::INLINE_BELOW_US`] on
//! average, as for reads on the FUSE thread): a batch ends with its slowest file, and on
//! network storage, milliseconds a read, waiting is the cost and a thread a file keeps every
//! read in flight (600 files at 2 ms a read: 384-434 read ahead of their reader in batches,
//! 450 and more one by one).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{Fetcher, Pace, Report, Started};
use crate::block::MAP_FROM;
use crate::stats::Counters;
use crate::tier::{DataError, Want, Why};

/// Files a drainer reads together at most.
pub const BATCH: usize = 8;
/// Drainers at once at most.
pub const DRAINERS: usize = 4;

/// The queue of prefetches waiting for a batch.
#[derive(Default)]
pub(super) struct Batches {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<(Started, Report)>,
    drainers: usize,
    /// Drainers about to take a batch (started, or done with their last).
    ready: usize,
}

impl Fetcher {
    /// True if the fetch of `want` may wait for a batch: a prefetch of a whole file that is
    /// one small block, from a source that reads such files together and no tier between.
    pub(super) fn batchable(&self, want: &Want<'_>, ahead: bool, inline: bool) -> bool {
        let size = want.key.version.size;
        want.why == Why::Prefetch
            && !ahead
            && !inline
            && self.part_blocks == 1
            && self.below.len() == 1
            && want.key.block == 0
            && self.blocks.count(size) == 1
            && size < MAP_FROM as u64
            && self.demand_latency_us.load(Ordering::Relaxed) < super::INLINE_BELOW_US
            && self.below[0].reads_together()
    }

    /// Queues fetch `started` for a batch, and starts a drainer if it needs one.
    pub(super) fn queue_for_batch(self: &Arc<Self>, started: Started, report: Report) {
        let mut queue = self.batches.queue.lock();
        queue.waiting.push_back((started, report));
        if queue.drainers < DRAINERS && queue.waiting.len() > queue.ready * BATCH {
            queue.drainers += 1;
            queue.ready += 1;
            drop(queue);
            let this = self.clone();
            self.io.spawn_blocking(move || this.drain());
        }
    }

    /// Reads batches from the queue until it is empty.
    fn drain(&self) {
        loop {
            let (batch, drainers) = {
                let mut queue = self.batches.queue.lock();
                if queue.waiting.is_empty() {
                    queue.drainers -= 1;
                    queue.ready -= 1;
                    return;
                }
                queue.ready -= 1;
                let n = queue.waiting.len().min(BATCH);
                let reading = queue.drainers - queue.ready;
                (queue.waiting.drain(..n).collect(), reading)
            };
            self.run_batch(batch, drainers);
            self.batches.queue.lock().ready += 1;
        }
    }

    /// Reads the files of `batch` together, `drainers` batches in flight with it (itself
    /// included), then ends each fetch as [`Fetcher::run`] does. A fetch whose end panics (a
    /// waiter's bug) gives its waiters EIO as on the pool, and the rest of the batch still end.
    ///
    /// The pacer hears the batch as one read of the storage, in flight beside the other
    /// batches: each file's own time is not known (the batch waits for all of its opens, then
    /// for all of its reads), and the batch's time, taken for each file with the files in the
    /// queue as the crowd, made local disks look serial (the window fell to one, and 130,000
    /// of 200,000 cold files were read on demand). With at most [`DRAINERS`] batches in flight
    /// the pacer rarely has deep-queue samples, so the window stays wide: on a throttled disk
    /// small files are prefetched at full depth.
    fn run_batch(&self, batch: Vec<(Started, Report)>, drainers: usize) {
        let began = Instant::now();
        let source = self.below.last().expect("a tier to read from");
        let wants: Vec<Want<'_>> = batch.iter().map(|(s, _)| s.want()).collect();
        let read =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| source.get_small(&wants)));
        let results = read.unwrap_or_else(|_| {
            Counters::add(&self.stats.counters.source_errors, wants.len() as u64);
            tracing::error!(
                "a batch of {} small files panicked; their readers get EIO",
                wants.len()
            );
            wants.iter().map(|_| Err(DataError::Panicked)).collect()
        });
        let took = began.elapsed();
        let outs: Vec<_> = (wants.iter().zip(results))
            .map(|(want, got)| self.sourced(want, got, false))
            .collect();
        drop(wants);
        for (i, ((started, report), out)) in batch.into_iter().zip(outs).enumerate() {
            let took = if i == 0 { took } else { Duration::ZERO };
            let pace = Pace::Batch {
                took,
                crowd: drainers,
            };
            let end = || self.run_with(started, report, pace, |_, _, _| Some(out));
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(end));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::source::{Creds, DatasetSource, LocalSource};
    use crate::tier::fetch::tests::{Rig, fetcher_over};

    #[test]
    fn prefetches_of_small_files_are_read_in_batches_and_each_ends_with_its_bytes() {
        const FILES: usize = 40;
        let dir = tempfile::tempdir().unwrap();
        let bytes = |i: usize| -> Vec<u8> { (0..300 + i * 97).map(|b| (b + i) as u8).collect() };
        for i in 0..FILES {
            std::fs::write(dir.path().join(format!("f{i}")), bytes(i)).unwrap();
        }
        let local = Arc::new(LocalSource::new(dir.path().to_path_buf(), true).unwrap());
        assert!(local.reads_together());
        // One I/O thread, held until every prefetch is queued: the drainers then take the
        // queue in full batches, one after another (run free, they may each take a file as it
        // comes, and do in a loaded test run).
        let r = Rig {
            block: 64 << 10,
            cache: 1 << 20,
            pool: 1,
            ..Rig::default()
        };
        let (f, io) = fetcher_over(local.clone(), vec![], (1, (1, 0)), &r);
        let (open, held) = std::sync::mpsc::channel::<()>();
        io.spawn_blocking(move || held.recv());
        let (tx, rx) = std::sync::mpsc::channel();
        let samples = Arc::new(AtomicUsize::new(0));
        // Nothing waits for a batch before a demand read says the storage is fast.
        let mut first = crate::tier::tests::want(0, 0, 0, Why::Prefetch);
        first.key.version = (local.metadata(Path::new("f0"), &Creds::DAEMON))
            .unwrap()
            .version;
        assert!(!f.batchable(&first, false, false));
        f.demand_read_took(200);
        for i in 0..FILES {
            let rel = format!("f{i}");
            let version = (local.metadata(Path::new(&rel), &Creds::DAEMON))
                .unwrap()
                .version;
            let mut want = crate::tier::tests::want(0, 0, 0, Why::Prefetch);
            want.key.version = version;
            want.rel = Path::new(&rel);
            assert!(f.batchable(&want, false, false));
            let (tx, samples) = (tx.clone(), samples.clone());
            f.fetch(
                Arc::from(Path::new(&rel)),
                &want,
                &|| None,
                Box::new(move |got| tx.send((i, got)).unwrap()),
                Box::new(move |fetched| {
                    assert_eq!(fetched.bytes, Some(bytes(i).len() as u64));
                    if !fetched.took.is_zero() {
                        samples.fetch_add(1, Ordering::Relaxed);
                    }
                }),
            );
        }
        drop(open);
        for _ in 0..FILES {
            let (i, got) = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
            assert_eq!(got.unwrap().as_ref().as_ref(), &bytes(i)[..], "file {i}");
        }
        assert_eq!(Counters::get(&f.stats.counters.batched_reads), FILES as u64);
        // The pacer heard one sample a batch, not one a file.
        assert_eq!(samples.load(Ordering::Relaxed), FILES / BATCH);
        // The drainers stop once the queue is empty.
        let idle = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            f.batches.queue.lock().drainers == 0
        });
        assert!(idle, "a drainer still runs");
    }
}
