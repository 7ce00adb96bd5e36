//! Which job a process reads for, from the process tree (`--job-key auto`, the default).
//!
//! A job is a process group, as a shell makes one for every command line: a training script
//! with its DataLoader workers, torchrun with its ranks and their workers, a decoder the
//! script runs per sample. One exception: a script that runs several programs at once (a
//! hyper-parameter sweep that starts its trials in the background, `xargs -P`, GNU
//! `parallel`) is one process group without job control, yet each program it started is a
//! training run of its own. So:
//!
//! - From the reading process (FUSE names the thread that asks: its process), go up through
//!   its parents while they are in its process group. The first *launcher* met (a shell, `coorfs run`, or a wrapper that waits for what
//!   it starts: [`LAUNCHERS`]) that has two or more children running is a *sweep*.
//! - If there is one, the job is the sweep's child on the way up, with everything it started
//!   ([`JobKey::Proc`]). Otherwise, the job is the process group ([`JobKey::Pgid`]).
//!
//! A launcher is recognised by its name (`/proc/PID/comm`) or, for a script run by its `#!`
//! line (named after the script), by its executable (`/proc/PID/exe`), so that a program that starts
//! helpers (torchrun and its ranks, a DataLoader and its workers, a script and its decoder)
//! never splits its own job. A launcher with one child at a time (a loop that runs `cat` per
//! file, a script that runs training and then evaluation) keeps one job; once a launcher was
//! seen with two children running it stays a sweep for its life. What it cannot tell: a
//! sweep launched by a program that is not a launcher (a Python script with `subprocess`)
//! stays one job (use `coorfs run --group`, `--job-key sid` with a session per trial, or
//! `setsid`), and ranks started by hand from a script (`python train.py --rank 0 & ...`)
//! are a job each, each reading its shard. A process may rename itself to look like a
//! launcher: that only changes how its own reads are grouped.
//!
//! The walk reads `/proc/PID/stat` for each process on the way (about 10 us each); [`Tree`]
//! remembers each process's job for [`KEEP_SECS`] and each sweep for its life, in bounded
//! tables.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::JobKey;

/// Programs that start others and wait for them, so that what they start is the work.
pub const LAUNCHERS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "tcsh", "csh", "busybox", "timeout",
    "xargs", "parallel", "time", "sudo", "su", "runuser", "flock", "make",
];

/// Seconds a process's job is reused for before it is looked up again.
pub const KEEP_SECS: f64 = 1.0;
/// Processes (and sweeps) remembered at most; past this a table starts over.
const MAX_ENTRIES: usize = 4096;
/// Parents followed at most (a deeper tree is cut there).
const MAX_DEPTH: usize = 64;

/// What the walk needs of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    pub ppid: u32,
    pub pgid: u32,
    /// Its start time (clock ticks since boot): a pid is reused, a (pid, start) is not.
    pub start: u64,
    /// A launcher ([`LAUNCHERS`], or `coorfs run`).
    pub launcher: bool,
    /// Children running now.
    pub children: usize,
}

/// Where processes are looked up: `/proc` ([`ProcFs`]), or a table in tests.
pub trait Processes {
    fn get(&self, pid: u32) -> Option<Process>;
    /// The process that thread `tid` belongs to (its own id for a process's main thread):
    /// FUSE names the thread that asks.
    fn process_of(&self, tid: u32) -> Option<u32>;
}

/// The job of `pid` by the rule of the module header; `sweeps` holds the launchers (pid,
/// start) seen with two children running, and gains those seen now. None if `pid` is gone.
pub fn job_of_process(
    procs: &impl Processes,
    pid: u32,
    sweeps: &mut HashMap<(u32, u64), ()>,
) -> Option<JobKey> {
    let pid = procs.process_of(pid)?;
    let me = procs.get(pid)?;
    let group = me.pgid;
    let (mut child, mut at) = (pid, me);
    for _ in 0..MAX_DEPTH {
        if child == group {
            break;
        }
        let Some(parent) = procs.get(at.ppid) else {
            break;
        };
        if parent.pgid != group {
            break;
        }
        if parent.launcher {
            let id = (at.ppid, parent.start);
            if sweeps.contains_key(&id) || parent.children >= 2 {
                if sweeps.len() >= MAX_ENTRIES {
                    sweeps.clear();
                }
                sweeps.insert(id, ());
                return Some(JobKey::Proc {
                    pgid: group,
                    pid: child,
                });
            }
        }
        (child, at) = (at.ppid, parent);
    }
    Some(JobKey::Pgid(group))
}

/// The processes of this machine, from `/proc`.
#[derive(Debug, Default)]
pub struct ProcFs;

impl Processes for ProcFs {
    fn get(&self, pid: u32) -> Option<Process> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (comm, ppid, pgid, start) = parse_stat(&stat)?;
        let launcher = LAUNCHERS.contains(&comm)
            || (comm == "coorfs" && is_coorfs_run(pid))
            || runs_a_launcher(pid);
        let children = match launcher {
            true => std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .map(|c| c.split_whitespace().count())
                .unwrap_or(0),
            false => 0,
        };
        Some(Process {
            ppid,
            pgid,
            start,
            launcher,
            children,
        })
    }

    fn process_of(&self, tid: u32) -> Option<u32> {
        let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("Tgid:"))?;
        line["Tgid:".len()..].trim().parse().ok()
    }
}

/// The name, parent, process group and start time in a `/proc/PID/stat` line. The name is
/// between the first `(` and the last `)`: it may hold spaces and parentheses.
fn parse_stat(stat: &str) -> Option<(&str, u32, u32, u64)> {
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let comm = stat.get(open + 1..close)?;
    // After the name: state, ppid, pgrp, session, tty_nr, tpgid, flags, minflt, cminflt,
    // majflt, cmajflt, utime, stime, cutime, cstime, priority, nice, num_threads,
    // itrealvalue, starttime.
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    let ppid = fields.get(1)?.parse().ok()?;
    let pgid = fields.get(2)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((comm, ppid, pgid, start))
}

/// True if process `pid` runs a launcher's executable under another name: a script run by its
/// `#!` line (`./sweep.sh`) is named after the script, and its executable is the shell.
fn runs_a_launcher(pid: u32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|exe| Some(LAUNCHERS.contains(&exe.file_name()?.to_str()?)))
        .unwrap_or(false)
}

/// True if process `pid` runs `coorfs run`.
fn is_coorfs_run(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .is_some_and(|c| c.split(|b| *b == 0).nth(1) == Some(b"run"))
}

/// Jobs of processes, remembered for a moment, and the sweeps seen.
#[derive(Debug, Default)]
pub struct Tree {
    inner: Mutex<TreeInner>,
}

#[derive(Debug, Default)]
struct TreeInner {
    /// pid -> its job, and when it was looked up.
    jobs: HashMap<u32, (JobKey, f64)>,
    sweeps: HashMap<(u32, u64), ()>,
}

impl Tree {
    /// The job of process `pid` at `now` (seconds), if it still runs.
    pub fn job(&self, procs: &impl Processes, pid: u32, now: f64) -> Option<JobKey> {
        let mut inner = self.inner.lock();
        if let Some((key, at)) = inner.jobs.get(&pid)
            && now - at < KEEP_SECS
        {
            return Some(*key);
        }
        let key = job_of_process(procs, pid, &mut inner.sweeps)?;
        if inner.jobs.len() >= MAX_ENTRIES {
            inner.jobs.clear();
        }
        inner.jobs.insert(pid, (key, now));
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process table: pid -> (name, ppid, pgid). A thread id is its process's id + 1000.
    struct Table(Vec<(u32, &'static str, u32, u32)>);

    impl Processes for Table {
        fn get(&self, pid: u32) -> Option<Process> {
            let &(_, name, ppid, pgid) = self.0.iter().find(|p| p.0 == pid)?;
            Some(Process {
                ppid,
                pgid,
                start: u64::from(pid) * 7,
                launcher: LAUNCHERS.contains(&name),
                children: self.0.iter().filter(|p| p.2 == pid).count(),
            })
        }

        fn process_of(&self, tid: u32) -> Option<u32> {
            let pid = tid % 1000;
            self.0.iter().any(|p| p.0 == pid).then_some(pid)
        }
    }

    fn job(t: &Table, pid: u32) -> JobKey {
        job_of_process(t, pid, &mut HashMap::new()).unwrap()
    }

    #[test]
    fn a_script_and_its_workers_are_its_process_group() {
        // An interactive shell (its own group), python train.py (leader of 10), 2 workers.
        let t = Table(vec![
            (1, "bash", 0, 1),
            (10, "python3", 1, 10),
            (11, "python3", 10, 10),
            (12, "python3", 10, 10),
        ]);
        for pid in [10, 11, 12] {
            assert_eq!(job(&t, pid), JobKey::Pgid(10));
        }
    }

    #[test]
    fn torchrun_ranks_and_their_workers_are_one_job() {
        let t = Table(vec![
            (1, "bash", 0, 1),
            (10, "torchrun", 1, 10),
            (20, "python3", 10, 10),
            (21, "python3", 20, 10),
            (30, "python3", 10, 10),
            (31, "python3", 30, 10),
        ]);
        for pid in [20, 21, 30, 31] {
            assert_eq!(job(&t, pid), JobKey::Pgid(10));
        }
        // The same run started by a script (a launcher with one child) is one job too.
        let t = Table(vec![
            (5, "bash", 1, 5),
            (10, "torchrun", 5, 5),
            (20, "python3", 10, 5),
            (30, "python3", 10, 5),
        ]);
        assert_eq!(job(&t, 20), JobKey::Pgid(5));
        assert_eq!(job(&t, 30), JobKey::Pgid(5));
    }

    #[test]
    fn trials_started_together_by_a_script_are_a_job_each() {
        // bash sweep.sh runs 3 trials in the background; trial 30 has 2 workers, trial 40
        // runs under `timeout`, and trial 50 is a torchrun with 2 ranks.
        let t = Table(vec![
            (5, "bash", 1, 5),
            (30, "python3", 5, 5),
            (31, "python3", 30, 5),
            (32, "python3", 30, 5),
            (40, "timeout", 5, 5),
            (41, "python3", 40, 5),
            (50, "torchrun", 5, 5),
            (51, "python3", 50, 5),
            (52, "python3", 50, 5),
        ]);
        let trial = |pid| JobKey::Proc { pgid: 5, pid };
        assert_eq!(job(&t, 31), trial(30));
        assert_eq!(job(&t, 32), trial(30));
        assert_eq!(job(&t, 30), trial(30));
        // A thread of the trial (FUSE names the thread that asks) reads for the trial.
        assert_eq!(job(&t, 1030), trial(30));
        // timeout has one child: the sweep above it decides.
        assert_eq!(job(&t, 41), trial(40));
        assert_eq!(job(&t, 51), trial(50));
        assert_eq!(job(&t, 52), trial(50));
        // A trial in a group of its own (started with setsid) is its group.
        let t = Table(vec![
            (5, "bash", 1, 5),
            (30, "python3", 5, 30),
            (31, "python3", 30, 30),
        ]);
        assert_eq!(job(&t, 31), JobKey::Pgid(30));
    }

    #[test]
    fn a_sweep_stays_one_once_seen_and_a_loop_of_one_child_never_is() {
        // A loop that runs one reader at a time.
        let t = Table(vec![(5, "bash", 1, 5), (30, "cat", 5, 5)]);
        let mut sweeps = HashMap::new();
        assert_eq!(job_of_process(&t, 30, &mut sweeps), Some(JobKey::Pgid(5)));
        assert!(sweeps.is_empty());
        // Two trials: a sweep; the last trial left alone is still its own job.
        let both = Table(vec![
            (5, "bash", 1, 5),
            (30, "python3", 5, 5),
            (40, "python3", 5, 5),
        ]);
        assert_eq!(
            job_of_process(&both, 30, &mut sweeps),
            Some(JobKey::Proc { pgid: 5, pid: 30 })
        );
        let alone = Table(vec![(5, "bash", 1, 5), (40, "python3", 5, 5)]);
        assert_eq!(
            job_of_process(&alone, 40, &mut sweeps),
            Some(JobKey::Proc { pgid: 5, pid: 40 })
        );
        // A process that is gone has no job.
        assert_eq!(job_of_process(&alone, 99, &mut sweeps), None);
    }

    #[test]
    fn stat_lines_parse_whatever_the_name() {
        let line = "4242 (a) b (c) S 17 4200 4200 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 1000 100 18446744073709551615";
        assert_eq!(parse_stat(line), Some(("a) b (c", 17, 4200, 987654)));
        assert_eq!(parse_stat("4242 (x"), None);
        // This process, for real.
        let me = ProcFs.get(std::process::id()).unwrap();
        // SAFETY: reads our own process group.
        assert_eq!(me.pgid, unsafe { libc::getpgid(0) } as u32);
        assert_eq!(me.ppid, std::os::unix::process::parent_id());
        assert_eq!(
            ProcFs.process_of(std::process::id()),
            Some(std::process::id())
        );
        // A live thread of this process: an id of its own, and this process's.
        let (send, recv) = std::sync::mpsc::channel();
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            send.send(unsafe { libc::gettid() } as u32).unwrap();
            wait.recv().ok();
        });
        let tid = recv.recv().unwrap();
        let thread = ProcFs.process_of(tid);
        done.send(()).unwrap();
        t.join().unwrap();
        assert_ne!(tid, std::process::id());
        assert_eq!(thread, Some(std::process::id()));
    }
}
