//! FUSE over io_uring (`FUSE_OVER_IO_URING`, Linux 6.14 and later).
//!
//! After INIT the server registers *ring entries* on the `/dev/fuse` descriptor with
//! `IORING_OP_URING_CMD` SQEs (128-byte SQEs): each entry is a header buffer
//! ([`abi::fuse_uring_req_header`]) and a payload buffer. The kernel has one queue per
//! possible CPU, and a request made on CPU N goes to queue N; once every queue holds an
//! entry, the kernel sends every request (but FORGET and INTERRUPT, which stay on the
//! `/dev/fuse` read loop) to a ring entry: it copies the request into the entry's buffers
//! and completes the entry's SQE. The server writes its reply into the same buffers and
//! commits it with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which gives the entry back for the
//! next request: one system call per request, on the CPU that asked.
//!
//! Here: one thread per queue (or more, see [`RingConfig`]), pinned to the queue's CPU, each
//! with its own io_uring and its own entries. A request from an entry is put back together
//! as `/dev/fuse` would have delivered it and dispatched through the same code as one read
//! from `/dev/fuse`; its reply goes into the entry ([`RingReply`]).
//!
//! Until every queue has an entry the kernel keeps using `/dev/fuse`, so a ring that cannot
//! be set up costs nothing: the read loop serves.

use std::alloc::Layout;
use std::io;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::thread::ThreadId;

use io_uring::IoUring;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::warn;
use parking_lot::Mutex;
use zerocopy::IntoBytes;

use crate::dev_fuse::DevFuse;
use crate::ll::fuse_abi as abi;

/// How many threads and entries serve the ring.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingConfig {
    /// The kernel's queues: one per possible CPU.
    pub(crate) queues: usize,
    /// Threads serving each queue.
    pub(crate) threads_per_queue: usize,
    /// Entries each thread registers.
    pub(crate) depth: usize,
    /// Size of each entry's payload buffer: at least the kernel's largest request or reply
    /// (`max(8 KiB, max_write, max_pages * page size)`).
    pub(crate) payload_size: usize,
}

/// The kernel's queue count: the possible CPUs (`/sys/devices/system/cpu/possible`, e.g.
/// `0-1`), which the kernel sizes its ring by, not the online ones.
pub(crate) fn possible_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    let highest = text
        .trim()
        .split(',')
        .filter_map(|range| range.rsplit('-').next()?.parse::<usize>().ok())
        .max();
    match highest {
        Some(n) => n + 1,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// One entry's buffers, allocated once and never moved: the kernel holds their addresses
/// from REGISTER until the connection ends.
struct Slot {
    header: *mut abi::fuse_uring_req_header,
    payload: *mut u8,
    iov: Box<[libc::iovec; 2]>,
}

impl Slot {
    fn new(payload_size: usize) -> io::Result<Slot> {
        let header_layout = Layout::new::<abi::fuse_uring_req_header>();
        let payload_layout = Layout::from_size_align(payload_size, 4096)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: both layouts have a non-zero size; a null result is handled.
        let (header, payload) = unsafe {
            (
                std::alloc::alloc_zeroed(header_layout).cast::<abi::fuse_uring_req_header>(),
                std::alloc::alloc_zeroed(payload_layout),
            )
        };
        if header.is_null() || payload.is_null() {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        let iov = Box::new([
            libc::iovec {
                iov_base: header.cast(),
                iov_len: header_layout.size(),
            },
            libc::iovec {
                iov_base: payload.cast(),
                iov_len: payload_size,
            },
        ]);
        Ok(Slot {
            header,
            payload,
            iov,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // SAFETY: allocated in `Slot::new` with these layouts, freed once. A queue (and its
        // slots) is dropped only after its thread saw the kernel end every entry.
        unsafe {
            std::alloc::dealloc(
                self.header.cast(),
                Layout::new::<abi::fuse_uring_req_header>(),
            );
            std::alloc::dealloc(
                self.payload,
                Layout::from_size_align_unchecked(self.iov[1].iov_len, 4096),
            );
        }
    }
}

/// One thread's io_uring and the entries it registered for one kernel queue.
pub(crate) struct RingQueue {
    qid: u16,
    dev: Arc<DevFuse>,
    ring: IoUring<squeue::Entry128>,
    /// Held while an SQE is pushed: a reply may come from another thread.
    sq: Mutex<()>,
    slots: Vec<Slot>,
    payload_size: usize,
    /// The serving thread, which submits its SQEs with its next wait.
    owner: Mutex<Option<ThreadId>>,
}

// SAFETY: the raw pointers in `slots` point to buffers this queue owns. A slot's buffers are
// used by one party at a time, as the protocol hands them on: the kernel between a REGISTER
// or COMMIT_AND_FETCH and its completion, then the serving thread (which reads the request)
// and the one reply made for it, until that reply's COMMIT_AND_FETCH. The SQ is pushed to
// under `sq`, the CQ read only by the serving thread.
unsafe impl Send for RingQueue {}
// SAFETY: as above.
unsafe impl Sync for RingQueue {}

impl std::fmt::Debug for RingQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingQueue")
            .field("qid", &self.qid)
            .field("slots", &self.slots.len())
            .finish()
    }
}

impl RingQueue {
    /// A ring for `depth` entries of queue `qid`, not yet registered.
    pub(crate) fn new(
        dev: Arc<DevFuse>,
        qid: u16,
        depth: usize,
        payload_size: usize,
    ) -> io::Result<RingQueue> {
        let entries = (depth.max(1) * 2).next_power_of_two().max(8) as u32;
        let ring = IoUring::<squeue::Entry128>::builder()
            .setup_coop_taskrun()
            .build(entries)?;
        let slots = (0..depth.max(1))
            .map(|_| Slot::new(payload_size))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(RingQueue {
            qid,
            dev,
            ring,
            sq: Mutex::new(()),
            slots,
            payload_size,
            owner: Mutex::new(None),
        })
    }

    fn sqe(&self, cmd_op: u32, slot: usize, commit_id: u64) -> squeue::Entry128 {
        let req = abi::fuse_uring_cmd_req {
            flags: 0,
            commit_id,
            qid: self.qid,
            padding: [0; 6],
        };
        let mut cmd = [0u8; 80];
        cmd[..size_of::<abi::fuse_uring_cmd_req>()].copy_from_slice(req.as_bytes());
        let iov = self.slots[slot].iov.as_ptr();
        let mut sqe = opcode::UringCmd80::new(types::Fd(self.dev.as_raw_fd()), cmd_op)
            .cmd(cmd)
            .addr(Some(iov as u64))
            .build()
            .user_data(slot as u64);
        // The kernel wants `len` = 2 (the two iovecs), which the io-uring crate's builder does
        // not set. `Entry128` is `#[repr(C)]` and begins with the kernel's `io_uring_sqe`,
        // whose `len` is the u32 at byte 24.
        let bytes = std::ptr::from_mut(&mut sqe).cast::<u8>();
        // SAFETY: `sqe` is 128 bytes, and bytes 24..28 are its `len` field.
        unsafe { bytes.add(24).cast::<u32>().write_unaligned(2) };
        sqe
    }

    fn push(&self, sqe: &squeue::Entry128) -> io::Result<()> {
        let _guard = self.sq.lock();
        loop {
            // SAFETY: `sq` is held, so this is the only SubmissionQueue of the ring; the
            // SQE's iovec array and buffers live as long as the queue.
            let pushed = unsafe { self.ring.submission_shared().push(sqe) };
            if pushed.is_ok() {
                return Ok(());
            }
            // Full: hand what is there to the kernel first.
            self.ring.submit()?;
        }
    }

    /// Registers every slot as an entry of this queue. The kernel answers a REGISTER only
    /// with the entry's first request, or at once with an error: errors show in the CQ as
    /// soon as the submit returns, so a queue that registered without one is serving. What
    /// the CQ held besides (a request may come as soon as the last queue registered) is
    /// returned, to be served.
    fn register(&self) -> io::Result<Vec<(usize, i32)>> {
        for slot in 0..self.slots.len() {
            self.push(&self.sqe(abi::FUSE_IO_URING_CMD_REGISTER, slot, 0))?;
        }
        self.ring.submit()?;
        // SAFETY: only the serving thread reads the CQ, and it is this one.
        let cq = unsafe { self.ring.completion_shared() };
        let done: Vec<(usize, i32)> = cq.map(|c| (c.user_data() as usize, c.result())).collect();
        if let Some(&(_, e)) = done.iter().find(|&&(_, r)| r < 0) {
            return Err(io::Error::from_raw_os_error(-e));
        }
        Ok(done)
    }

    /// Commits the reply written into `slot` and asks for the entry's next request.
    fn commit(&self, slot: usize, commit_id: u64) -> io::Result<()> {
        self.push(&self.sqe(abi::FUSE_IO_URING_CMD_COMMIT_AND_FETCH, slot, commit_id))?;
        if *self.owner.lock() != Some(std::thread::current().id()) {
            // A reply made on another thread: the serving thread may be waiting.
            self.ring.submit()?;
        }
        Ok(())
    }
}

/// Where a ring request's reply goes: its entry, committed with the request's id.
#[derive(Debug, Clone)]
pub(crate) struct RingReply {
    queue: Arc<RingQueue>,
    slot: usize,
    commit_id: u64,
}

impl RingReply {
    /// Writes the reply (`fuse_out_header`, then the payload) into the entry and commits it.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let queue = &self.queue;
        let slot = &queue.slots[self.slot];
        let Some((head, rest)) = data.split_first() else {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        };
        let total: usize = rest.iter().map(|s| s.len()).sum();
        let mut head_bytes = [0u8; size_of::<abi::fuse_out_header>()];
        let n = head.len().min(head_bytes.len());
        head_bytes[..n].copy_from_slice(&head[..n]);
        let (payload_sz, head_bytes) = if total > queue.payload_size {
            // Cannot be (the kernel sizes requests to the buffer), but never overrun it.
            warn!("reply of {total} bytes does not fit the ring entry");
            let header = abi::fuse_out_header {
                len: size_of::<abi::fuse_out_header>() as u32,
                error: -libc::EIO,
                unique: self.commit_id,
            };
            let mut bytes = [0u8; size_of::<abi::fuse_out_header>()];
            bytes.copy_from_slice(header.as_bytes());
            (0, bytes)
        } else {
            let mut at = 0;
            for s in rest {
                // SAFETY: the payload buffer has `payload_size` >= `total` bytes, and this
                // reply owns the entry until the commit below (see `RingQueue`).
                unsafe {
                    std::ptr::copy_nonoverlapping(s.as_ptr(), slot.payload.add(at), s.len());
                }
                at += s.len();
            }
            (total as u32, head_bytes)
        };
        let ent = abi::fuse_uring_ent_in_out {
            flags: 0,
            commit_id: self.commit_id,
            payload_sz,
            padding: 0,
            reserved: 0,
        };
        // SAFETY: as above; the header buffer is a whole `fuse_uring_req_header`, written
        // through its raw pointer (no reference to memory the kernel also writes).
        unsafe {
            let in_out = std::ptr::addr_of_mut!((*slot.header).in_out).cast::<u8>();
            std::ptr::copy_nonoverlapping(head_bytes.as_ptr(), in_out, head_bytes.len());
            std::ptr::addr_of_mut!((*slot.header).ring_ent_in_out).write(ent);
        }
        queue.commit(self.slot, self.commit_id)
    }
}

/// What a serving thread hands each request to: its bytes as `/dev/fuse` would have
/// delivered them, and where its reply goes.
pub(crate) trait RingDispatch {
    /// Dispatches one request; false ends the thread (DESTROY).
    fn dispatch(&self, request: &[u8], reply: RingReply) -> bool;
}

/// Counts requests served through the ring, for whoever wants to know the transport.
#[derive(Debug, Default)]
pub(crate) struct RingStats {
    /// Every queue registered its entries without an error.
    pub(crate) registered: AtomicBool,
    /// Requests that came through a ring entry.
    pub(crate) served: AtomicU64,
}

/// Serves one queue on the calling thread until the connection ends: pins the thread to the
/// queue's CPU, registers the entries, then waits for requests and commits their replies.
/// `registered` is called once the entries are registered (with the outcome).
pub(crate) fn serve(
    queue: Arc<RingQueue>,
    dispatch: &impl RingDispatch,
    stats: &RingStats,
    registered: impl FnOnce(&io::Result<()>),
) -> io::Result<()> {
    *queue.owner.lock() = Some(std::thread::current().id());
    pin_to_cpu(usize::from(queue.qid));
    let outcome = queue.register();
    registered(&outcome.as_ref().map(|_| ()).map_err(|e| io::Error::from(e.kind())));
    let mut done = outcome?;
    // A request put back together: in_header, the operation's header, the payload. Aligned
    // for `fuse_in_header`, as the parser wants.
    let words = (size_of::<abi::fuse_uring_req_header>() + queue.payload_size).div_ceil(8);
    let mut buf = vec![0u64; words];
    loop {
        if done.is_empty() {
            match queue.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            // SAFETY: this thread is the only reader of the CQ.
            done.extend(
                unsafe { queue.ring.completion_shared() }
                    .map(|cqe| (cqe.user_data() as usize, cqe.result())),
            );
        }
        for (slot, result) in std::mem::take(&mut done) {
            if result < 0 {
                match -result {
                    // The connection ended (unmounted or aborted): the kernel ends every
                    // entry with ENOTCONN.
                    libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV => return Ok(()),
                    // The request this entry answered is gone (the connection is going);
                    // the entry is the kernel's no more, so it is registered again.
                    libc::ENOENT => {
                        debug!("ring queue {}: commit of a request gone", queue.qid);
                        queue.push(&queue.sqe(abi::FUSE_IO_URING_CMD_REGISTER, slot, 0))?;
                        continue;
                    }
                    e => return Err(io::Error::from_raw_os_error(e)),
                }
            }
            let Some(s) = queue.slots.get(slot) else {
                continue;
            };
            // SAFETY: the kernel completed this entry's SQE: the entry is this thread's until
            // its reply is committed. Read through raw pointers into a copy.
            let header: abi::fuse_uring_req_header = unsafe { s.header.read() };
            let in_len = size_of::<abi::fuse_in_header>();
            let ent = header.ring_ent_in_out;
            let payload_sz = (ent.payload_sz as usize).min(queue.payload_size);
            let len = u32::from_ne_bytes(header.in_out[..4].try_into().unwrap_or([0; 4])) as usize;
            let op_len = len
                .saturating_sub(in_len + payload_sz)
                .min(abi::FUSE_URING_OP_IN_OUT_SZ);
            let bytes = buf.as_mut_bytes();
            bytes[..in_len].copy_from_slice(&header.in_out[..in_len]);
            bytes[in_len..in_len + op_len].copy_from_slice(&header.op_in[..op_len]);
            // SAFETY: as above; `payload_sz` is within the payload buffer and `bytes` has room
            // for the header and the whole payload.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    s.payload,
                    bytes.as_mut_ptr().add(in_len + op_len),
                    payload_sz,
                );
            }
            let total = in_len + op_len + payload_sz;
            // The parser takes the length from the header: make it what was put together.
            bytes[..4].copy_from_slice(&(total as u32).to_ne_bytes());
            stats.served.fetch_add(1, Ordering::Relaxed);
            let reply = RingReply {
                queue: queue.clone(),
                slot,
                commit_id: ent.commit_id,
            };
            if !dispatch.dispatch(&bytes[..total], reply) {
                return Ok(());
            }
        }
    }
}

/// Pins the calling thread to `cpu`: the kernel queues a request on the queue of the CPU
/// that made it, and that queue's thread then wakes where the request was made. A CPU that
/// is possible but offline makes no requests; the thread then runs anywhere.
fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays within it for
    // cpu < CPU_SETSIZE, checked; sched_setaffinity(0, ...) acts on this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= libc::CPU_SETSIZE as usize {
            return;
        }
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!(
                "ring thread not pinned to CPU {cpu}: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// Dispatches ring requests through the same code as requests read from `/dev/fuse`.
struct Dispatcher<FS: crate::Filesystem> {
    se: crate::session::SessionEventLoop<FS>,
}

impl<FS: crate::Filesystem> RingDispatch for Dispatcher<FS> {
    fn dispatch(&self, request: &[u8], reply: RingReply) -> bool {
        use crate::reply::Reply;
        let sender = self.se.ch.sender();
        let Some(req) =
            crate::request::RequestWithSender::from_ring(sender.clone(), request, reply.clone())
        else {
            // Unparsable: the entry is still answered, or it would be lost to the kernel.
            <crate::reply::ReplyRaw as Reply>::new(
                crate::ll::RequestId(reply.commit_id),
                crate::reply::ReplySender::Ring(reply, sender),
            )
            .error(crate::ll::Errno::EIO);
            return true;
        };
        if let Ok(crate::ll::Operation::Destroy(_)) = req.request.operation() {
            req.reply::<crate::ReplyEmpty>().ok();
            return false;
        }
        req.dispatch(&self.se);
        true
    }
}

/// Starts the threads that serve the ring: `threads` spread over the kernel's queues (one
/// per possible CPU), at least one a queue. Each registers its entries; once all have,
/// `stats.registered` says so. A thread that cannot set up its ring logs why and ends: the
/// kernel then keeps sending every request to `/dev/fuse`.
pub(crate) fn spawn<FS: crate::Filesystem>(
    payload_size: usize,
    threads: usize,
    ch: &crate::channel::Channel,
    filesystem: &Arc<crate::session::FilesystemHolder<FS>>,
    allowed: crate::session::SessionACL,
    session_owner: nix::unistd::Uid,
    stats: &Arc<RingStats>,
) -> Vec<std::thread::JoinHandle<()>> {
    let config = RingConfig {
        queues: possible_cpus(),
        threads_per_queue: 1,
        depth: 2,
        payload_size,
    };
    let config = RingConfig {
        threads_per_queue: threads.div_ceil(config.queues).max(1),
        ..config
    };
    let total = config.queues * config.threads_per_queue;
    let pending = Arc::new(std::sync::atomic::AtomicUsize::new(total));
    let mut handles = Vec::with_capacity(total);
    for qid in 0..config.queues {
        for t in 0..config.threads_per_queue {
            let name = format!("fuser-ring-{qid}.{t}");
            let dispatcher = Dispatcher {
                se: crate::session::SessionEventLoop {
                    thread_name: name.clone(),
                    ch: ch.clone(),
                    filesystem: filesystem.clone(),
                    allowed,
                    session_owner,
                },
            };
            let dev = ch.device();
            let stats = stats.clone();
            let pending = pending.clone();
            let spawned = std::thread::Builder::new().name(name).spawn(move || {
                let Ok(qid16) = u16::try_from(qid) else {
                    return;
                };
                let queue = match RingQueue::new(dev, qid16, config.depth, config.payload_size) {
                    Ok(q) => Arc::new(q),
                    Err(e) => {
                        warn!("io_uring queue {qid}: {e}; requests stay on /dev/fuse");
                        return;
                    }
                };
                let served = serve(queue, &dispatcher, &stats, |outcome| match outcome {
                    Ok(()) => {
                        if pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                            stats.registered.store(true, Ordering::Release);
                            debug!("io_uring: every queue registered");
                        }
                    }
                    Err(e) => {
                        warn!("io_uring queue {qid}: REGISTER: {e}; requests stay on /dev/fuse")
                    }
                });
                if let Err(e) = served {
                    warn!("io_uring queue {qid}: {e}");
                }
            });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => warn!("io_uring queue {qid}: no thread: {e}"),
            }
        }
    }
    handles
}
