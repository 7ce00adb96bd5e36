//! The credentials of the processes that ask: uid and gid from the request, supplementary
//! groups from `/proc/PID/status` ([`Creds::of_process`]).
//!
//! Reading a process's status costs some 10-20 us, against an open that costs about 80 us
//! of round trip: so a process's credentials are kept for [`KEEP_SECS`] and looked up again
//! after that (a process may drop groups; a pid may be reused). The table is bounded: past
//! [`MAX_PROCESSES`] entries it starts over. Requests of root (uid 0) need none of this: the
//! daemon acts as itself for them.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::Caller;
use crate::source::Creds;

/// Seconds a process's credentials are reused for.
const KEEP_SECS: f64 = 1.0;
/// Processes remembered at most: a few hundred bytes each, so at most about a MiB.
const MAX_PROCESSES: usize = 4096;

/// Recently seen callers' credentials, by pid.
#[derive(Debug, Default)]
pub struct CallerCreds {
    table: Mutex<HashMap<u32, (Creds, f64)>>,
}

impl CallerCreds {
    /// The credentials of `caller`; `now` is the daemon's clock in seconds.
    pub fn get(&self, caller: Caller, now: f64) -> Creds {
        if caller.uid == 0 {
            return Creds::DAEMON;
        }
        if let Some((creds, at)) = self.table.lock().get(&caller.pid)
            && now - at < KEEP_SECS
            && creds.uid == caller.uid
            && creds.gid == caller.gid
        {
            return creds.clone();
        }
        let creds = Creds::of_process(caller.pid, caller.uid, caller.gid);
        let mut table = self.table.lock();
        if table.len() >= MAX_PROCESSES {
            table.clear();
        }
        table.insert(caller.pid, (creds.clone(), now));
        creds
    }
}
