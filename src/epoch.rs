//! Epoch tracking: which files a reader has read in its current epoch, and where an epoch
//! ends. Pure: no clock, no I/O; the dataset's file count and the process that reads are
//! passed in.
//!
//! An epoch is the set of distinct files read. Two rules ([`Boundary`]):
//! - [`Boundary::AllRead`], the dataset-wide view (every job together): an epoch ends when
//!   every file of the dataset has been read once more; re-reads change nothing, since
//!   several jobs reading at once re-read each other's files all the time.
//! - [`Boundary::Coverage`], one job: an epoch ends when the job has read every file (or every
//!   file of the order it said the epoch reads: [`EpochTracker::plan`]), or when it starts over
//!   on what it read (it moved on before reading everything: a shard of the dataset,
//!   `drop_last`, a loop stopped and restarted). Below.
//!
//! # Where a job's epoch ends
//! Real jobs re-open files inside one epoch: a dataset whose `__getitem__` checks a file and
//! then decodes it, PIL re-opening, retries, two workers sharing a file. One re-read cannot end
//! an epoch (an early version ended one at every re-read: a double-open dataset made 7,573
//! "epochs" of about two files in a 3-epoch run).
//! - A re-read is *recent* if the file was accessed within the job's last [`JOB_WINDOW`]
//!   accesses, more for big datasets (by any process: two workers sharing a file, a retry by
//!   another thread), or within the last [`READER_WINDOW`] accesses of the process reading it
//!   now (a check and a decode, a retry, however many files the other workers read
//!   meanwhile). A recent re-read is the same access as the read before it and never ends an
//!   epoch.
//! - A re-read that is not recent is *evidence* of a new pass. One piece alone ends nothing (a
//!   stray re-read, a worker descheduled between its two opens); a second within [`SPAN`]
//!   accesses of the first ends the epoch ([`Step::Restarted`]). A new pass re-reads at the
//!   rate of the share already covered, so a job that restarts after a tenth of its epoch
//!   gives the second piece within 64 accesses with probability 1 - 0.9^64 > 99.8%, and a
//!   shard job (a different half of the dataset every epoch) within a few accesses of its new
//!   epoch. The new epoch begins at the first piece, or where new processes began reading if
//!   that was moments before ([`HISTORY`]) and after the others had stopped: a DataLoader
//!   forks new workers for every pass, and what they read before the first re-read is the new
//!   pass too (a new worker that read a batch and waited, moments before the next began,
//!   counts as one that began, not one that stopped). What was read since moves to the new
//!   epoch.
//! - Right after an epoch ends, an access of a file the job read moments ago is *carried*:
//!   the file is not read yet in the new epoch. A process's second open of the file it just
//!   read, or an access by a process still finishing the last epoch of a file another one
//!   read (a worker sharing the last files), belongs to the epoch that ended
//!   ([`Step::Trailing`]). Otherwise (a new process: a DataLoader forks new workers every
//!   epoch; one that reads on in the new epoch; one that read the file itself a few files
//!   ago) the access may be the new epoch's first read of the file, since a new permutation
//!   may begin with a file the last one ended with: it counts in the new epoch
//!   ([`Step::Carried`]). A carried file read again later (not
//!   recently) is read then. If it is not, the carried access was the new epoch's read of it,
//!   so an epoch is complete once every file was read or carried.
//!
//! The windows count accesses, not seconds: a few seconds are a few files on slow storage and
//! whole epochs of a small dataset on fast storage, so a window in time would either miss a
//! slow worker's second open or take a new pass for re-reads. What the rule cannot tell: a
//! job that cycles over fewer files than the windows hold only ends epochs by reading
//! everything, and a job whose samples read other samples' files at random (a few large shard
//! files read at random offsets) re-reads all the time, so its epochs are only approximate.
//!
//! The set of files read is a bitmap over the dense file ids of the namespace: one bit a
//! file, 160 KiB for ImageNet's 1.28 million files, kept for the current epoch and the last. The windows and the history hold a few
//! hundred accesses (1/64 of the files of a big dataset: 20,000 for ImageNet).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use fixedbitset::FixedBitSet;

use crate::namespace::FileId;

/// A job's accesses within which a re-read of a file by any of its processes is the same
/// access: two workers sharing a file read it within what a DataLoader has in flight of each
/// other (2 batches a worker: 64 files for 2 workers and batches of 16). Few enough that a
/// new pass over a dataset of thousands of files rarely begins among them: about W^2 / 2N
/// of its first reads do, one for N = 2,000. Datasets of more than 4,096 files get 1/64 of
/// their files ([`job_window`]): big datasets are read by big jobs with more in flight.
pub const JOB_WINDOW: usize = 64;

/// The job's window for a dataset of `total` files (see [`JOB_WINDOW`]): N/64 of a big
/// dataset keeps W^2 / 2N at N/8192 of a pass (0.01%).
pub fn job_window(total: Option<usize>) -> usize {
    JOB_WINDOW.max(total.unwrap_or(0) / 64)
}

/// A process's own accesses within which its re-read of a file is the same access: a check
/// and a decode are one after the other; 16 leaves room for a sample that opens a few files.
pub const READER_WINDOW: usize = 16;

/// Accesses within which a second piece of evidence must follow the first for the epoch to
/// end (see the module header).
pub const SPAN: u64 = 64;

/// Accesses a new epoch may begin before the evidence that ended the last one (see
/// [`EpochTracker::access`]).
pub const HISTORY: usize = 2 * SPAN as usize;

/// Processes whose windows are kept; the least recently active is forgotten past this (a
/// DataLoader forks new workers every epoch).
const READERS: usize = 64;

/// An epoch that read at least this share of the dataset covered it (`drop_last` leaves out
/// less than a batch).
const COVERED_PERCENT: usize = 99;

/// True if `files` files are (nearly) all `total` files of a dataset: an epoch that read them
/// covered it, an order of them is the whole dataset's ([`COVERED_PERCENT`]).
pub fn covers(files: usize, total: usize) -> bool {
    total > 0 && files * 100 >= total * COVERED_PERCENT
}

/// Where an epoch ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boundary {
    /// When every file of the dataset has been read.
    AllRead,
    /// When every file has been read, or the reader starts a new pass (see the module header).
    Coverage,
}

/// What an access did to the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The first read of this file in the current epoch.
    First,
    /// The file was read before in this epoch: the same access again, or a lone re-read.
    Repeat,
    /// An access, moments later, of a file read just before the epoch ended: the process's
    /// second open of it, or a process finishing that epoch on a file another one read. It
    /// belongs to that epoch (`Coverage` only). The file is carried.
    Trailing,
    /// An access, moments later, of a file read just before the epoch ended, by a process
    /// that reads in the new epoch: maybe the new epoch's read of it (`Coverage` only). The
    /// file is carried: the access belongs to the new epoch, but the file counts as read in
    /// it only if the epoch completes without another read of it.
    Carried,
    /// The first read of the file in the current epoch, and the last file of it: the epoch
    /// is complete, and the next access belongs to the next one.
    Completed,
    /// A new pass began: the epoch ended `moved` accesses ago, and those accesses and this one
    /// belong to the new epoch (`Coverage` only).
    Restarted { moved: u64 },
}

impl Step {
    /// True if the access ended the reader's epoch: a new one began.
    pub fn began_epoch(self) -> bool {
        matches!(self, Step::Completed | Step::Restarted { .. })
    }
}

/// One of the last accesses.
#[derive(Clone, Copy, Debug)]
struct Access {
    clock: u64,
    file: FileId,
    /// It was the file's first read in its epoch.
    first: bool,
}

/// The last accesses of one process.
#[derive(Clone, Debug, Default)]
struct ReaderWindow {
    /// The clock of its first access, and of its last.
    born: u64,
    last: u64,
    /// The epoch it last read in: its trailing accesses of an epoch that ended do not count.
    epoch: u64,
    files: VecDeque<FileId>,
}

/// The epoch state of one reader (a job, or the whole dataset).
#[derive(Clone, Debug)]
pub struct EpochTracker {
    rule: Boundary,
    seen: FixedBitSet,
    /// The files of the epoch that ended last.
    last_seen: FixedBitSet,
    count: usize,
    epoch: u64,
    /// Accesses so far.
    clock: u64,
    /// The job's last [`job_window`] accesses, oldest first, and how often each file is
    /// among them.
    window: VecDeque<FileId>,
    in_window: HashMap<FileId, u32>,
    readers: HashMap<u32, ReaderWindow>,
    /// Files accessed moments after the last epoch ended and not read of their own yet, each
    /// with whether a process reading the new epoch accessed it ([`Step::Carried`]).
    carried: HashMap<FileId, bool>,
    /// The access (clock) that was the first evidence of a new pass, waiting for a second.
    suspect: Option<u64>,
    /// The last [`HISTORY`] accesses, oldest first: how far a new epoch may begin back.
    history: VecDeque<Access>,
    /// The clock of the current epoch's first access (it may begin back no further).
    began: u64,
    /// Files of the epoch that ended last.
    last_files: usize,
    /// Some epoch read (nearly) every file of the dataset.
    covered: bool,
    /// The files the current epoch reads, if the reader said so ([`EpochTracker::plan`]):
    /// the set, its size, and how many of them were read.
    plan: Option<Arc<FixedBitSet>>,
    plan_len: usize,
    plan_read: usize,
}

impl EpochTracker {
    /// A tracker at the start of epoch 1.
    pub fn new(rule: Boundary) -> Self {
        EpochTracker {
            rule,
            seen: FixedBitSet::new(),
            last_seen: FixedBitSet::new(),
            count: 0,
            epoch: 1,
            clock: 0,
            window: VecDeque::new(),
            in_window: HashMap::new(),
            readers: HashMap::new(),
            carried: HashMap::new(),
            suspect: None,
            history: VecDeque::new(),
            began: 1,
            last_files: 0,
            covered: false,
            plan: None,
            plan_len: 0,
            plan_read: 0,
        }
    }

    /// The files the current epoch will read, as the reader said (a job's order hint for
    /// it), or None: the epoch is complete once every one of them was read (or carried), as
    /// an epoch of the whole dataset is once every file was. A shard of a dataset (a rank of
    /// `DistributedSampler` reads a different half every epoch) then ends at its last file,
    /// not a few files into the next epoch, when its re-reads show a new pass: until then its
    /// next order waits, and the prefetcher with it. Forgotten when the epoch ends.
    pub fn plan(&mut self, files: Option<Arc<FixedBitSet>>) {
        self.plan_len = files.as_ref().map_or(0, |f| f.count_ones(..));
        self.plan_read = files
            .as_ref()
            .map_or(0, |f| f.intersection_count(&self.seen));
        self.plan = files;
    }

    /// The current epoch (1-based).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Files read in the current epoch.
    pub fn read_in_epoch(&self) -> usize {
        self.count
    }

    /// Files the current epoch has read, counting those carried that a process reading it
    /// accessed: its files so far, for the record.
    pub fn files_in_epoch(&self) -> usize {
        self.count + self.carried.values().filter(|fresh| **fresh).count()
    }

    /// Files read in the epoch that ended last (0 before the first ended).
    pub fn last_epoch_files(&self) -> usize {
        self.last_files
    }

    /// True once an epoch read at least 99% of the dataset: the job reads the whole dataset,
    /// not a shard or a subset of it.
    pub fn covered_dataset(&self) -> bool {
        self.covered
    }

    /// True if `file` was read in the current epoch.
    pub fn has_read(&self, file: FileId) -> bool {
        self.seen.contains(file as usize)
    }

    /// True if `file` was read in the epoch that ended last.
    pub fn read_in_last_epoch(&self, file: FileId) -> bool {
        self.last_seen.contains(file as usize)
    }

    /// True if `file` was read in the current epoch, or may have been: it is carried (a
    /// trailing access right after the last epoch ended may have been this epoch's read).
    pub fn may_have_read(&self, file: FileId) -> bool {
        self.has_read(file) || self.carried.contains_key(&file)
    }

    fn planned(&self, file: FileId) -> bool {
        self.plan
            .as_ref()
            .is_some_and(|p| p.contains(file as usize))
    }

    fn mark(&mut self, file: FileId) {
        let bit = file as usize;
        // Grown in words, as the ids come: a dataset's ids are dense.
        self.seen.grow(bit + 1);
        if !self.seen.put(bit) {
            self.count += 1;
            self.plan_read += usize::from(self.planned(file));
        }
    }

    fn unmark(&mut self, file: FileId) {
        if self.seen.contains(file as usize) {
            self.seen.set(file as usize, false);
            self.count -= 1;
            self.plan_read -= usize::from(self.planned(file));
        }
    }

    /// Ends the current epoch, which read `files` files of `total`.
    fn next_epoch(&mut self, files: usize, total: Option<usize>) {
        self.last_files = files;
        if total.is_some_and(|total| covers(files, total)) {
            self.covered = true;
        }
        self.epoch += 1;
        self.began = self.clock + 1;
        std::mem::swap(&mut self.seen, &mut self.last_seen);
        self.seen.clear();
        self.count = 0;
        self.carried.clear();
        self.suspect = None;
        self.plan(None);
    }

    /// True if process `reader` itself accessed `file` within its last [`READER_WINDOW`]
    /// accesses.
    fn read_by(&self, file: FileId, reader: u32) -> bool {
        self.readers
            .get(&reader)
            .is_some_and(|r| r.files.contains(&file))
    }

    /// Enters an access of `file` by `reader` into the windows.
    fn remember(&mut self, file: FileId, reader: u32, total: Option<usize>) {
        self.window.push_back(file);
        *self.in_window.entry(file).or_default() += 1;
        while self.window.len() > job_window(total)
            && let Some(old) = self.window.pop_front()
            && let Some(n) = self.in_window.get_mut(&old)
        {
            *n -= 1;
            if *n == 0 {
                self.in_window.remove(&old);
            }
        }
        if !self.readers.contains_key(&reader) && self.readers.len() >= READERS {
            let idle = self
                .readers
                .iter()
                .min_by_key(|(_, r)| r.last)
                .map(|(k, _)| *k);
            if let Some(idle) = idle {
                self.readers.remove(&idle);
            }
        }
        let clock = self.clock;
        let r = self.readers.entry(reader).or_insert_with(|| ReaderWindow {
            born: clock,
            ..Default::default()
        });
        r.last = clock;
        r.files.push_back(file);
        if r.files.len() > READER_WINDOW {
            r.files.pop_front();
        }
    }

    /// Records a read of `file` by process `reader`. `total` is the number of files in the
    /// dataset, if known (until it is, an epoch cannot complete by reading everything).
    pub fn access(&mut self, file: FileId, reader: u32, total: Option<usize>) -> Step {
        if self.rule == Boundary::AllRead {
            if self.has_read(file) {
                return Step::Repeat;
            }
            self.mark(file);
            return self.finish_if_complete(total);
        }
        let before = self.epoch;
        let (step, first) = self.cover(file, reader, total);
        if let Some(r) = self.readers.get_mut(&reader) {
            r.epoch = match step {
                Step::Trailing => r.epoch,
                Step::Completed => before,
                _ => self.epoch,
            };
        }
        self.history.push_back(Access {
            clock: self.clock,
            file,
            first,
        });
        if self.history.len() > HISTORY {
            self.history.pop_front();
        }
        step
    }

    /// [`EpochTracker::access`] under [`Boundary::Coverage`]; also says whether the access
    /// was the file's first read in its epoch.
    fn cover(&mut self, file: FileId, reader: u32, total: Option<usize>) -> (Step, bool) {
        self.clock += 1;
        if self.suspect.is_some_and(|at| self.clock - at > SPAN) {
            self.suspect = None;
        }
        let own = self.read_by(file, reader);
        // Its last access was this file: a second open of it.
        let again = self
            .readers
            .get(&reader)
            .is_some_and(|r| r.files.back() == Some(&file));
        let recent = own || self.in_window.contains_key(&file);
        let finishing = self
            .readers
            .get(&reader)
            .is_some_and(|r| r.epoch < self.epoch);
        self.remember(file, reader, total);
        if self.has_read(file) {
            if recent {
                return (Step::Repeat, false);
            }
            let step = self.evidence(file, total);
            return (step, step != Step::Repeat);
        }
        if recent {
            // Not read in this epoch but accessed moments ago: by the epoch that ended. A
            // second open, or a process finishing that epoch on a file another one read (a
            // worker sharing the last files), is that epoch's; a process that read the file
            // itself earlier, and reads on, may be starting the new epoch with it.
            let trailing = again || (finishing && !own);
            *self.carried.entry(file).or_default() |= !trailing;
            let step = match self.finish_if_complete(total) {
                Step::First if trailing => Step::Trailing,
                Step::First => Step::Carried,
                completed => completed,
            };
            return (step, false);
        }
        self.carried.remove(&file);
        self.mark(file);
        (self.finish_if_complete(total), true)
    }

    /// A re-read of `file`, not recent: the second within `SPAN` accesses ends the epoch.
    /// The new one begins at the first, or where new processes began reading, if that was
    /// within the last [`HISTORY`] accesses and after the processes of the last pass had
    /// stopped (a DataLoader forks new workers for a new pass): what was accessed since then
    /// is the new epoch's.
    fn evidence(&mut self, file: FileId, total: Option<usize>) -> Step {
        let Some(first) = self.suspect.take() else {
            self.suspect = Some(self.clock);
            return Step::Repeat;
        };
        let oldest = self
            .history
            .front()
            .map_or(self.clock, |a| a.clock)
            .max(self.began);
        // The processes reading since the first evidence read the new pass; those that had
        // stopped when the first of them began read the last one, unless they began moments
        // before it (within SPAN accesses: new workers begin together, and one may read a
        // batch and wait while the next begins). Those that began after, lately, read the new
        // one too.
        let new_pass = self
            .readers
            .values()
            .filter(|w| w.last >= first)
            .map(|w| w.born)
            .min()
            .unwrap_or(first);
        let stopped = self
            .readers
            .values()
            .filter(|w| w.last < new_pass && w.born + SPAN < new_pass)
            .map(|w| w.last)
            .max()
            .unwrap_or(0);
        let start = self
            .readers
            .values()
            .map(|w| w.born)
            .filter(|born| *born >= oldest && *born > stopped)
            .fold(first, u64::min);
        let moved: Vec<Access> = self
            .history
            .iter()
            .filter(|a| a.clock >= start)
            .copied()
            .collect();
        for a in &moved {
            if a.first {
                self.unmark(a.file);
            }
            self.carried.remove(&a.file);
        }
        self.next_epoch(self.files_in_epoch(), total);
        self.began = start;
        for a in &moved {
            self.mark(a.file);
        }
        self.mark(file);
        Step::Restarted {
            moved: self.clock - start,
        }
    }

    fn finish_if_complete(&mut self, total: Option<usize>) -> Step {
        let files = self.count + self.carried.len();
        let all = total.is_some_and(|total| total > 0 && files >= total);
        // The dataset-wide view ends its epochs when every file was read, whatever anybody said.
        let planned = self.rule == Boundary::Coverage
            && self.plan_len > 0
            && self.plan_read + self.carried.keys().filter(|f| self.planned(**f)).count()
                >= self.plan_len;
        if all || planned {
            self.next_epoch(files, total);
            Step::Completed
        } else {
            Step::First
        }
    }

    /// The files of `0..total` not read (or carried) yet in the current epoch, in id order.
    pub fn remaining(&self, total: usize) -> impl Iterator<Item = FileId> + '_ {
        (0..total as FileId).filter(move |f| !self.may_have_read(*f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// Feeds `accesses` (file, reader) to a tracker; returns the steps.
    fn run(t: &mut EpochTracker, accesses: &[(FileId, u32)], total: Option<usize>) -> Vec<Step> {
        accesses
            .iter()
            .map(|&(f, r)| t.access(f, r, total))
            .collect()
    }

    /// Every file of `order` read by reader 1.
    fn alone(order: impl IntoIterator<Item = FileId>) -> Vec<(FileId, u32)> {
        order.into_iter().map(|f| (f, 1)).collect()
    }

    #[test]
    #[allow(clippy::type_complexity)]
    fn table_of_steps() {
        use Step::*;
        // (rule, accesses by reader 1, total, expected steps, expected epoch after)
        let cases: &[(Boundary, &[FileId], Option<usize>, &[Step], u64)] = &[
            (
                Boundary::AllRead,
                &[0, 1, 2],
                Some(3),
                &[First, First, Completed],
                2,
            ),
            (
                Boundary::AllRead,
                &[0, 0, 1, 2, 0],
                Some(3),
                &[First, Repeat, First, Completed, First],
                2,
            ),
            (
                Boundary::AllRead,
                &[0, 1, 2],
                None,
                &[First, First, First],
                1,
            ),
            (Boundary::AllRead, &[0], Some(1), &[Completed], 2),
            // A double open: the second is the same access; the epoch ends by reading all.
            (
                Boundary::Coverage,
                &[0, 0, 1, 1, 2, 2],
                Some(3),
                &[First, Repeat, First, Repeat, Completed, Trailing],
                2,
            ),
            // Re-reads within the window, however many, end nothing.
            (
                Boundary::Coverage,
                &[5, 6, 5, 6, 5, 6],
                Some(100),
                &[First, First, Repeat, Repeat, Repeat, Repeat],
                1,
            ),
            // A dataset smaller than the window: every access of a new pass is recent and
            // carried, and the carried files complete it; the last is a second open.
            (
                Boundary::Coverage,
                &[0, 1, 2, 3, 2, 0, 3, 1, 1],
                Some(4),
                &[
                    First, First, First, Completed, Carried, Carried, Carried, Completed, Trailing,
                ],
                3,
            ),
            (
                Boundary::Coverage,
                &[2, 1, 0, 0, 1, 2],
                None,
                &[First, First, First, Repeat, Repeat, Repeat],
                1,
            ),
        ];
        for (rule, accesses, total, want, epoch) in cases {
            let mut t = EpochTracker::new(*rule);
            let got = run(&mut t, &alone(accesses.iter().copied()), *total);
            assert_eq!(&got, want, "{rule:?} {accesses:?}");
            assert_eq!(t.epoch(), *epoch, "{rule:?} {accesses:?}");
        }
    }

    #[test]
    fn an_epoch_with_a_plan_ends_at_the_last_file_of_it() {
        let plan = |files: std::ops::Range<FileId>| {
            Some(Arc::new(files.map(|f| f as usize).collect::<FixedBitSet>()))
        };
        let mut t = EpochTracker::new(Boundary::Coverage);
        let total = Some(1000);
        // A shard of half the dataset, said before its first read: its last file ends it.
        t.plan(plan(0..500));
        assert_eq!(
            run(&mut t, &alone(0..499), total).last(),
            Some(&Step::First)
        );
        assert_eq!(t.access(499, 1, total), Step::Completed);
        assert_eq!((t.epoch(), t.last_epoch_files()), (2, 500));
        // The plan was the ended epoch's: the next one, without one, reads on to its restart.
        run(&mut t, &alone(500..1000), total);
        assert_eq!(t.epoch(), 2, "the other half is no new pass");
        // A plan said after some of its files were read counts them; files outside it count
        // for the epoch but not for the plan.
        let mut t = EpochTracker::new(Boundary::Coverage);
        run(&mut t, &alone([7, 3, 900]), total);
        t.plan(plan(0..10));
        assert_eq!(
            run(&mut t, &alone([0, 1, 2, 4, 5, 6, 8]), total).last(),
            Some(&Step::First)
        );
        assert_eq!(t.access(9, 1, total), Step::Completed);
        assert_eq!(t.last_epoch_files(), 11);
        // The dataset-wide view takes no plan from anybody: it ends when every file was read.
        let mut t = EpochTracker::new(Boundary::AllRead);
        t.plan(plan(0..2));
        run(&mut t, &alone([0, 1]), Some(4));
        assert_eq!(t.epoch(), 1);
    }

    #[test]
    fn a_lone_old_re_read_ends_nothing_and_a_second_ends_the_epoch_where_the_first_was() {
        let mut t = EpochTracker::new(Boundary::Coverage);
        let total = Some(1000);
        run(&mut t, &alone(0..200), total);
        // A stray re-read of file 3, then 100 new files: still epoch 1.
        assert_eq!(t.access(3, 1, total), Step::Repeat);
        run(&mut t, &alone(200..300), total);
        assert_eq!((t.epoch(), t.read_in_epoch()), (1, 300));
        // A restart: 10 is old, 900 is new, 11 is old again: the epoch ended at 10.
        assert_eq!(t.access(10, 1, total), Step::Repeat);
        assert_eq!(t.access(900, 1, total), Step::First);
        assert_eq!(t.access(11, 1, total), Step::Restarted { moved: 2 });
        assert_eq!(t.epoch(), 2);
        assert_eq!(t.last_epoch_files(), 300, "900 moved to the new epoch");
        assert_eq!(t.read_in_epoch(), 3);
        assert!(t.has_read(10) && t.has_read(900) && t.has_read(11));
        assert!(!t.has_read(12) && !t.covered_dataset());
        // A second piece later than SPAN accesses after the first ends nothing.
        let mut t = EpochTracker::new(Boundary::Coverage);
        run(&mut t, &alone(0..200), total);
        t.access(3, 1, total);
        run(&mut t, &alone(200..200 + SPAN as FileId), total);
        assert_eq!(t.access(4, 1, total), Step::Repeat);
        assert_eq!(t.epoch(), 1);
    }

    #[test]
    fn a_new_pass_by_new_processes_begins_where_they_began() {
        let total = Some(1000);
        let mut t = EpochTracker::new(Boundary::Coverage);
        // A shard: half of the dataset, then the next epoch's workers (a new process) read
        // two files the last epoch did not, then two it did.
        run(&mut t, &alone(0..500), total);
        let next = [(700, 2), (800, 2), (10, 2), (900, 2), (20, 2)];
        let steps = run(&mut t, &next, total);
        assert_eq!(steps[4], Step::Restarted { moved: 4 });
        assert_eq!(
            (t.epoch(), t.last_epoch_files(), t.read_in_epoch()),
            (2, 500, 5)
        );
        assert!(t.has_read(700) && t.has_read(800) && !t.has_read(30));
        // A process that read before gives no such head start.
        let mut t = EpochTracker::new(Boundary::Coverage);
        run(&mut t, &alone(0..500), total);
        let steps = run(&mut t, &alone([700, 800, 10, 900, 20]), total);
        assert_eq!(steps[4], Step::Restarted { moved: 2 });
        assert_eq!((t.last_epoch_files(), t.read_in_epoch()), (502, 3));
    }

    #[test]
    fn a_new_worker_that_read_and_waited_before_the_others_began_reads_the_new_pass() {
        let total = Some(1000);
        let mut t = EpochTracker::new(Boundary::Coverage);
        // Epoch 1 by workers 1 and 2; epoch 2's workers 3 and 4 read half and stop.
        let one: Vec<_> = (0..1000).map(|f| (f, 1 + f % 2)).collect();
        run(&mut t, &one, total);
        let half: Vec<_> = (0..500).map(|f| (f, 3 + f % 2)).collect();
        run(&mut t, &half, total);
        // The next pass's worker 5 reads two files and waits; worker 6 begins, reads one new
        // file and two that epoch 2 read.
        let next = [(600, 5), (601, 5), (602, 6), (10, 6), (20, 6)];
        let steps = run(&mut t, &next, total);
        assert_eq!(steps[4], Step::Restarted { moved: 4 });
        assert_eq!((t.epoch(), t.last_epoch_files()), (3, 500));
        assert!([600, 601, 602, 10, 20].iter().all(|f| t.has_read(*f)));
    }

    #[test]
    fn re_reads_by_the_same_process_are_recent_however_much_others_read() {
        let mut t = EpochTracker::new(Boundary::Coverage);
        let total = Some(1000);
        t.access(7, 1, total);
        // Reader 2 reads 100 files (more than the job's window) while reader 1 is away.
        run(
            &mut t,
            &(100..200).map(|f| (f, 2)).collect::<Vec<_>>(),
            total,
        );
        assert_eq!(t.access(7, 1, total), Step::Repeat);
        // Another reader's re-read of an old file is evidence: with a second, a new epoch.
        assert_eq!(t.access(100, 3, total), Step::Repeat);
        assert_eq!(
            t.access(7, 3, total),
            Step::Repeat,
            "recent: 7 was just read"
        );
        assert_eq!(t.access(101, 3, total), Step::Restarted { moved: 2 });
    }

    #[test]
    fn a_trailing_access_is_carried_then_resolved_either_way() {
        let total = Some(200);
        let mut t = EpochTracker::new(Boundary::Coverage);
        run(&mut t, &alone(0..200), total);
        assert_eq!(t.epoch(), 2);
        // The second open of the last file.
        assert_eq!(t.access(199, 1, total), Step::Trailing);
        assert!(t.may_have_read(199) && !t.has_read(199));
        assert_eq!(t.remaining(200).count(), 199);
        // The new epoch reads it again once it is no longer recent: that is its read.
        let mut later = t.clone();
        run(&mut later, &alone(0..100), total);
        assert_eq!(later.access(199, 1, total), Step::First);
        assert_eq!((later.epoch(), later.read_in_epoch()), (2, 101));
        // Another process's read of a file the last epoch ended with counts in the new one.
        assert_eq!(t.access(198, 2, total), Step::Carried);
        // 199 is never read again: the trailing access was this epoch's read of it.
        run(&mut t, &alone(0..199), total);
        assert_eq!((t.epoch(), t.last_epoch_files()), (3, 200));
    }

    #[test]
    fn right_after_an_epoch_old_processes_trail_and_new_ones_carry() {
        let total = Some(200);
        let mut t = EpochTracker::new(Boundary::Coverage);
        // Two workers: 1 reads the even files, 2 the odd ones; 2 completes the epoch.
        let two: Vec<_> = (0..200).map(|f| (f, 1 + f % 2)).collect();
        run(&mut t, &two, total);
        assert_eq!(t.epoch(), 2);
        // Worker 2 opens the last file a second time.
        assert_eq!(t.access(199, 2, total), Step::Trailing);
        // Worker 1 still finishes epoch 1 on files it shares with worker 2.
        assert_eq!(t.access(197, 1, total), Step::Trailing);
        assert_eq!(t.access(193, 1, total), Step::Trailing);
        // A file it read itself a few files ago may be epoch 2's first read of it.
        assert_eq!(t.access(190, 1, total), Step::Carried);
        // Once it read in epoch 2, its access of worker 2's file may be too.
        assert_eq!(t.access(0, 1, total), Step::First);
        assert_eq!(t.access(195, 1, total), Step::Carried);
        // A new worker of epoch 2.
        assert_eq!(t.access(196, 3, total), Step::Carried);
        assert_eq!((t.read_in_epoch(), t.files_in_epoch()), (1, 4));
        assert!(
            [190, 193, 195, 196, 197, 199]
                .iter()
                .all(|f| t.may_have_read(*f))
        );
        assert!(t.read_in_last_epoch(150) && t.read_in_last_epoch(0) && !t.has_read(150));
    }

    #[test]
    fn an_epoch_that_reads_nearly_everything_covers_the_dataset() {
        let total = Some(1000);
        let mut t = EpochTracker::new(Boundary::Coverage);
        // drop_last: 995 of 1000 files, then a new pass.
        run(&mut t, &alone(0..995), total);
        run(&mut t, &alone([500, 501]), total);
        assert_eq!((t.epoch(), t.last_epoch_files()), (2, 995));
        assert!(t.covered_dataset());
        let mut half = EpochTracker::new(Boundary::Coverage);
        run(&mut half, &alone(0..500), total);
        run(&mut half, &alone([100, 101]), total);
        assert_eq!(half.epoch(), 2);
        assert!(!half.covered_dataset());
    }

    /// A tiny reference of the coverage rule, written the obvious way: the whole history of
    /// accesses, searched backwards; sets of files.
    #[derive(Default)]
    struct Reference {
        epoch: u64,
        set: BTreeSet<FileId>,
        /// Carried files, and whether a process reading the new epoch accessed them.
        carried: std::collections::BTreeMap<FileId, bool>,
        /// The epoch each process last read in (not counting its trailing accesses).
        reader_epoch: std::collections::BTreeMap<u32, u64>,
        /// (file, reader, first read of the file in its epoch)
        history: Vec<(FileId, u32, bool)>,
        /// History index of the first evidence.
        suspect: Option<usize>,
        /// History index of the current epoch's first access.
        began: usize,
        last_files: usize,
        covered: bool,
    }

    impl Reference {
        fn recent(&self, file: FileId, reader: u32, total: usize) -> bool {
            let h = &self.history;
            h[h.len().saturating_sub(job_window(Some(total)))..]
                .iter()
                .any(|a| a.0 == file)
                || h.iter()
                    .rev()
                    .filter(|a| a.1 == reader)
                    .take(READER_WINDOW)
                    .any(|a| a.0 == file)
        }

        /// History indices where each process began reading, and where it read last, with
        /// `reader` reading at `now`.
        fn lives(&self, reader: u32, now: usize) -> Vec<(usize, usize)> {
            let mut readers: BTreeSet<u32> = self.history.iter().map(|a| a.1).collect();
            readers.insert(reader);
            readers
                .into_iter()
                .map(|r| {
                    let born = self.history.iter().position(|a| a.1 == r).unwrap_or(now);
                    let last = match r == reader {
                        true => now,
                        false => self.history.iter().rposition(|a| a.1 == r).unwrap(),
                    };
                    (born, last)
                })
                .collect()
        }

        fn end(&mut self, files: usize, total: usize) {
            self.last_files = files;
            self.covered |= files * 100 >= total * COVERED_PERCENT;
            self.epoch += 1;
            self.began = self.history.len() + 1;
            self.set.clear();
            self.carried.clear();
            self.suspect = None;
        }

        fn fresh(&self) -> usize {
            self.carried.values().filter(|f| **f).count()
        }

        fn access(&mut self, file: FileId, reader: u32, total: usize) -> Step {
            let now = self.history.len();
            if self.suspect.is_some_and(|at| now - at > SPAN as usize) {
                self.suspect = None;
            }
            let recent = self.recent(file, reader, total);
            let before = self.epoch;
            let (first, step) = self.step(file, reader, total, now, recent);
            match step {
                Step::Trailing => {}
                Step::Completed => {
                    self.reader_epoch.insert(reader, before);
                }
                _ => {
                    self.reader_epoch.insert(reader, self.epoch);
                }
            }
            self.history.push((file, reader, first));
            step
        }

        /// Returns whether the access was a first read in its epoch, and its step.
        fn step(
            &mut self,
            file: FileId,
            reader: u32,
            total: usize,
            now: usize,
            recent: bool,
        ) -> (bool, Step) {
            if self.set.contains(&file) {
                if recent {
                    return (false, Step::Repeat);
                }
                let Some(at) = self.suspect.take() else {
                    self.suspect = Some(now);
                    return (false, Step::Repeat);
                };
                let oldest = now.saturating_sub(HISTORY).max(self.began);
                // Indices are the clocks less one; "stopped" 0 is "none stopped".
                let lives = self.lives(reader, now);
                let began = lives
                    .iter()
                    .filter(|l| l.1 >= at)
                    .map(|l| l.0 + 1)
                    .min()
                    .unwrap();
                let stopped = lives
                    .iter()
                    .filter(|l| l.1 + 1 < began && l.0 + 1 + (SPAN as usize) < began)
                    .map(|l| l.1 + 1)
                    .max()
                    .unwrap_or(0);
                let start = lives
                    .iter()
                    .map(|l| l.0)
                    .filter(|b| *b >= oldest && *b + 1 > stopped)
                    .fold(at, usize::min);
                let moved = self.history[start..].to_vec();
                for a in &moved {
                    if a.2 {
                        self.set.remove(&a.0);
                    }
                    self.carried.remove(&a.0);
                }
                self.end(self.set.len() + self.fresh(), total);
                self.began = start;
                self.set.extend(moved.iter().map(|a| a.0));
                self.set.insert(file);
                return (true, Step::Restarted { moved: 0 });
            }
            if recent {
                let own = self
                    .history
                    .iter()
                    .rev()
                    .filter(|a| a.1 == reader)
                    .take(READER_WINDOW)
                    .any(|a| a.0 == file);
                let finishing = self
                    .reader_epoch
                    .get(&reader)
                    .is_some_and(|e| *e < self.epoch);
                let again = self
                    .history
                    .iter()
                    .rev()
                    .find(|a| a.1 == reader)
                    .map(|a| a.0)
                    == Some(file);
                let trailing = again || (finishing && !own);
                *self.carried.entry(file).or_default() |= !trailing;
                if self.set.len() + self.carried.len() >= total {
                    self.end(self.set.len() + self.carried.len(), total);
                    return (false, Step::Completed);
                }
                return (
                    false,
                    if trailing {
                        Step::Trailing
                    } else {
                        Step::Carried
                    },
                );
            }
            self.carried.remove(&file);
            self.set.insert(file);
            if self.set.len() + self.carried.len() >= total {
                self.end(self.set.len() + self.carried.len(), total);
                return (true, Step::Completed);
            }
            (true, Step::First)
        }
    }

    proptest! {
        #[test]
        fn coverage_matches_the_reference(
            accesses in prop::collection::vec((0u32..300, 0u32..5), 0..2000),
            total in prop_oneof![1usize..300, 6000usize..9000],
        ) {
            let mut t = EpochTracker::new(Boundary::Coverage);
            let mut r = Reference { epoch: 1, ..Default::default() };
            for (i, &(f, reader)) in accesses.iter().enumerate() {
                let f = f % total as u32;
                let (got, want) = (t.access(f, reader, Some(total)), r.access(f, reader, total));
                prop_assert_eq!(std::mem::discriminant(&got), std::mem::discriminant(&want), "access {}", i);
                prop_assert_eq!(t.epoch(), r.epoch, "access {}", i);
                prop_assert_eq!(t.read_in_epoch(), r.set.len(), "access {}", i);
                prop_assert_eq!(t.files_in_epoch(), r.set.len() + r.fresh(), "access {}", i);
                prop_assert_eq!(t.last_epoch_files(), r.last_files, "access {}", i);
            }
            prop_assert_eq!(t.last_epoch_files(), r.last_files);
            prop_assert_eq!(t.covered_dataset(), r.covered);
            for f in 0..total as FileId {
                prop_assert_eq!(t.has_read(f), r.set.contains(&f));
                prop_assert_eq!(t.may_have_read(f), r.set.contains(&f) || r.carried.contains_key(&f));
            }
        }

        #[test]
        fn all_read_counts_every_file_once_per_epoch(
            accesses in prop::collection::vec(0u32..40, 0..400),
            total in 1usize..40,
        ) {
            let mut t = EpochTracker::new(Boundary::AllRead);
            let (mut epoch, mut seen) = (1, BTreeSet::new());
            for &f in &accesses {
                let f = f % total as u32;
                t.access(f, 0, Some(total));
                seen.insert(f);
                if seen.len() == total {
                    epoch += 1;
                    seen.clear();
                }
            }
            prop_assert_eq!(t.epoch(), epoch);
            prop_assert_eq!(t.read_in_epoch(), seen.len());
        }

        /// Passes over the whole dataset in fresh orders, each sample opened twice by one of
        /// several workers whose reads interleave: one epoch per pass, every file in it.
        #[test]
        fn double_opens_by_interleaved_workers_give_one_epoch_a_pass(
            seed in any::<u64>(),
            files in 100usize..600,
            workers in 1u32..6,
            passes in 1usize..4,
        ) {
            let mut t = EpochTracker::new(Boundary::Coverage);
            let mut rng = seed;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            for pass in 0..passes {
                let mut order: Vec<FileId> = (0..files as FileId).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, (next() % (i as u64 + 1)) as usize);
                }
                // Worker w takes every workers-th file; each step one random worker opens its
                // next file, or opens its current one a second time.
                let mut queues: Vec<VecDeque<FileId>> = (0..workers)
                    .map(|w| order.iter().copied().skip(w as usize).step_by(workers as usize).collect())
                    .collect();
                let mut pending: Vec<Option<FileId>> = vec![None; workers as usize];
                loop {
                    let busy: Vec<u32> = (0..workers)
                        .filter(|&w| pending[w as usize].is_some() || !queues[w as usize].is_empty())
                        .collect();
                    if busy.is_empty() {
                        break;
                    }
                    let w = busy[(next() % busy.len() as u64) as usize];
                    let reader = 1000 * pass as u32 + w;
                    match pending[w as usize].take() {
                        Some(f) => { t.access(f, reader, Some(files)); }
                        None => {
                            let f = queues[w as usize].pop_front().unwrap();
                            t.access(f, reader, Some(files));
                            pending[w as usize] = Some(f);
                        }
                    }
                }
                prop_assert_eq!(t.epoch(), pass as u64 + 2);
                prop_assert_eq!(t.last_epoch_files(), files);
            }
        }

        /// A job that reads a different random half of the dataset every epoch (a shard of
        /// two): one epoch a pass, each within a few files of the half.
        #[test]
        fn a_shard_job_ends_its_epochs_where_its_passes_do(seed in any::<u64>(), files in 400usize..2000) {
            let mut t = EpochTracker::new(Boundary::Coverage);
            let mut rng = seed | 1;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let half = files / 2;
            for pass in 0..4u64 {
                let mut order: Vec<FileId> = (0..files as FileId).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, (next() % (i as u64 + 1)) as usize);
                }
                for &f in &order[..half] {
                    t.access(f, pass as u32, Some(files));
                }
                if pass > 0 {
                    prop_assert_eq!(t.epoch(), pass + 1);
                    let off = t.last_epoch_files().abs_diff(half);
                    prop_assert!(off <= 20, "epoch {} read {} files of a pass of {}", pass, t.last_epoch_files(), half);
                }
            }
            prop_assert!(!t.covered_dataset());
        }
    }
}
