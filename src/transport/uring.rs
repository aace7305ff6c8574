//! FUSE-over-io_uring: one ring per possible CPU, each served by a thread pinned to that CPU.
//!
//! Life of a ring entry (the kernel's `fuse_ring_ent`), one outstanding SQE at a time:
//!
//! ```text
//!   Idle --REGISTER--> InKernel --CQE res=0--> InUser (a worker) --done--> COMMIT_AND_FETCH
//!                         |                                   |
//!                         +--CQE -EAGAIN/-EINTR: resubmit-----+
//!                         +--CQE -ENOTCONN (unmount) / other error--> Dead
//! ```
//!
//! The kernel keeps raw pointers to each entry's two buffers (header and payload) for the life
//! of the connection, so they are mmap'd once, never move, and are unmapped only after the ring
//! is closed. Only the owning thread touches a ring (its submission queue is single-producer).
//! FORGET, INTERRUPT and notifications keep using /dev/fuse (see kernel-notes/fuse-io-uring.md),
//! which is why the classic threads keep running in ring mode.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crossbeam_channel::{unbounded, Receiver, Sender};
use io_uring::{opcode, squeue, types, IoUring};
use zerocopy::{FromBytes, IntoBytes};

use crate::abi;
use crate::dispatch::shards::{may_block, runs_inline, Job, Shards, LARGE_READ};
use crate::dispatch::Dispatcher;
use crate::protocol::{self, Reply};

const HEADER_SIZE: usize = std::mem::size_of::<abi::UringReqHeader>();
const ENT_OFFSET: usize = abi::FUSE_URING_IN_OUT_HEADER_SZ + abi::FUSE_URING_OP_IN_OUT_SZ;

/// Whether the kernel's fuse module allows the ring (`enable_uring` = Y).
pub fn kernel_allows() -> bool {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .map(|s| s.trim() == "Y")
        .unwrap_or(false)
}

/// Number of possible CPUs: the kernel wants one queue for each before it uses the ring.
pub fn possible_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    parse_cpu_list(text.trim()).unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

/// "0-3,5" → 6 (highest index + 1, as the kernel sizes its queue array).
fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut max = None;
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let hi = match part.split_once('-') {
            Some((_, hi)) => hi.parse::<usize>().ok()?,
            None => part.parse::<usize>().ok()?,
        };
        max = Some(max.map_or(hi, |m: usize| m.max(hi)));
    }
    max.map(|m| m + 1)
}

/// Memory the kernel reads and writes through a raw pointer: page-aligned, never moved.
struct Mapped {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by one ring thread at a time.
unsafe impl Send for Mapped {}

impl Mapped {
    /// A fresh mapping of `len` bytes; `populate` faults every page in now, otherwise a page
    /// costs memory only once something is written to it (the kernel's copy of a request or
    /// our reply), so an entry holds only what it ever carried.
    fn new(len: usize, populate: bool) -> io::Result<Self> {
        let flags =
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if populate { libc::MAP_POPULATE } else { 0 };
        // SAFETY: an anonymous private mapping with no address hint has no preconditions.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapped {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The bytes, while the entry is in user space (the kernel is not using it).
    fn bytes(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is a live mapping; callers only use it between the entry's CQE
        // and its next submission, when the kernel does not access it.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Mapped {
    /// No mapping (what an entry keeps after its buffers were deliberately leaked).
    fn none() -> Self {
        Mapped {
            ptr: std::ptr::null_mut(),
            len: 0,
        }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        // SAFETY: the mapping was created by mmap with this length and is unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The iovec pair of one entry (header, payload), boxed so its address never changes.
struct IoVecs(Box<[libc::iovec; 2]>);

// SAFETY: the iovecs only carry addresses of this entry's own mappings, which move with it.
unsafe impl Send for IoVecs {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EntState {
    /// Allocated, not yet handed to the kernel.
    Idle,
    /// REGISTER or COMMIT_AND_FETCH submitted; the kernel owns the buffers.
    InKernel { registering: bool },
    /// A request is in the buffers and a worker owns them until it reports done.
    InUser,
    /// The connection ended or the kernel refused the entry.
    Dead,
}

struct Entry {
    header: Mapped,
    payload: Mapped,
    /// The two iovecs REGISTER points at; they must stay valid until the kernel read them.
    iov: IoVecs,
    state: EntState,
    commit_id: u64,
}

/// How workers hand finished entries back to the ring thread that owns the submission queue:
/// a channel of entry indexes and an eventfd the ring thread keeps a READ armed on.
struct Done {
    tx: Sender<usize>,
    efd: OwnedFd,
}

impl Done {
    fn finish(&self, idx: usize) {
        let _ = self.tx.send(idx);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
        unsafe { libc::write(self.efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// A worker's hold on a ring entry: dropping it hands the entry back to its ring thread, so an
/// entry comes back even if its job unwinds (a lost entry would leave the kernel waiting for
/// the reply and the ring thread for the entry, and the unmount would hang).
struct Handed {
    done: Arc<Done>,
    idx: usize,
}

impl Drop for Handed {
    fn drop(&mut self) {
        self.done.finish(self.idx);
    }
}

/// `user_data` of the eventfd READ (entry indexes are small).
const DONE_TAG: u64 = u64::MAX;

/// One queue: a ring and its entries. The kernel holds raw pointers to an entry's buffers
/// from its REGISTER until the connection ends, and writes a request into them whenever the
/// entry waits in the kernel; closing the ring does not take those pointers back at once (its
/// commands are cancelled asynchronously, and the connection outlives the ring). So the buffers
/// are freed only when no command of theirs is outstanding; see the `Drop` impl.
pub struct Queue {
    ring: IoUring<squeue::Entry128>,
    entries: Vec<Entry>,
    qid: u16,
    done: Arc<Done>,
    done_rx: Receiver<usize>,
    /// Target of the armed eventfd READ.
    efd_buf: Box<u64>,
    /// Whether a READ into `efd_buf` is outstanding.
    done_armed: bool,
}

impl Drop for Queue {
    /// Free an entry's buffers only when the kernel cannot write into them any more: never
    /// handed over (Idle) or answered with its final completion (Dead). An entry still in the
    /// kernel or with a worker (the queue dropped on an error path or by a panic) keeps its
    /// mappings for the life of the process: a few MiB leaked on a rare failure, instead of the
    /// kernel or a worker writing into memory reused for something else. The same holds for the
    /// eventfd READ's target. (Field drops run after this: the ring closes first.)
    fn drop(&mut self) {
        let mut kept = 0;
        for e in &mut self.entries {
            if !matches!(e.state, EntState::Idle | EntState::Dead) {
                e.state = EntState::Dead;
                let header = std::mem::replace(&mut e.header, Mapped::none());
                let payload = std::mem::replace(&mut e.payload, Mapped::none());
                std::mem::forget(header);
                std::mem::forget(payload);
                kept += 1;
            }
        }
        if self.done_armed {
            std::mem::forget(std::mem::replace(&mut self.efd_buf, Box::new(0)));
        }
        if kept > 0 {
            tracing::warn!(
                "queue {}: {kept} entries were still held by the kernel or a worker; their buffers stay mapped",
                self.qid
            );
        }
    }
}

/// An entry's buffers as a worker sees them while the entry is `InUser`.
struct EntryBufs {
    header: *mut u8,
    header_len: usize,
    payload: *mut u8,
    payload_len: usize,
}

// SAFETY: the pointers refer to mappings that outlive every job (the ring thread waits for all
// outstanding jobs before it drops its queue), and exactly one job uses them at a time.
unsafe impl Send for EntryBufs {}

/// Requests answered through rings, and entries the kernel refused.
#[derive(Default)]
pub struct RingStats {
    pub served: AtomicU64,
    pub failed: AtomicU64,
}

/// Create every queue before INIT is answered, so a failure simply means "do not offer the
/// ring". `payload` must be at least the kernel's max(8192, max_write, max_pages * 4096).
/// Bytes the entries of `queues` keep mapped for the kernel (headers and payloads).
pub fn mapped_bytes(queues: &[Queue]) -> u64 {
    let per_entry = |e: &Entry| (e.header.len + e.payload.len) as u64;
    queues
        .iter()
        .flat_map(|q| q.entries.iter())
        .map(per_entry)
        .sum()
}

pub fn prepare(queues: usize, depth: usize, payload: usize) -> io::Result<Vec<Queue>> {
    let mut out = Vec::with_capacity(queues);
    for qid in 0..queues {
        // One SQE per entry plus the eventfd READ.
        let ring = IoUring::<squeue::Entry128>::builder()
            .setup_cqsize(((depth + 1) * 2) as u32)
            .setup_submit_all()
            .build((depth + 1) as u32)?;
        // SAFETY: eventfd has no memory preconditions; the result is checked below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `efd` is a fresh descriptor owned by nobody else.
        let efd = unsafe { OwnedFd::from_raw_fd(efd) };
        let (tx, done_rx) = unbounded();
        let mut entries = Vec::with_capacity(depth);
        for _ in 0..depth {
            let mut header = Mapped::new(HEADER_SIZE.next_multiple_of(4096), true)?;
            let mut payload_buf = Mapped::new(payload.next_multiple_of(4096), false)?;
            let iov = IoVecs(Box::new([
                libc::iovec {
                    iov_base: header.bytes_mut().as_mut_ptr().cast(),
                    iov_len: HEADER_SIZE,
                },
                libc::iovec {
                    iov_base: payload_buf.bytes_mut().as_mut_ptr().cast(),
                    iov_len: payload_buf.len,
                },
            ]));
            entries.push(Entry {
                header,
                payload: payload_buf,
                iov,
                state: EntState::Idle,
                commit_id: 0,
            });
        }
        out.push(Queue {
            ring,
            entries,
            qid: qid as u16,
            done: Arc::new(Done { tx, efd }),
            done_rx,
            efd_buf: Box::new(0),
            done_armed: false,
        });
    }
    Ok(out)
}

/// Build a FUSE uring command SQE. The crate has no setter for `len`, which REGISTER needs (the
/// number of iovecs, 2), so it is patched into the raw entry.
fn uring_cmd(
    fd: RawFd,
    cmd_op: u32,
    req: &abi::UringCmdReq,
    addr: Option<u64>,
    len: u32,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[..std::mem::size_of::<abi::UringCmdReq>()].copy_from_slice(req.as_bytes());
    let op = opcode::UringCmd80::new(types::Fd(fd), cmd_op)
        .cmd(cmd)
        .addr(addr);
    set_sqe_len(op.build(), len)
}

/// Offset of `len` in `struct io_uring_sqe`.
const SQE_LEN_OFFSET: usize = 24;

fn set_sqe_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
    // SAFETY: Entry128 is #[repr(C)] over the 128-byte io_uring_sqe (+ command area), plain
    // data for which every bit pattern is valid; sizes are equal (asserted above).
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[SQE_LEN_OFFSET..SQE_LEN_OFFSET + 4].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above, converting back.
    unsafe { std::mem::transmute(raw) }
}

impl Queue {
    fn sqe_for(&self, fd: RawFd, idx: usize) -> squeue::Entry128 {
        let e = &self.entries[idx];
        let sqe = match e.state {
            EntState::InKernel { registering: true } | EntState::Idle => uring_cmd(
                fd,
                abi::FUSE_IO_URING_CMD_REGISTER,
                &abi::UringCmdReq {
                    qid: self.qid,
                    ..Default::default()
                },
                Some(e.iov.0.as_ptr() as u64),
                2,
            ),
            _ => uring_cmd(
                fd,
                abi::FUSE_IO_URING_CMD_COMMIT_AND_FETCH,
                &abi::UringCmdReq {
                    commit_id: e.commit_id,
                    qid: self.qid,
                    ..Default::default()
                },
                None,
                0,
            ),
        };
        sqe.user_data(idx as u64)
    }

    fn push(&mut self, fd: RawFd, idx: usize) -> io::Result<()> {
        let sqe = self.sqe_for(fd, idx);
        self.push_sqe(sqe)
    }

    /// Arm a READ of the eventfd workers signal when they finish an entry.
    fn arm_done(&mut self) -> io::Result<()> {
        let buf: *mut u64 = &mut *self.efd_buf;
        let sqe = opcode::Read::new(types::Fd(self.done.efd.as_raw_fd()), buf.cast(), 8)
            .build()
            .user_data(DONE_TAG);
        self.push_sqe(sqe.into())?;
        self.done_armed = true;
        Ok(())
    }

    fn push_sqe(&mut self, sqe: squeue::Entry128) -> io::Result<()> {
        // SAFETY: the SQE refers to this entry's iovecs and buffers, which live as long as the
        // queue and are not touched by us until the entry's CQE arrives.
        let pushed = unsafe { self.ring.submission().push(&sqe) };
        if pushed.is_err() {
            // Never happens: one SQE per entry and the SQ holds `depth` entries. Flush anyway.
            self.ring.submit()?;
            // SAFETY: as above.
            unsafe { self.ring.submission().push(&sqe) }
                .map_err(|_| io::Error::other("submission queue full"))?;
        }
        Ok(())
    }

    /// Serve this queue until the connection ends. Runs on the queue's own thread, which is
    /// the only one that touches the ring; workers run the requests.
    pub fn serve(mut self, fd: RawFd, shards: &Shards, stats: &RingStats) {
        // So its ring's completions run where its requests come from. Failure (an offline
        // CPU) only costs speed.
        if let Err(e) = crate::sys::priority::pin_this_thread(self.qid as usize) {
            tracing::debug!("queue {}: not pinned to its CPU: {e}", self.qid);
        }
        if let Err(e) = self.arm_done() {
            tracing::error!("queue {}: cannot arm its eventfd: {e}", self.qid);
            return;
        }
        for i in 0..self.entries.len() {
            self.entries[i].state = EntState::InKernel { registering: true };
            if let Err(e) = self.push(fd, i) {
                tracing::error!("queue {}: REGISTER failed: {e}", self.qid);
                self.entries[i].state = EntState::Dead;
            }
        }
        let mut done: Vec<(u64, i32)> = Vec::with_capacity(self.entries.len() + 1);
        loop {
            let outstanding = self.entries.iter().any(|e| e.state == EntState::InUser);
            if !outstanding && self.entries.iter().all(|e| e.state == EntState::Dead) {
                break;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    tracing::error!("queue {}: io_uring_enter failed: {e}", self.qid);
                    // Never drop buffers a worker may still be filling.
                    while self.entries.iter().any(|e| e.state == EntState::InUser) {
                        if let Ok(idx) = self.done_rx.recv() {
                            self.entries[idx].state = EntState::Dead;
                        }
                    }
                    break;
                }
            }
            done.clear();
            done.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            for &(tag, res) in &done {
                if tag == DONE_TAG {
                    self.done_armed = false;
                    self.collect_finished(fd);
                    if let Err(e) = self.arm_done() {
                        tracing::error!("queue {}: cannot re-arm its eventfd: {e}", self.qid);
                    }
                    continue;
                }
                let idx = tag as usize;
                if idx < self.entries.len() {
                    self.complete(fd, idx, res, shards, stats);
                }
            }
        }
    }

    /// Commit every entry a worker has finished.
    fn collect_finished(&mut self, fd: RawFd) {
        while let Ok(idx) = self.done_rx.try_recv() {
            let Some(e) = self.entries.get_mut(idx) else {
                continue;
            };
            e.state = EntState::InKernel { registering: false };
            if let Err(err) = self.push(fd, idx) {
                tracing::error!("queue {} entry {idx}: commit failed: {err}", self.qid);
                self.entries[idx].state = EntState::Dead;
            }
        }
    }

    fn complete(&mut self, fd: RawFd, idx: usize, res: i32, shards: &Shards, stats: &RingStats) {
        if res == 0 {
            stats.served.fetch_add(1, Ordering::Relaxed);
            self.dispatch(fd, idx, shards);
            return;
        }
        if res == -libc::EAGAIN || res == -libc::EINTR {
            // REGISTER raced with INIT, or an interrupted submission: send the same SQE again.
            if let Err(e) = self.push(fd, idx) {
                tracing::error!("queue {} entry {idx}: resubmit failed: {e}", self.qid);
                self.entries[idx].state = EntState::Dead;
            }
            return;
        }
        if res != -libc::ENOTCONN && res != -libc::ECONNABORTED && res != -libc::ENODEV {
            tracing::warn!(
                "queue {} entry {idx}: the kernel refused the ring ({}); /dev/fuse serves instead",
                self.qid,
                std::io::Error::from_raw_os_error(-res)
            );
            stats.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.entries[idx].state = EntState::Dead;
    }

    /// Run entry `idx`'s request here if it only reads, or if it cannot block for long (see
    /// [`may_block`]) and the shard of its inode is free (this thread is its queue's only
    /// reader, and a request from this CPU is best served on it); else hand it to the shard's
    /// worker. Either way the entry is committed once its reply is in place.
    fn dispatch(&mut self, fd: RawFd, idx: usize, shards: &Shards) {
        let field = |range: std::ops::Range<usize>| {
            self.entries[idx]
                .header
                .bytes()
                .get(range)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u32::from_ne_bytes)
        };
        let (len, opcode) = (field(0..4), field(4..8));
        let e = &mut self.entries[idx];
        e.state = EntState::InUser;
        // COMMIT_AND_FETCH echoes the request's commit id.
        e.commit_id = e
            .header
            .bytes()
            .get(ENT_OFFSET..HEADER_SIZE)
            .and_then(|b| abi::UringEntInOut::read_from_bytes(b).ok())
            .map_or(0, |ent| ent.commit_id);
        let key = e
            .header
            .bytes()
            .get(16..24)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_ne_bytes)
            .unwrap_or(0);
        let bufs = EntryBufs {
            header: e.header.ptr,
            header_len: HEADER_SIZE,
            payload: e.payload.ptr,
            payload_len: e.payload.len,
        };
        let here = |d: &Dispatcher| {
            // SAFETY: the entry is InUser and this thread owns it; no worker has it.
            let (hdr, payload) = unsafe {
                (
                    std::slice::from_raw_parts_mut(bufs.header, bufs.header_len),
                    std::slice::from_raw_parts_mut(bufs.payload, bufs.payload_len),
                )
            };
            fill_reply(hdr, payload, d);
        };
        let large_read = is_large_read(opcode, e.header.bytes());
        let answered = if large_read {
            false
        } else if runs_inline(opcode) {
            here(shards.dispatcher());
            true
        } else {
            !may_block(opcode, len) && shards.try_inline(key, here).is_some()
        };
        if answered {
            self.entries[idx].state = EntState::InKernel { registering: false };
            if let Err(err) = self.push(fd, idx) {
                tracing::error!("queue {} entry {idx}: commit failed: {err}", self.qid);
                self.entries[idx].state = EntState::Dead;
            }
            return;
        }
        let handed = Handed {
            done: self.done.clone(),
            idx,
        };
        let job: Job = Box::new(move |d| {
            let _back = handed;
            let bufs = bufs;
            // SAFETY: see EntryBufs: the entry is InUser, so this job is the only user of
            // its buffers until `finish` hands them back to the ring thread.
            let (hdr, payload) = unsafe {
                (
                    std::slice::from_raw_parts_mut(bufs.header, bufs.header_len),
                    std::slice::from_raw_parts_mut(bufs.payload, bufs.payload_len),
                )
            };
            fill_reply(hdr, payload, d);
        });
        if large_read {
            shards.submit_any(job);
        } else {
            shards.submit(key, job);
        }
    }
}

/// A READ of more than [`LARGE_READ`] bytes: the ring thread hands it to a worker instead of
/// running it. The kernel puts every request of a CPU in that CPU's queue, so a sequential
/// reader's readahead READs would otherwise be served one after the other by one thread, each
/// waiting for the disk in turn where /dev/fuse's threads serve them side by side.
fn is_large_read(opcode: u32, header: &[u8]) -> bool {
    const SIZE: std::ops::Range<usize> =
        abi::FUSE_URING_IN_OUT_HEADER_SZ + 16..abi::FUSE_URING_IN_OUT_HEADER_SZ + 20;
    opcode == abi::Opcode::Read as u32
        && header
            .get(SIZE)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes)
            .is_some_and(|size| size as usize > LARGE_READ)
}

/// Decode the request in an entry's buffers, run it, and leave the reply in the same buffers
/// (out header in `in_out`, body in the payload, its length in `ring_ent_in_out`).
fn fill_reply(hdr: &mut [u8], payload: &mut [u8], dispatcher: &Dispatcher) {
    let Some(ent) = hdr
        .get(ENT_OFFSET..HEADER_SIZE)
        .and_then(|b| abi::UringEntInOut::read_from_bytes(b).ok())
    else {
        return;
    };
    let payload_len = (ent.payload_sz as usize).min(payload.len());
    let (reply, unique) = {
        let in_out = &hdr[..abi::FUSE_URING_IN_OUT_HEADER_SZ];
        let op_in = &hdr[abi::FUSE_URING_IN_OUT_HEADER_SZ..ENT_OFFSET];
        match protocol::decode_parts(in_out, op_in, &payload[..payload_len]) {
            Ok(req) => (dispatcher.handle(&req), req.header.unique),
            Err(err) => {
                tracing::warn!("malformed ring request: {}", err.why);
                (Reply::Error(err.errno), err.unique.unwrap_or(ent.commit_id))
            }
        }
    };
    let (error, body): (i32, &[u8]) = match &reply {
        // The kernel expects an answer for everything it put on the ring.
        Reply::None => (0, &[]),
        Reply::Error(err) => (-err.0, &[]),
        Reply::Data(d) if d.len() <= payload.len() => (0, d.as_slice()),
        Reply::Data(_) => (-libc::EIO, &[]),
    };
    payload[..body.len()].copy_from_slice(body);
    let out = protocol::out_header(unique, error, body.len());
    hdr[..out.len()].copy_from_slice(&out);
    let ent = abi::UringEntInOut {
        commit_id: ent.commit_id,
        payload_sz: body.len() as u32,
        ..Default::default()
    };
    hdr[ENT_OFFSET..HEADER_SIZE].copy_from_slice(ent.as_bytes());
    reply.recycle();
}

/// Start one pinned thread per queue.
pub fn start(
    queues: Vec<Queue>,
    fd: RawFd,
    shards: Arc<Shards>,
    stats: Arc<RingStats>,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    for q in queues {
        let sh = shards.clone();
        let s = stats.clone();
        let qid = q.qid;
        match std::thread::Builder::new()
            .name(format!("fuse-ring-{qid}"))
            .spawn(move || q.serve(fd, &sh, &s))
        {
            Ok(h) => threads.push(h),
            Err(e) => tracing::error!("cannot start ring thread {qid}: {e}"),
        }
    }
    threads
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_like_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,8-11"), Some(12));
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn an_entry_comes_back_from_a_job_that_panics() {
        // SAFETY: eventfd has no memory preconditions; the result is checked.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(efd >= 0);
        // SAFETY: a fresh descriptor owned by nobody else.
        let efd = unsafe { OwnedFd::from_raw_fd(efd) };
        let (tx, rx) = unbounded();
        let handed = Handed {
            done: Arc::new(Done { tx, efd }),
            idx: 3,
        };
        let job = std::thread::spawn(move || {
            let _back = handed;
            panic!("injected");
        });
        assert!(job.join().is_err(), "the job panicked");
        assert_eq!(rx.try_recv().ok(), Some(3), "its entry came back");
    }

    #[test]
    fn register_sqe_carries_two_iovecs() {
        let req = abi::UringCmdReq {
            qid: 1,
            ..Default::default()
        };
        let sqe = uring_cmd(5, abi::FUSE_IO_URING_CMD_REGISTER, &req, Some(0x1000), 2);
        // SAFETY: test-only view of the plain 128-byte entry.
        let raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(raw[0], io_uring::opcode::UringCmd80::CODE);
        assert_eq!(
            u32::from_ne_bytes(raw[24..28].try_into().unwrap()),
            2,
            "len"
        );
        assert_eq!(i32::from_ne_bytes(raw[4..8].try_into().unwrap()), 5, "fd");
        assert_eq!(
            u64::from_ne_bytes(raw[16..24].try_into().unwrap()),
            0x1000,
            "addr"
        );
        assert_eq!(
            u32::from_ne_bytes(raw[8..12].try_into().unwrap()),
            1,
            "cmd_op"
        );
        // The command area starts at byte 48: fuse_uring_cmd_req.qid at offset 16 in it.
        assert_eq!(
            u16::from_ne_bytes(raw[48 + 16..48 + 18].try_into().unwrap()),
            1,
            "qid"
        );
    }
}
