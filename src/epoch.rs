//! Epoch tracking: which files a reader has read in its current epoch, and where an epoch
//! ends. Pure: no clock, no I/O; the dataset's file count is passed in.
//!
//! A training job reads every file of the dataset once per epoch. An epoch ends when every
//! file has been read ([`Boundary::AllRead`]); for one job it also ends when it reads a file
//! again ([`Boundary::AllReadOrRepeat`]: the job moved on before reading everything, e.g. a
//! sampler over a subset, or `drop_last`). The dataset-wide view uses `AllRead` only, since
//! several jobs reading at once repeat each other's files all the time.
//!
//! The set of files read is a bitmap over the dense file ids of the namespace: one bit a
//! file, 160 KiB for ImageNet's 1.28 million files.

use crate::namespace::FileId;

/// Where an epoch ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boundary {
    /// When every file of the dataset has been read.
    AllRead,
    /// When every file has been read, or a file is read a second time.
    AllReadOrRepeat,
}

/// What an access did to the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The first read of this file in the current epoch.
    First,
    /// The file was read before in this epoch (`AllRead` only).
    Repeat,
    /// The first read of the file in the current epoch, and the last file of it: the epoch
    /// is complete, and the next access belongs to the next one.
    Completed,
    /// The file was read before in this epoch (`AllReadOrRepeat`): this access begins a new
    /// epoch.
    Restarted,
}

/// The epoch state of one reader (a job, or the whole dataset).
#[derive(Clone, Debug)]
pub struct EpochTracker {
    rule: Boundary,
    seen: Vec<u64>,
    count: usize,
    epoch: u64,
}

impl EpochTracker {
    /// A tracker at the start of epoch 1.
    pub fn new(rule: Boundary) -> Self {
        EpochTracker {
            rule,
            seen: Vec::new(),
            count: 0,
            epoch: 1,
        }
    }

    /// The current epoch (1-based).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Files read in the current epoch.
    pub fn read_in_epoch(&self) -> usize {
        self.count
    }

    /// True if `file` was read in the current epoch.
    pub fn has_read(&self, file: FileId) -> bool {
        let (word, bit) = (file as usize / 64, file % 64);
        self.seen.get(word).is_some_and(|w| w & (1 << bit) != 0)
    }

    fn mark(&mut self, file: FileId) {
        let (word, bit) = (file as usize / 64, file % 64);
        if word >= self.seen.len() {
            self.seen.resize(word + 1, 0);
        }
        self.seen[word] |= 1 << bit;
        self.count += 1;
    }

    fn next_epoch(&mut self) {
        self.epoch += 1;
        self.seen.iter_mut().for_each(|w| *w = 0);
        self.count = 0;
    }

    /// Records a read of `file`. `total` is the number of files in the dataset, if known
    /// (until it is, an epoch cannot complete by reading everything).
    pub fn access(&mut self, file: FileId, total: Option<usize>) -> Step {
        if self.has_read(file) {
            return match self.rule {
                Boundary::AllRead => Step::Repeat,
                Boundary::AllReadOrRepeat => {
                    self.next_epoch();
                    self.mark(file);
                    self.finish_if_complete(total, Step::Restarted)
                }
            };
        }
        self.mark(file);
        self.finish_if_complete(total, Step::First)
    }

    fn finish_if_complete(&mut self, total: Option<usize>, otherwise: Step) -> Step {
        match total {
            Some(total) if total > 0 && self.count >= total => {
                self.next_epoch();
                Step::Completed
            }
            _ => otherwise,
        }
    }

    /// The files of `0..total` not read yet in the current epoch, in id order.
    pub fn remaining(&self, total: usize) -> impl Iterator<Item = FileId> + '_ {
        (0..total as FileId).filter(move |f| !self.has_read(*f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    #[allow(clippy::type_complexity)]
    fn table_of_steps() {
        use Step::*;
        // (rule, accesses, total, expected steps, expected epoch after)
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
            (
                Boundary::AllReadOrRepeat,
                &[0, 1, 0, 1, 2],
                Some(3),
                &[First, First, Restarted, First, Completed],
                3,
            ),
            (
                Boundary::AllReadOrRepeat,
                &[2, 1, 0, 0, 1, 2],
                Some(3),
                &[First, First, Completed, First, First, Completed],
                3,
            ),
            (
                Boundary::AllReadOrRepeat,
                &[5, 5],
                Some(10),
                &[First, Restarted],
                2,
            ),
            (Boundary::AllRead, &[0], Some(1), &[Completed], 2),
        ];
        for (rule, accesses, total, want, epoch) in cases {
            let mut t = EpochTracker::new(*rule);
            let got: Vec<Step> = accesses.iter().map(|f| t.access(*f, *total)).collect();
            assert_eq!(&got, want, "{rule:?} {accesses:?}");
            assert_eq!(t.epoch(), *epoch, "{rule:?} {accesses:?}");
        }
    }

    #[test]
    fn remaining_lists_unread_files() {
        let mut t = EpochTracker::new(Boundary::AllRead);
        t.access(1, Some(5));
        t.access(3, Some(5));
        assert_eq!(t.remaining(5).collect::<Vec<_>>(), vec![0, 2, 4]);
        assert_eq!(t.read_in_epoch(), 2);
    }

    /// A reference: a set of files and an epoch counter, written the obvious way.
    fn reference(
        rule: Boundary,
        accesses: &[FileId],
        total: usize,
    ) -> (u64, std::collections::BTreeSet<FileId>) {
        let mut epoch = 1;
        let mut seen = std::collections::BTreeSet::new();
        for &f in accesses {
            if seen.contains(&f) && rule == Boundary::AllReadOrRepeat {
                epoch += 1;
                seen.clear();
            }
            seen.insert(f);
            if seen.len() == total {
                epoch += 1;
                seen.clear();
            }
        }
        (epoch, seen)
    }

    proptest! {
        #[test]
        fn matches_the_reference(accesses in prop::collection::vec(0u32..40, 0..400), total in 1usize..40, repeat in any::<bool>()) {
            let accesses: Vec<FileId> = accesses.into_iter().map(|f| f % total as u32).collect();
            let rule = if repeat { Boundary::AllReadOrRepeat } else { Boundary::AllRead };
            let mut t = EpochTracker::new(rule);
            for &f in &accesses {
                t.access(f, Some(total));
            }
            let (epoch, seen) = reference(rule, &accesses, total);
            prop_assert_eq!(t.epoch(), epoch);
            prop_assert_eq!(t.read_in_epoch(), seen.len());
            for f in 0..total as FileId {
                prop_assert_eq!(t.has_read(f), seen.contains(&f));
            }
        }
    }
}
