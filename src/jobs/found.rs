//! The job each process was last found in, for its opens counted after it exited.
//!
//! An open the kernel makes by itself is told to the daemon after the fact (`crate::fs`'s
//! `told/`), and a DataLoader worker whose files were hot may read its share and exit
//! before its last opens are counted; its parent may exit too (the job's last epoch). A
//! process that is gone cannot be looked up, so each process is remembered with the job it
//! was found in while it ran, and its parent with the job of its children (a worker's
//! siblings are its job too, even those never seen alive). A gone process is then placed by
//! its own entry, or its parent's (`forks.rs` names the parent). Without this, the last
//! worker of a job's last epoch became a job of its own, named after its pid.
//!
//! A pid is reused once the kernel's counter wraps: [`Found::forget`] drops a process's entry
//! when a new process of its pid is seen forked. Bounded: [`FOUND_MAX`] processes, the ones
//! seen last, about 50 bytes each.

use lru::LruCache;
use parking_lot::Mutex;

use super::JobKey;

/// Processes remembered at most (about 50 bytes each).
pub const FOUND_MAX: usize = 16_384;

/// How a process's job was learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// Looked up while it ran.
    Itself,
    /// A child of it was: its children's job (a shell's may differ from its own, a
    /// DataLoader main process's does not).
    Children,
}

/// Processes and the jobs they were found in.
#[derive(Debug)]
pub struct Found {
    jobs: Mutex<LruCache<u32, (JobKey, Source)>>,
}

impl Default for Found {
    fn default() -> Self {
        let cap = std::num::NonZeroUsize::new(FOUND_MAX).expect("FOUND_MAX is not zero");
        Found {
            jobs: Mutex::new(LruCache::new(cap)),
        }
    }
}

impl Found {
    /// Running process `pid` is in job `key`; `parent` names its parent if it is known
    /// already (else it is read from `/proc`). Asked only the first time `pid` is seen in `key`:
    /// every later open of the process costs one lookup here.
    pub fn found(&self, pid: u32, key: JobKey, parent: impl FnOnce() -> Option<u32>) {
        let mut jobs = self.jobs.lock();
        if jobs.get(&pid) == Some(&(key, Source::Itself)) {
            return;
        }
        jobs.put(pid, (key, Source::Itself));
        drop(jobs);
        let Some(parent) = parent().or_else(|| parent_of(pid)) else {
            return;
        };
        let mut jobs = self.jobs.lock();
        if jobs
            .peek(&parent)
            .is_none_or(|(_, s)| *s == Source::Children)
        {
            jobs.put(parent, (key, Source::Children));
        }
    }

    /// The job gone process `pid` was found in, or its children were.
    pub fn job(&self, pid: u32) -> Option<JobKey> {
        self.jobs.lock().get(&pid).map(|(key, _)| *key)
    }

    /// A new process has pid `pid`: what was found of the one before is not its.
    pub fn forget(&self, pid: u32) {
        self.jobs.lock().pop(&pid);
    }
}

/// The parent of running process (or thread) `pid`, from `/proc/PID/stat`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.get(stat.rfind(')')? + 1..)?;
    after_name.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parent_is_read_from_proc() {
        assert_eq!(
            parent_of(std::process::id()),
            Some(std::os::unix::process::parent_id())
        );
        assert_eq!(parent_of(0x7fff_fff0), None);
    }

    #[test]
    fn a_process_s_own_job_outranks_its_children_s() {
        let found = Found::default();
        found.found(10, JobKey::Proc { pgid: 5, pid: 11 }, || Some(5));
        assert_eq!(found.job(5), Some(JobKey::Proc { pgid: 5, pid: 11 }));
        found.found(5, JobKey::Pgid(5), || Some(1));
        found.found(12, JobKey::Proc { pgid: 5, pid: 12 }, || Some(5));
        assert_eq!(found.job(5), Some(JobKey::Pgid(5)));
        assert_eq!(found.job(10), Some(JobKey::Proc { pgid: 5, pid: 11 }));
    }

    #[test]
    fn a_reused_pid_is_forgotten_and_the_table_is_bounded() {
        let found = Found::default();
        found.found(7, JobKey::Pgid(7), || Some(1));
        found.forget(7);
        assert_eq!(found.job(7), None);
        for pid in 0..(FOUND_MAX as u32 + 100) {
            found.found(100_000 + pid, JobKey::Pgid(3), || Some(1));
        }
        assert_eq!(found.jobs.lock().len(), FOUND_MAX);
    }
}
