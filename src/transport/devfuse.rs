//! The classic transport: threads that read(2) requests from /dev/fuse and writev(2) replies.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::dispatch::shards::{runs_inline, Shards};
use crate::dispatch::Dispatcher;
use crate::protocol::{self, Reply};

/// A FUSE connection: the /dev/fuse file descriptor (opened close-on-exec).
pub struct Channel {
    fd: OwnedFd,
    /// Requests answered through this channel.
    pub served: AtomicU64,
    /// Transport threads blocked in [`Channel::receive`], ready for the next request.
    waiting: AtomicUsize,
}

/// What a read from the channel produced.
pub enum Received {
    /// A request of this many bytes is in the buffer.
    Request(usize),
    /// The filesystem was unmounted or the connection aborted.
    Gone,
}

impl Channel {
    pub fn new(fd: OwnedFd) -> Self {
        Self {
            fd,
            served: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
        }
    }

    /// The descriptor, for the io_uring transport's SQEs (it stays owned by the channel).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }

    /// Read one request. Retries on EINTR/EAGAIN and on ENOENT (a request interrupted before
    /// we read it).
    pub fn receive(&self, buf: &mut [u8]) -> io::Result<Received> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let got = self.receive_one(buf);
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        got
    }

    /// Whether another transport thread is waiting for a request, so this one may spend time
    /// on the request it holds without delaying the next.
    pub fn reader_waiting(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }

    fn receive_one(&self, buf: &mut [u8]) -> io::Result<Received> {
        loop {
            // SAFETY: `buf` is valid for writes of buf.len() bytes; the fd is open.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                return Ok(Received::Request(n as usize));
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ENOENT) => continue,
                Some(libc::ENODEV) | Some(libc::ECONNABORTED) => return Ok(Received::Gone),
                _ => return Err(err),
            }
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

/// Decode, handle and answer one whole request.
fn answer(chan: &Channel, dispatcher: &Dispatcher, msg: &[u8]) {
    let (unique, reply) = match protocol::decode(msg) {
        Ok(req) => (req.header.unique, dispatcher.handle(&req)),
        Err(e) => match e.unique {
            Some(u) => {
                tracing::warn!("malformed request {u}: {}", e.why);
                (u, Reply::Error(e.errno))
            }
            None => {
                tracing::warn!("unreadable request header ({} bytes): {}", msg.len(), e.why);
                return;
            }
        },
    };
    chan.served.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = chan.send(unique, &reply) {
        if e.raw_os_error() != Some(libc::ENODEV) {
            tracing::warn!("reply to request {unique} failed: {e}");
        }
    }
}

/// Serve requests on `chan` until the connection ends. Runs on each transport thread: it
/// reads a request and answers it itself when it only reads, or when another thread is ready
/// to read the next one and the shard of its inode is free; otherwise the shard's worker does.
pub fn serve_loop(
    chan: &Arc<Channel>,
    shards: &Arc<Shards>,
    dispatcher: &Dispatcher,
    buf_size: usize,
) {
    let mut buf = vec![0u8; buf_size];
    loop {
        let n = match chan.receive(&mut buf) {
            Ok(Received::Request(n)) => n,
            Ok(Received::Gone) => return,
            Err(e) => {
                tracing::error!("reading /dev/fuse failed: {e}");
                return;
            }
        };
        let msg = &buf[..n];
        let key = match protocol::decode(msg) {
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
        if chan.reader_waiting() && shards.try_inline(key, |d| answer(chan, d, msg)).is_some() {
            continue;
        }
        let owned = msg.to_vec();
        let chan = chan.clone();
        shards.submit(key, Box::new(move |d| answer(&chan, d, &owned)));
    }
}
