//! Handing a live mount from one daemon to the next: what passes between processes.
//!
//! A mount outlives its daemon because a keeper process (`keeper.rs`) holds the `/dev/fuse`
//! descriptor; when the daemon dies, is OOM-killed or is upgraded, the keeper starts another
//! and hands it the descriptor and what the kernel's view of the mount needs ([`state`]) over a
//! unix socket ([`handoff`]). The successor does not send INIT again, knows every node id and
//! open handle the kernel holds, and asks the kernel to send again the requests its
//! predecessor read but did not answer (FUSE_NOTIFY_RESEND).
//!
//! Nothing here knows fuser or the filesystem core: the core records into [`state`] through
//! plain calls, and the FUSE session (`fuse/session.rs`) reads it back.

pub mod handoff;
pub mod state;
