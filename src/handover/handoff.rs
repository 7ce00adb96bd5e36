//! Descriptors passed between processes over unix sockets (`SCM_RIGHTS`), with a line of text.
//!
//! The keeper hands each daemon it starts the mount's `/dev/fuse` descriptor and the state
//! regions this way ([`Handoff`]); `coorfs restart` and `coorfs mount` over a live mount
//! hand the keeper the binary to run next. A message is one datagram of a seqpacket socket:
//! a short text and at most [`MAX_FDS`] descriptors, which arrive close-on-exec.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// Descriptors one message carries at most.
pub const MAX_FDS: usize = 8;
/// Bytes of text one message carries at most.
const MAX_TEXT: usize = 4096;

/// Sends `text` and `fds` as one message on `socket`.
pub fn send(socket: BorrowedFd<'_>, text: &str, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    assert!(fds.len() <= MAX_FDS && text.len() <= MAX_TEXT);
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("descriptors do not fit the message"));
    }
    let iov = [IoSlice::new(text.as_bytes())];
    rustix::net::sendmsg(socket, &iov, &mut control, SendFlags::NOSIGNAL)?;
    Ok(())
}

/// Receives one message from `socket`: its text and descriptors. End of stream (the peer
/// closed its end) is `UnexpectedEof`.
pub fn recv(socket: BorrowedFd<'_>) -> io::Result<(String, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut buf = vec![0u8; MAX_TEXT];
    let got = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match rustix::net::recvmsg(socket, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(got) => break got,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = msg {
            fds.extend(rights);
        }
    }
    if got.bytes == 0 && fds.is_empty() {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let text = String::from_utf8_lossy(&buf[..got.bytes]).into_owned();
    Ok((text, fds))
}

/// A connected pair of seqpacket sockets, close-on-exec.
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    Ok(rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// What the keeper hands a daemon: the mount's connection, the state regions, the memory the
/// cache lives in (its arena's memory file, the journal of its index, the tmpfs of the files
/// the kernel reads, if one could be made), and for the first daemon, where the waiting
/// `coorfs mount` hears that the mount is ready.
#[derive(Debug)]
pub struct Handoff {
    pub fuse: OwnedFd,
    pub meta: OwnedFd,
    pub nodes: OwnedFd,
    pub handles: OwnedFd,
    pub arena: OwnedFd,
    pub cache_index: OwnedFd,
    pub tmpfs: Option<OwnedFd>,
    pub ready: Option<OwnedFd>,
}

/// The text of a handoff: this, then " tmpfs" and " ready" for the optional descriptors sent.
const HANDOFF: &str = "coorfs-handoff 1";

impl Handoff {
    pub fn send(&self, socket: BorrowedFd<'_>) -> io::Result<()> {
        let mut fds = vec![
            self.fuse.as_fd(),
            self.meta.as_fd(),
            self.nodes.as_fd(),
            self.handles.as_fd(),
            self.arena.as_fd(),
            self.cache_index.as_fd(),
        ];
        let mut text = HANDOFF.to_string();
        if let Some(tmpfs) = &self.tmpfs {
            fds.push(tmpfs.as_fd());
            text.push_str(" tmpfs");
        }
        if let Some(ready) = &self.ready {
            fds.push(ready.as_fd());
            text.push_str(" ready");
        }
        send(socket, &text, &fds)
    }

    pub fn recv(socket: BorrowedFd<'_>) -> io::Result<Handoff> {
        let (text, fds) = recv(socket)?;
        let refuse = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "not a handoff from a coorfs keeper: {text:?}, {} descriptors",
                    fds.len()
                ),
            )
        };
        let optional: Vec<&str> = match text.strip_prefix(HANDOFF) {
            Some(rest) => rest.split_whitespace().collect(),
            None => return Err(refuse()),
        };
        let (tmpfs, ready) = (optional.contains(&"tmpfs"), optional.contains(&"ready"));
        if optional.iter().any(|o| !["tmpfs", "ready"].contains(o))
            || fds.len() != 6 + usize::from(tmpfs) + usize::from(ready)
        {
            return Err(refuse());
        }
        let mut fds = fds.into_iter();
        let mut next = || fds.next().unwrap();
        Ok(Handoff {
            fuse: next(),
            meta: next(),
            nodes: next(),
            handles: next(),
            arena: next(),
            cache_index: next(),
            tmpfs: tmpfs.then(&mut next),
            ready: ready.then(next),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn descriptors_and_text_arrive_together() {
        let (a, b) = pair().unwrap();
        let (r, w) = std::io::pipe().unwrap();
        send(a.as_fd(), "hello", &[w.as_fd()]).unwrap();
        drop(w);
        let (text, mut fds) = recv(b.as_fd()).unwrap();
        assert_eq!(text, "hello");
        assert_eq!(fds.len(), 1);
        let mut w = std::fs::File::from(fds.pop().unwrap());
        w.write_all(b"through").unwrap();
        drop(w);
        let mut got = String::new();
        let mut r = r;
        r.read_to_string(&mut got).unwrap();
        assert_eq!(got, "through");
        drop(a);
        assert_eq!(
            recv(b.as_fd()).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn a_message_that_is_not_a_handoff_is_refused() {
        let (a, b) = pair().unwrap();
        send(a.as_fd(), "coorfs-handoff 2", &[a.as_fd(); 6]).unwrap();
        let e = Handoff::recv(b.as_fd()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "not a handoff from a coorfs keeper: \"coorfs-handoff 2\", 6 descriptors"
        );
        // One descriptor short of what the text says.
        send(a.as_fd(), "coorfs-handoff 1 tmpfs", &[a.as_fd(); 6]).unwrap();
        assert!(Handoff::recv(b.as_fd()).is_err());
        send(a.as_fd(), "coorfs-handoff 1 ready", &[a.as_fd(); 7]).unwrap();
        let h = Handoff::recv(b.as_fd()).unwrap();
        assert!(h.ready.is_some() && h.tmpfs.is_none());
    }
}
