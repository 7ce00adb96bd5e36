//! Acting as the user who asked: per-thread file-system credentials.
//!
//! The daemon runs as root and serves every user of an `--allow-other` mount. The kernel
//! checks a caller's permissions against the attributes coorfs reported (`default_permissions`),
//! but those may be a day old (`--metadata-ttl`): a `chmod 000` or `chmod 700` on the source
//! after the kernel cached them would go unnoticed. So the source operations that hand a user
//! something (opening a file, listing a directory, looking up a name, naming a file in an order
//! hint) run with the caller's credentials: the thread's file-system uid and gid
//! (`setfsuid`/`setfsgid`) and supplementary groups are the caller's for the duration of the
//! call. The source's own filesystem then applies modes, ACLs and directory search permission,
//! live, exactly as for a local process.
//!
//! Why per thread and not `seteuid`: the file-system ids and (through the raw system call,
//! which glibc would otherwise broadcast to every thread) the supplementary groups are
//! per-thread in Linux, so the FUSE threads serving other users at the same moment keep
//! theirs. A thread's effective file capabilities (`CAP_DAC_OVERRIDE` and the like) drop
//! while its fsuid is not 0 and come back when it is 0 again.
//!
//! A caller's groups come from `/proc/PID/status` (a FUSE request carries only pid, uid and
//! gid); a process whose status cannot be read (gone, or in a pid namespace the daemon cannot
//! see, where the kernel reports pid 0) gets its primary group alone: fewer rights, never more.
//! If the daemon is not root it cannot switch, and acts with its own rights.

use std::io;
use std::sync::OnceLock;

use rustix::process::Gid;

/// The credentials a source operation runs with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Creds {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Creds {
    /// The daemon's own credentials: no switch.
    pub const DAEMON: Creds = Creds {
        uid: 0,
        gid: 0,
        groups: Vec::new(),
    };

    /// True if operations as these credentials run with the daemon's own.
    pub fn is_daemon(&self) -> bool {
        self.uid == 0
    }

    /// The credentials of process `pid`, which a request says runs as `uid`/`gid`.
    pub fn of_process(pid: u32, uid: u32, gid: u32) -> Creds {
        let groups = if pid == 0 {
            Vec::new()
        } else {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|status| groups_of_status(&status, uid))
                .unwrap_or_default()
        };
        Creds { uid, gid, groups }
    }
}

/// The `Groups:` line of a `/proc/PID/status`, if the status is of a process running as
/// `uid` (a pid reused by another user's process since the request must not lend its groups).
fn groups_of_status(status: &str, uid: u32) -> Option<Vec<u32>> {
    let mut groups = None;
    let mut uid_ok = false;
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix("Uid:") {
            // Real, effective, saved, file-system: the kernel checked the request's fsuid.
            uid_ok = rest.split_whitespace().nth(3) == Some(uid.to_string().as_str());
        } else if let Some(rest) = line.strip_prefix("Groups:") {
            groups = Some(
                rest.split_whitespace()
                    .filter_map(|g| g.parse().ok())
                    .collect(),
            );
        }
    }
    groups.filter(|_| uid_ok)
}

/// True if this process may take other users' credentials (it runs as root).
fn can_switch() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| rustix::process::geteuid().is_root())
}

/// The daemon's own supplementary groups, restored after each switch.
fn own_groups() -> &'static [Gid] {
    static GROUPS: OnceLock<Vec<Gid>> = OnceLock::new();
    GROUPS.get_or_init(|| rustix::process::getgroups().unwrap_or_default())
}

/// Runs `f` on this thread with `who`'s file-system credentials, then restores the
/// daemon's. With the daemon's own credentials (or a daemon that is not root) `f` just runs.
pub fn as_user<T, E: From<io::Error>>(
    who: &Creds,
    f: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    if who.is_daemon() || !can_switch() {
        return f();
    }
    let _switched = Switched::to(who)?;
    f()
}

/// While alive, this thread's file-system credentials are a user's.
struct Switched;

impl Switched {
    fn to(who: &Creds) -> io::Result<Switched> {
        let _ = own_groups();
        let groups: Vec<Gid> = who.groups.iter().map(|g| Gid::from_raw(*g)).collect();
        // Groups and gid first: changing them needs CAP_SETGID, which the thread keeps only
        // while its fsuid is 0.
        rustix::thread::set_thread_groups(&groups)?;
        let guard = Switched;
        // SAFETY: setfsgid/setfsuid change only this thread's file-system ids; they take any
        // value and return the previous one.
        unsafe {
            libc::setfsgid(who.gid);
            libc::setfsuid(who.uid);
        }
        // setfsuid reports no error: read the ids back (an invalid id leaves them unchanged).
        // SAFETY: as above; -1 is never a valid id, so these calls only query.
        let (uid, gid) = unsafe { (libc::setfsuid(u32::MAX), libc::setfsgid(u32::MAX)) };
        if uid as u32 != who.uid || gid as u32 != who.gid {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        Ok(guard)
    }
}

impl Drop for Switched {
    fn drop(&mut self) {
        // SAFETY: as in `to`; uid first, which gives the thread its capabilities back.
        let (uid, gid) = unsafe {
            libc::setfsuid(0);
            libc::setfsgid(0);
            (libc::setfsuid(u32::MAX), libc::setfsgid(u32::MAX))
        };
        let groups = rustix::thread::set_thread_groups(own_groups());
        if uid != 0 || gid != 0 || groups.is_err() {
            // A FUSE thread left with a user's credentials would serve the next request
            // with them: end the daemon rather than risk it.
            tracing::error!("could not restore the daemon's credentials; exiting");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_come_from_the_status_of_a_process_of_that_user() {
        let status = "Name:\tpython\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t100\n\
                      Groups:\t27 100 998 \n";
        assert_eq!(groups_of_status(status, 1000), Some(vec![27, 100, 998]));
        assert_eq!(
            groups_of_status(status, 1001),
            None,
            "pid reused by another user"
        );
        let none = "Uid:\t5\t5\t5\t5\nGroups:\t\n";
        assert_eq!(groups_of_status(none, 5), Some(vec![]));
    }

    #[test]
    fn switching_changes_what_the_thread_may_open_and_restores_it() {
        if !can_switch() {
            return; // the tests run as root in CI; nothing to switch otherwise
        }
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let nobody = Creds {
            uid: 65534,
            gid: 65534,
            groups: vec![],
        };
        let err = as_user(&nobody, || std::fs::read(&secret)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        // Back to root: the same thread reads it again.
        assert_eq!(std::fs::read(&secret).unwrap(), b"x");
        // A group the user is in opens a group-readable file.
        use std::os::unix::fs::chown;
        chown(&secret, Some(0), Some(4242)).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).unwrap();
        let member = Creds {
            groups: vec![4242],
            ..nobody.clone()
        };
        assert_eq!(as_user(&member, || std::fs::read(&secret)).unwrap(), b"x");
        assert!(as_user(&nobody, || std::fs::read(&secret)).is_err());
    }
}
