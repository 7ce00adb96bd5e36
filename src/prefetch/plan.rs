//! What to prefetch next, and for whom: pure rules over a job's reads and an order.
//!
//! Remaining-set prefetch pays only for a job whose epoch is the whole dataset. A shard job
//! (rank r of K under `DistributedSampler`, a different 1/K of the files every epoch) reads
//! few of the files it has not read, and a prefetcher that guessed for it wasted about half
//! of what it staged (measured: 375 of 730 staged blocks an epoch for a shard of 2). A glance
//! (`head`, `file`) is a job of one file. So without an order hint, [`may_prefetch_remaining`]
//! lets the prefetcher read ahead for a job only once its reads say that it reads the
//! dataset: it read (99% of) every file in one of its epochs, or clearly more than half of
//! the files in this one (no shard of two or more ranks does), and in either case at least
//! [`START_FILES`] files (or 1% of a small dataset) in this epoch. So the first epoch of a
//! job is prefetched from its middle on, and the later ones from their 32nd file. One
//! exception, on remote storage (an object store: tens of milliseconds a read, many at once):
//! while a cache that never evicts (MinIO), or the disk tier, has room, what the prefetcher
//! fetches is kept, and a file a shard does not read this epoch is a hit of its next (or of
//! the other ranks'), so the first epoch too is prefetched from its 32nd file. On an S3
//! server with 20 ms a request that took the first epoch of 2,000 files read by 2 processes
//! from 17-19 s to 7.4-8.2 s. Likewise where reads do not slow each other and the whole
//! dataset fits in the cache: a guess takes neither a read's turn nor a read file's room
//! (`Prefetcher::keeps_guesses`). The rule costs the first epoch of a job that reads the
//! dataset: 1,000 files of 16 KiB, half cached, storage with 2 ms reads, `coorfs read --procs
//! 2`: 1.0 s instead of 0.4 s, while a shard of two prefetched without the rule read 748
//! files from the source for its 500-file first epoch and 487 for 233 in its third.
//!
//! [`next_candidates`] walks an order (the job's hint, or the dataset's inode order) from a
//! cursor and picks what is eligible. [`will_read`] says which jobs a block one job read is
//! kept for: the same rule, and a hint's files where the job gave one.

use crate::jobs::{Job, reads_the_dataset};
use crate::namespace::FileId;

/// Distinct files a job must have read in its epoch before the prefetcher reads ahead for
/// it without a hint (or 1% of the dataset, if that is fewer). A glance (`head`, `file`, an
/// image viewer) reads one to a few files, and nothing it leaves unread is worth fetching;
/// any real epoch passes 32 files within moments. It costs nothing measurable, since the
/// remaining-set gain is made at the end of an epoch: 1,000 files of 16 KiB, half cached,
/// storage with 2 ms reads, `coorfs read --procs 2`, epochs 2 and 3 staged 444-455 of their
/// 488 misses whether prefetch started at their 1st, 32nd or 128th file.
pub const START_FILES: usize = 32;

/// True if the prefetcher may fetch from a job's remaining set without an order hint: its
/// epoch is under way ([`START_FILES`]), and the job reads the whole dataset
/// ([`reads_the_dataset`]) or what is fetched now is `kept` (a cache that never evicts has
/// room for it: a file the job does not read this epoch is a hit of a later one, or of
/// another job's, not staging memory wasted).
pub fn may_prefetch_remaining(read: usize, total: usize, covered: bool, kept: bool) -> bool {
    epoch_under_way(read, total) && (kept || reads_the_dataset(read, total, covered))
}

/// True once a job has read [`START_FILES`] distinct files of its epoch (or 1% of a dataset of
/// `total` files, if that is fewer): an epoch, not a glance.
pub fn epoch_under_way(read: usize, total: usize) -> bool {
    read >= START_FILES.min(total.div_ceil(100)).max(1)
}

/// True if job `j` will read file `f` soon as far as its reads and its order show, while
/// another job reads in its epoch `round` of a dataset of `total` files: who a block one job
/// read is kept for ([`crate::prefetch::Prefetcher::needing`]). A job that follows an order
/// reads the files in it: of this epoch's order, those it has not read yet (and, a round
/// behind, all of its next epoch if the order is the whole dataset); of an order waiting for
/// the next epoch (the job handed it during this one), every file. A shard's
/// order (a rank of DistributedSampler) names half the dataset, and the other half is not the
/// job's to read. Without an order: a job whose epoch is under way and has not read `f` in it,
/// or one a round behind that reads the whole dataset.
pub fn will_read(j: &Job, f: FileId, round: u64, total: usize) -> bool {
    let t = j.log.tracker();
    let behind = j.epoch() < round;
    let unread = !t.may_have_read(f);
    let next = j
        .next
        .as_ref()
        .is_some_and(|n| n.files.contains(f as usize) && (unread || behind));
    let current = match j.hint.as_ref().filter(|h| h.epoch == Some(j.epoch())) {
        Some(h) => {
            (h.files.contains(f as usize) && unread)
                || (behind && crate::epoch::covers(h.order.len(), total))
        }
        // An order for the next epoch names what the job reads.
        None if j.next.is_some() => false,
        None => needs_without_order(
            unread,
            behind,
            t.read_in_epoch(),
            total,
            t.covered_dataset(),
        ),
    };
    next || current
}

/// [`will_read`] for a job without an order, which has `read` distinct files of its epoch
/// (of `total`), has not read the file (`unread`), or is a round `behind`; `covered`: one of
/// its epochs read the whole dataset. It will read the file if its epoch is under way, or if
/// it reads the whole dataset every epoch, from its epoch's first file: several jobs start
/// their epochs moments apart, and a block one read before the others had read 32 files of
/// theirs was read again for each of them (four jobs of a sweep read each file 1.00-1.23
/// times a round once prefetches of small files were read in batches, and ran ahead sooner).
pub fn needs_without_order(
    unread: bool,
    behind: bool,
    read: usize,
    total: usize,
    covered: bool,
) -> bool {
    (unread && (covered || epoch_under_way(read, total)))
        || (behind && reads_the_dataset(read, total, covered))
}

/// Walks `order` from `cursor` and returns up to `want` files for which `eligible` holds,
/// with their positions, and the cursor to resume from: past every file looked at, since a
/// file that is not eligible now (read, cached, staged, in flight) will not become so in
/// this epoch. A caller that cannot take a picked file resumes from its position instead.
pub fn next_candidates(
    order: &[FileId],
    cursor: usize,
    want: usize,
    mut eligible: impl FnMut(FileId) -> bool,
) -> (Vec<(usize, FileId)>, usize) {
    let mut picked = Vec::new();
    let mut at = cursor;
    while at < order.len() && picked.len() < want {
        if eligible(order[at]) {
            picked.push((at, order[at]));
        }
        at += 1;
    }
    (picked, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_waits_for_an_epoch_that_reads_the_dataset() {
        let n = 10_000;
        // A glance, and a job well into an epoch that is no more than a shard of two.
        assert!(!may_prefetch_remaining(1, n, false, false));
        assert!(!may_prefetch_remaining(5000, n, false, false));
        assert!(!may_prefetch_remaining(5064, n, false, false));
        assert!(may_prefetch_remaining(5065, n, false, false));
        // What a cache with room keeps is no waste: from the 32nd file on.
        assert!(!may_prefetch_remaining(31, n, false, true));
        assert!(may_prefetch_remaining(32, n, false, true));
        // A job that read the dataset in an epoch: from its 32nd file on.
        assert!(!may_prefetch_remaining(31, n, true, false));
        assert!(may_prefetch_remaining(32, n, true, false));
        // A small dataset: 1% of it.
        assert!(!may_prefetch_remaining(1, 500, true, false));
        assert!(may_prefetch_remaining(5, 500, true, false));
        assert!(may_prefetch_remaining(1, 50, true, false));
        // Rank 1 of 2 of an odd dataset reads half of it rounded up, a few more at most.
        assert!(!reads_the_dataset(510, 1001, false));
    }

    #[test]
    fn a_job_that_reads_the_dataset_needs_every_unread_file_from_its_epoch_s_start() {
        let n = 1000;
        // A job on its first pass is a needer once its epoch is under way (1% of 1,000).
        assert!(!needs_without_order(true, false, 9, n, false));
        assert!(needs_without_order(true, false, 10, n, false));
        // One that read the whole dataset before, from its epoch's first file.
        assert!(needs_without_order(true, false, 1, n, true));
        // Never for a file it read this epoch, unless a round behind and reading it all.
        assert!(!needs_without_order(false, false, 500, n, true));
        assert!(needs_without_order(false, true, 1, n, true));
        assert!(!needs_without_order(false, true, 400, n, false));
    }

    #[test]
    fn candidates_follow_the_order_and_skip_the_ineligible() {
        let order = [5, 3, 8, 1, 9, 2];
        let (picked, cursor) = next_candidates(&order, 0, 2, |f| f != 3);
        assert_eq!((picked, cursor), (vec![(0, 5), (2, 8)], 3));
        let (picked, cursor) = next_candidates(&order, cursor, 10, |f| f > 1);
        assert_eq!((picked, cursor), (vec![(4, 9), (5, 2)], 6));
        assert_eq!(next_candidates(&order, 6, 3, |_| true), (vec![], 6));
    }
}
