//! The mount's control socket: order hints without opening a file.
//!
//! Where the kernel opens files itself (`told/`) an open of the order file never reaches the
//! daemon, so a hint would have to be keyed by its process (`order.rs` does that, for
//! compatibility). The control socket is the direct way: `coorfs hint`, `coorfs read --hint`,
//! `coorfs run`'s hook and the Python package connect, send the hint's text (paths, one a line)
//! and shut their side down; the daemon answers one line, `0` or `ERRNO message`, the verdict
//! an order file's commit gives.
//!
//! The socket is an abstract unix socket named after the mount's device number
//! ([`control_name`]): no file to create, secure or clean up, and reachable from every process
//! in the daemon's network namespace that can `stat` the mount (a container in a namespace of
//! its own uses the order file). The daemon acts for its client as for an ioctl of the order
//! file: as the peer's uid and gid (`SO_PEERCRED`), names only files that user may read, in
//! the job of the peer's pid, charged to that user's share of `--hint-memory`. A client checks
//! that the socket's owner is the mount's daemon (its pid, `user.coorfs.pid`), so that another
//! user cannot squat the name and collect hints.
//!
//! Bounded: [`MAX_CLIENTS`] connections at a time, [`MAX_USER_CLIENTS`] per user, each read
//! given [`READ_TIMEOUT`]; past them a client is refused at once.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::{Caller, DatasetFs, FsError};

/// Connections served at once, in all.
pub const MAX_CLIENTS: usize = 16;
/// Connections served at once for one user.
pub const MAX_USER_CLIENTS: usize = 4;
/// How long a read of a client may wait: a client that stalls loses its connection.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The abstract name of the control socket of the mount whose root has device number `dev`.
pub fn control_name(dev: u64) -> String {
    format!("coorfs-control-{dev:x}")
}

/// The clients being served, by uid.
#[derive(Debug, Default)]
struct Clients(Mutex<Vec<u32>>);

impl Clients {
    fn admit(&self, uid: u32) -> bool {
        let mut c = self.0.lock();
        let mine = c.iter().filter(|u| **u == uid).count();
        if c.len() >= MAX_CLIENTS || mine >= MAX_USER_CLIENTS {
            return false;
        }
        c.push(uid);
        true
    }

    fn leave(&self, uid: u32) {
        let mut c = self.0.lock();
        if let Some(at) = c.iter().position(|u| *u == uid) {
            c.swap_remove(at);
        }
    }
}

impl DatasetFs {
    /// Listens on the control socket of the mount whose root has device number `dev`, on a
    /// thread of its own.
    pub fn serve_control(self: &Arc<Self>, dev: u64) -> std::io::Result<()> {
        let addr = SocketAddr::from_abstract_name(control_name(dev).as_bytes())?;
        let listener = UnixListener::bind_addr(&addr)?;
        let fs = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("coorfs-control".into())
            .spawn(move || accept(listener, fs))?;
        Ok(())
    }
}

fn accept(listener: UnixListener, fs: Weak<DatasetFs>) {
    let clients = Arc::new(Clients::default());
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let Some(fs) = fs.upgrade() else { return };
        let Ok(peer) = rustix::net::sockopt::socket_peercred(stream.as_fd()) else {
            continue;
        };
        let caller = Caller {
            pid: peer.pid.as_raw_nonzero().get() as u32,
            uid: peer.uid.as_raw(),
            gid: peer.gid.as_raw(),
        };
        if !clients.admit(caller.uid) {
            let _ = reply(&stream, Err(FsError::Busy));
            continue;
        }
        let clients = clients.clone();
        let spawned = std::thread::Builder::new()
            .name("coorfs-control".into())
            .spawn(move || {
                let verdict = judge(&fs, &stream, caller);
                // The slot is free before the client hears the verdict: a client that sends
                // its next hint as soon as it has this one's answer is never refused for the
                // one it finished (under load, sends in a row met EBUSY: the handlers had
                // answered and not yet left).
                clients.leave(caller.uid);
                let _ = reply(&stream, verdict);
            });
        if let Err(e) = spawned {
            tracing::warn!("control socket: no thread for a client: {e}");
        }
    }
}

/// One client's hint, read and judged.
fn judge(fs: &DatasetFs, stream: &UnixStream, caller: Caller) -> Result<(), FsError> {
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let mut text = stream;
    fs.hint_from(caller, &mut text)
}

fn reply(mut stream: &UnixStream, verdict: Result<(), FsError>) -> std::io::Result<()> {
    let line = match verdict {
        Ok(()) => "0\n".to_string(),
        Err(e) => {
            let errno = e.errno();
            format!("{errno} {e}\n")
        }
    };
    stream.write_all(line.as_bytes())?;
    stream.shutdown(std::net::Shutdown::Both)
}

/// Sends hint `text` to the control socket of the mount at `mount`, whose daemon is `pid`:
/// `None` if the mount has no control socket this process can reach (then the order file is
/// the way), else the daemon's verdict.
pub fn send(mount: &std::path::Path, pid: u32, text: &[u8]) -> Option<std::io::Result<()>> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(mount).ok()?.dev();
    let addr = SocketAddr::from_abstract_name(control_name(dev).as_bytes()).ok()?;
    let mut stream = UnixStream::connect_addr(&addr).ok()?;
    // Only the mount's daemon may take the hint.
    let peer = rustix::net::sockopt::socket_peercred(stream.as_fd()).ok()?;
    if peer.pid.as_raw_nonzero().get() as u32 != pid {
        return None;
    }
    // A hint the daemon refuses part way (too large) ends its reading: the write then fails,
    // and the verdict is still there to read, though the read after it may fail too (the
    // daemon closed with the rest of the hint unread: ECONNRESET once the verdict is read).
    let sent = stream
        .write_all(text)
        .and_then(|()| stream.shutdown(std::net::Shutdown::Write));
    let mut answer = String::new();
    let read = stream.read_to_string(&mut answer);
    if !answer.ends_with('\n')
        && let Err(e) = read.and(sent)
    {
        return Some(Err(e));
    }
    let errno = answer
        .split_whitespace()
        .next()
        .and_then(|e| e.parse::<i32>().ok());
    Some(match errno {
        Some(0) => Ok(()),
        // The errno an order file's commit gives (the daemon's log says why).
        Some(errno) => Err(std::io::Error::from_raw_os_error(errno)),
        None => Err(std::io::Error::other(format!(
            "the mount's control socket answered {answer:?}"
        ))),
    })
}
