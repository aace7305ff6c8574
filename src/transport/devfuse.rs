//! The classic transport: threads that read(2) requests from /dev/fuse and writev(2) replies.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::dispatch::shards::{runs_inline, Shards};
use crate::dispatch::Dispatcher;
use crate::protocol::{self, Reply};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// A FUSE connection: the /dev/fuse file descriptor (opened close-on-exec).
pub struct Channel {
    fd: OwnedFd,
    /// Requests answered through this channel.
    pub served: AtomicU64,
    /// Requests read from this channel that take no reply (FORGET, BATCH_FORGET, INTERRUPT):
    /// the kernel sends these over /dev/fuse also when the ring serves everything else.
    pub unanswered: AtomicU64,
    /// Transport threads serving this channel ([`serve_loop`]s running).
    readers: AtomicUsize,
    /// Of those, the ones running a mutation in place (see [`Channel::spare`]).
    occupied: AtomicUsize,
    /// Transport threads whose request buffer holds a large request's pages, by thread; a
    /// thread removes itself before it ends ([`Channel::release_idle_buffers`]).
    tails: parking_lot::Mutex<Vec<(libc::pthread_t, Arc<AtomicBool>)>>,
    /// A thread is polling for the next request ([`Channel::spin`]).
    spinner: AtomicBool,
    /// The last poll saw a request come, or a request came soon after a thread went idle:
    /// polling pays while requests arrive back to back.
    spin_pays: AtomicBool,
    /// Times polling found a request waiting.
    pub polled: AtomicU64,
}

/// A transport thread's claim to run one mutation in place; released on drop.
pub struct Spared<'a>(&'a Channel);

impl Drop for Spared<'_> {
    fn drop(&mut self) {
        self.0.occupied.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts a [`serve_loop`] among the channel's readers while it runs, and tracks whether its
/// request buffer's tail is resident.
struct Reader<'a> {
    chan: &'a Channel,
    /// Set by [`Channel::release_idle_buffers`]: hand the tail back.
    release: Arc<AtomicBool>,
    /// The tail is resident (the thread is listed in the channel's `tails`).
    tail: bool,
}

impl<'a> Reader<'a> {
    fn new(chan: &'a Channel) -> Self {
        chan.readers.fetch_add(1, Ordering::AcqRel);
        crate::sys::signals::install_wake();
        crate::sys::signals::block_wake(true);
        Reader {
            chan,
            release: Arc::new(AtomicBool::new(false)),
            tail: false,
        }
    }

    /// The request just read was `n` bytes: past the buffer's head, its tail is resident.
    fn filled(&mut self, n: usize) {
        if n > KEEP_RESIDENT && !self.tail {
            self.tail = true;
            self.release.store(false, Ordering::Release);
            let me = crate::sys::signals::this_thread();
            self.chan.tails.lock().push((me, self.release.clone()));
        }
    }

    /// Hand the buffer's tail back when the channel asked for it.
    fn maybe_release(&mut self, buf: &mut [u8]) {
        if self.tail && self.release.load(Ordering::Acquire) {
            if let Some(tail) = buf.get_mut(KEEP_RESIDENT..) {
                crate::sys::memory::discard(tail);
            }
            self.unlist();
        }
    }

    fn unlist(&mut self) {
        if self.tail {
            self.tail = false;
            self.chan
                .tails
                .lock()
                .retain(|(_, r)| !Arc::ptr_eq(r, &self.release));
        }
    }

    /// Read the next request. With a resident tail the read may be interrupted by
    /// [`Channel::release_idle_buffers`] (the wake signal is unblocked only around it), and
    /// then the tail is handed back and the read starts again.
    fn receive(&mut self, buf: &mut [u8]) -> io::Result<Received> {
        loop {
            self.maybe_release(buf);
            if !self.tail {
                return self.chan.receive(buf, false);
            }
            crate::sys::signals::block_wake(false);
            let got = if self.release.load(Ordering::Acquire) {
                Ok(Received::Interrupted)
            } else {
                self.chan.receive(buf, true)
            };
            crate::sys::signals::block_wake(true);
            match got {
                Ok(Received::Interrupted) => continue,
                other => return other,
            }
        }
    }
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        self.unlist();
        self.chan.readers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a read from the channel produced.
pub enum Received {
    /// A request of this many bytes is in the buffer.
    Request(usize),
    /// The filesystem was unmounted or the connection aborted.
    Gone,
    /// An interruptible read was interrupted by a signal.
    Interrupted,
}

impl Channel {
    pub fn new(fd: OwnedFd) -> Self {
        Self {
            fd,
            served: AtomicU64::new(0),
            unanswered: AtomicU64::new(0),
            readers: AtomicUsize::new(0),
            occupied: AtomicUsize::new(0),
            tails: parking_lot::Mutex::new(Vec::new()),
            spinner: AtomicBool::new(false),
            spin_pays: AtomicBool::new(true),
            polled: AtomicU64::new(0),
        }
    }

    /// The descriptor, for the io_uring transport's SQEs (it stays owned by the channel).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }

    /// Leave to the calling transport thread one mutation to run in place, as long as another
    /// thread stays free of such work to read the next request: however long the mutation
    /// waits (a commit, the pending-byte cap), reading never stops. None when no thread is
    /// left to spare.
    pub fn spare(&self) -> Option<Spared<'_>> {
        let readers = self.readers.load(Ordering::Acquire);
        if self.occupied.fetch_add(1, Ordering::AcqRel) + 1 < readers {
            Some(Spared(self))
        } else {
            self.occupied.fetch_sub(1, Ordering::AcqRel);
            None
        }
    }

    /// Read one request. Retries on EAGAIN and on ENOENT (a request interrupted before we read
    /// it), and on EINTR unless `interruptible`.
    pub fn receive(&self, buf: &mut [u8], interruptible: bool) -> io::Result<Received> {
        loop {
            // SAFETY: `buf` is valid for writes of buf.len() bytes; the fd is open.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                return Ok(Received::Request(n as usize));
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) if interruptible => return Ok(Received::Interrupted),
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ENOENT) => continue,
                Some(libc::ENODEV) | Some(libc::ECONNABORTED) => return Ok(Received::Gone),
                _ => return Err(err),
            }
        }
    }

    /// Wait up to `limit` for the next request by polling (poll(2) with a zero timeout, in a
    /// loop) instead of asleep in read(2): a request that comes meanwhile is read without the
    /// kernel waking a thread, which costs tens of microseconds on a 2-vCPU VM when the wake
    /// crosses CPUs. Between polls it yields, so a caller waiting for this CPU runs. Only while
    /// it pays (see `spin_pays`), and by one thread at a time; the others sleep in read(2) as
    /// before.
    pub fn spin(&self, limit: Duration) {
        if !self.spin_pays.load(Ordering::Relaxed) || self.spinner.swap(true, Ordering::AcqRel) {
            return;
        }
        let start = Instant::now();
        let came = loop {
            let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::ZERO) {
                Ok(0) => {}
                // A request, or the connection's end (POLLERR): read(2) tells which.
                Ok(_) => break true,
                Err(_) => break false,
            }
            if start.elapsed() >= limit {
                break false;
            }
            // The caller may be waiting for this very CPU: let it run.
            std::thread::yield_now();
        };
        if came {
            self.polled.fetch_add(1, Ordering::Relaxed);
        }
        self.spin_pays.store(came, Ordering::Relaxed);
        self.spinner.store(false, Ordering::Release);
    }

    /// A thread read a request `gap` after it went idle: within `limit`, polling pays again.
    fn arrived_after(&self, gap: Duration, limit: Duration) {
        if gap < limit {
            self.spin_pays.store(true, Ordering::Relaxed);
        }
    }

    /// Ask every transport thread whose request buffer holds a large request's pages to hand
    /// them back (called when the server has been idle): each is woken from its read, drops
    /// the pages past the buffer's head and reads again.
    pub fn release_idle_buffers(&self) {
        let tails = self.tails.lock();
        for (thread, release) in tails.iter() {
            release.store(true, Ordering::Release);
            crate::sys::signals::wake(*thread);
        }
    }

    /// Send a reply (header + body in one writev). A request the kernel has already given up on
    /// (ENOENT: interrupted) is not an error.
    pub fn send(&self, unique: u64, reply: &Reply) -> io::Result<()> {
        let (error, body): (i32, &[u8]) = match reply {
            Reply::None => return Ok(()),
            Reply::Error(e) => (-e.0, &[]),
            Reply::Data(d) => (0, d.as_slice()),
        };
        self.send_raw(&protocol::out_header(unique, error, body.len()), body)
    }

    /// Write a header and body as one message (also used for notifications).
    pub fn send_raw(&self, header: &[u8], body: &[u8]) -> io::Result<()> {
        let iov = [
            libc::iovec {
                iov_base: header.as_ptr() as *mut libc::c_void,
                iov_len: header.len(),
            },
            libc::iovec {
                iov_base: body.as_ptr() as *mut libc::c_void,
                iov_len: body.len(),
            },
        ];
        let count = if body.is_empty() { 1 } else { 2 };
        // SAFETY: both iovecs point at live slices for the duration of the call; the kernel
        // only reads them.
        let n = unsafe { libc::writev(self.fd.as_raw_fd(), iov.as_ptr(), count) };
        if n < 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::ENOENT) => Ok(()),
                _ => Err(err),
            };
        }
        Ok(())
    }
}

/// Decode and handle one whole request: its unique id and reply, or None for a header too
/// broken to answer.
fn handle(dispatcher: &Dispatcher, msg: &[u8]) -> Option<(u64, Reply)> {
    match protocol::decode(msg) {
        Ok(req) => Some((req.header.unique, dispatcher.handle(&req))),
        Err(e) => match e.unique {
            Some(u) => {
                tracing::warn!("malformed request {u}: {}", e.why);
                Some((u, Reply::Error(e.errno)))
            }
            None => {
                tracing::warn!("unreadable request header ({} bytes): {}", msg.len(), e.why);
                None
            }
        },
    }
}

/// Send the reply to request `unique`; its body goes back to the buffer pool.
fn deliver(chan: &Channel, unique: u64, reply: Reply) {
    let counter = match reply {
        Reply::None => &chan.unanswered,
        _ => &chan.served,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = chan.send(unique, &reply) {
        if e.raw_os_error() != Some(libc::ENODEV) {
            tracing::warn!("reply to request {unique} failed: {e}");
        }
    }
    reply.recycle();
}

/// The head of a transport thread's request buffer that stays resident: every request but a
/// large WRITE fits in it.
const KEEP_RESIDENT: usize = 128 * 1024;

/// Decode, handle and answer one whole request.
fn answer(chan: &Channel, dispatcher: &Dispatcher, msg: &[u8]) {
    if let Some((unique, reply)) = handle(dispatcher, msg) {
        deliver(chan, unique, reply);
    }
}

/// How a /dev/fuse thread waits for its next request.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pacing {
    /// Set when the ring serves the requests and /dev/fuse only carries FORGETs
    /// and INTERRUPTs. After a FORGET the thread waits that long before it reads again, so the
    /// kernel queues the forgets meanwhile and hands them over as one BATCH_FORGET: one wake-up
    /// and one read for many inodes instead of one each. The first other request (the kernel
    /// fell back to /dev/fuse) ends the pauses for good.
    pub forget_pause: Option<Duration>,
    /// Set when /dev/fuse serves the requests (`AGENTFS_FUSE_SPIN_US`): poll this long for the
    /// next request before sleeping in read(2), while requests come back to back
    /// ([`Channel::spin`]).
    pub spin: Option<Duration>,
}

/// Serve requests on `chan` until the connection ends. Runs on each transport thread: it
/// reads a request and answers it itself when it only reads, or when another thread can be
/// spared to read the next one ([`Channel::spare`]) and the shard of its inode is free;
/// otherwise the shard's worker does.
///
/// A request larger than [`KEEP_RESIDENT`] (a large WRITE) leaves the buffer's tail resident
/// until the server has been idle ([`Channel::release_idle_buffers`]), so an idle server does
/// not hold a max_write buffer per thread.
pub fn serve_loop(
    chan: &Arc<Channel>,
    shards: &Arc<Shards>,
    dispatcher: &Dispatcher,
    buf_size: usize,
    pacing: Pacing,
) {
    let mut reader = Reader::new(chan);
    let mut buf = vec![0u8; buf_size];
    let mut pause_next = None;
    let mut forget_pause = pacing.forget_pause;
    loop {
        if let Some(pause) = pause_next.take() {
            std::thread::sleep(pause);
        }
        let polling = pacing.spin.map(|limit| {
            let idle_from = Instant::now();
            chan.spin(limit);
            (idle_from, limit)
        });
        let received = reader.receive(&mut buf);
        if let Some((idle_from, limit)) = polling {
            chan.arrived_after(idle_from.elapsed(), limit);
        }
        let n = match received {
            Ok(Received::Request(n)) => n,
            Ok(Received::Gone) | Ok(Received::Interrupted) => return,
            Err(e) => {
                tracing::error!("reading /dev/fuse failed: {e}");
                return;
            }
        };
        reader.filled(n);
        let msg = &buf[..n];
        let decoded = protocol::decode(msg);
        if let (Some(pause), Ok(req)) = (forget_pause, &decoded) {
            use crate::abi::Opcode as O;
            match O::from_u32(req.header.opcode) {
                Some(O::Forget | O::BatchForget) => pause_next = Some(pause),
                Some(O::Interrupt) => {}
                _ => forget_pause = None,
            }
        }
        let key = match decoded {
            Ok(req) if runs_inline(req.header.opcode) => {
                answer(chan, dispatcher, msg);
                continue;
            }
            Ok(req) => req.header.nodeid,
            // Malformed: answer (or drop) right here.
            Err(_) => {
                answer(chan, dispatcher, msg);
                continue;
            }
        };
        if let Some(spared) = chan.spare() {
            if let Some(answered) = shards.try_inline(key, |d| handle(d, msg)) {
                // Free the thread before the reply wakes the caller, whose next request may
                // reach another thread at once.
                drop(spared);
                if let Some((unique, reply)) = answered {
                    deliver(chan, unique, reply);
                }
                continue;
            }
        }
        let pool = crate::memory::pool::buffers();
        let mut owned = pool.take(msg.len());
        owned.extend_from_slice(msg);
        let chan = chan.clone();
        shards.submit(
            key,
            Box::new(move |d| {
                answer(&chan, d, &owned);
                pool.give(owned);
            }),
        );
    }
}
