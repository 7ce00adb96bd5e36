//! Who forked whom: the kernel's process events (the netlink proc connector), so that a
//! process that read and exited before the daemon looked it up is still placed in its job.
//!
//! A job is found from the process tree in `/proc` (`tree.rs`). An open the daemon answers is
//! looked up while its process waits, but an open the kernel makes by itself is told after the
//! fact (`crate::fs`'s `told/`): a short-lived reader (`cat` in a loop, a DataLoader worker
//! whose epoch was a few milliseconds) may be gone by then, and with it its `/proc` entry.
//! Its parent usually is not. The proc connector reports every fork as it happens, before the
//! child runs a line of its own; the last [`FORKS_MAX`] are kept (12 bytes each), child to
//! parent, and a gone process is looked up through its parent.
//!
//! A fork also names a new process of a pid used before: what was found of the old one
//! (`found.rs`) is forgotten.
//!
//! Needs `CAP_NET_ADMIN` (the daemon as root); without it, nothing is kept, and a gone process
//! is placed only by what was found of it and its parent while they ran.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use parking_lot::Mutex;

use super::found::Found;

/// Forks remembered at most: at a thousand forks a second, the last minute's.
pub const FORKS_MAX: usize = 65_536;

/// The parents of the processes forked lately.
#[derive(Debug)]
pub struct Forks {
    parents: Mutex<(HashMap<u32, u32>, VecDeque<u32>)>,
    /// What was found of processes, forgotten for a pid forked anew.
    found: Arc<Found>,
}

impl Forks {
    /// No forks seen yet; `found` is the jobs' table of processes, whose reused pids it
    /// forgets.
    pub fn new(found: Arc<Found>) -> Forks {
        Forks {
            parents: Mutex::default(),
            found,
        }
    }

    /// Process (or thread) `child` was forked by process `parent`.
    pub fn forked(&self, child: u32, parent: u32) {
        self.found.forget(child);
        let mut p = self.parents.lock();
        let (map, order) = &mut *p;
        if map.insert(child, parent).is_none() {
            order.push_back(child);
        }
        while order.len() > FORKS_MAX {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }

    /// The process that forked `child`, if the fork was seen.
    pub fn parent(&self, child: u32) -> Option<u32> {
        self.parents.lock().0.get(&child).copied()
    }

    /// Listens to the kernel's fork events on a thread of its own; None (and the reason in
    /// the log, at debug level) if they cannot be had.
    /// As [`Forks::new`].
    pub fn listen(found: Arc<Found>) -> Option<Arc<Forks>> {
        let socket = match subscribe() {
            Ok(socket) => socket,
            Err(e) => {
                tracing::debug!("no process events (proc connector): {e}");
                return None;
            }
        };
        let forks = Arc::new(Forks::new(found));
        let kept = forks.clone();
        let spawned = std::thread::Builder::new()
            .name("coorfs-forks".into())
            .spawn(move || receive(&socket, &kept));
        spawned.ok().map(|_| forks)
    }
}

/// `NETLINK_CONNECTOR`, its process-events index and value, and the listen operation
/// (linux/connector.h, linux/cn_proc.h).
const NETLINK_CONNECTOR: i32 = 11;
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
/// `PROC_EVENT_FORK`.
const PROC_EVENT_FORK: u32 = 1;
/// `struct nlmsghdr` and `struct cn_msg` (its id, seq, ack, len, flags).
const NLMSG_HEADER: usize = 16;
const CN_MSG_HEADER: usize = 20;

/// A netlink socket subscribed to the kernel's process events.
fn subscribe() -> std::io::Result<OwnedFd> {
    // SAFETY: plain system calls with valid arguments; the descriptor is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_CONNECTOR,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket and nothing else owns it.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_nl is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    addr.nl_pid = 0;
    addr.nl_groups = CN_IDX_PROC;
    // SAFETY: `addr` is a sockaddr_nl of the size passed, alive for the call.
    let rc = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut msg = Vec::with_capacity(NLMSG_HEADER + CN_MSG_HEADER + 4);
    let len = (NLMSG_HEADER + CN_MSG_HEADER + 4) as u32;
    msg.extend_from_slice(&len.to_ne_bytes());
    msg.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
    msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
    msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&std::process::id().to_ne_bytes());
    msg.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
    msg.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // ack
    msg.extend_from_slice(&4u16.to_ne_bytes()); // len
    msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
    msg.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
    // SAFETY: `msg` is valid for reads of its length.
    let sent = unsafe { libc::send(socket.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(socket)
}

/// Receives process events for ever, keeping each fork's child and parent.
fn receive(socket: &OwnedFd, forks: &Forks) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::recv(socket.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            // Events came faster than they were taken (ENOBUFS): some forks are not known.
            if e.raw_os_error() == Some(libc::ENOBUFS)
                || e.kind() == std::io::ErrorKind::Interrupted
            {
                continue;
            }
            tracing::debug!("process events: {e}");
            return;
        }
        for (child, parent) in parse_forks(&buf[..n as usize]) {
            forks.forked(child, parent);
        }
    }
}

/// The (child thread, parent process) of each fork event in `buf`, one datagram: netlink
/// messages, each a `cn_msg` holding a `proc_event` (what, cpu, timestamp, then for a fork:
/// parent pid, parent tgid, child pid, child tgid).
fn parse_forks(buf: &[u8]) -> Vec<(u32, u32)> {
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(buf.get(at..at + 4)?.try_into().ok()?))
    };
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(len) = u32_at(at) {
        let len = len as usize;
        if len < NLMSG_HEADER || at + len > buf.len() {
            break;
        }
        let event = at + NLMSG_HEADER + CN_MSG_HEADER;
        if u32_at(event) == Some(PROC_EVENT_FORK) {
            // what (4), cpu (4), timestamp (8), then the fork's four ids.
            let ids = event + 16;
            if let (Some(parent_tgid), Some(child_pid)) = (u32_at(ids + 4), u32_at(ids + 8)) {
                out.push((child_pid, parent_tgid));
            }
        }
        at += (len + 3) & !3;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fork_message(parent: u32, child: u32) -> Vec<u8> {
        let mut m = Vec::new();
        let len = (NLMSG_HEADER + CN_MSG_HEADER + 16 + 16) as u32;
        m.extend_from_slice(&len.to_ne_bytes());
        m.extend_from_slice(&[0; 12]);
        m.extend_from_slice(&[0; CN_MSG_HEADER]);
        m.extend_from_slice(&PROC_EVENT_FORK.to_ne_bytes());
        m.extend_from_slice(&[0; 12]); // cpu, timestamp
        for id in [parent, parent, child, child] {
            m.extend_from_slice(&id.to_ne_bytes());
        }
        m
    }

    #[test]
    fn fork_events_give_child_and_parent_and_the_oldest_are_forgotten() {
        let mut buf = fork_message(10, 11);
        buf.extend(fork_message(11, 12));
        assert_eq!(parse_forks(&buf), vec![(11, 10), (12, 11)]);
        let forks = Forks::new(Arc::default());
        for child in 0..(FORKS_MAX as u32 + 5) {
            forks.forked(child + 100, 1);
        }
        assert_eq!(forks.parent(100), None);
        assert_eq!(forks.parent(105), Some(1));
        assert_eq!(forks.parent(FORKS_MAX as u32 + 104), Some(1));
    }

    #[test]
    fn as_root_a_forked_process_is_seen_with_its_parent() {
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let forks = Forks::listen(Arc::default()).expect("process events as root");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let _ = child.wait_with_output();
        let seen = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            forks.parent(pid) == Some(std::process::id())
        });
        assert!(
            seen,
            "the fork of {pid} by {} was not seen",
            std::process::id()
        );
    }
}
