//! Sharded request workers.
//!
//! Transport threads only move bytes; the work runs on `AGENTFS_FUSE_WORKERS` worker threads,
//! each owning a queue. A request goes to the shard of its inode (the header's node id: the
//! file for data and attribute requests, the parent directory for namespace requests), so
//! requests on one inode run in arrival order while independent inodes proceed in parallel.
//! Namespace mutations stay totally ordered and atomic because each is one transaction on the
//! store's single writer; reads use their own connections and never wait for a worker of
//! another shard. With 0 workers, requests run on the transport thread that read them.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Sender};
use parking_lot::{Mutex, RwLock};

use super::Dispatcher;

/// Whether a request runs on the transport thread that read it instead of a worker: requests
/// that only read (answered from a read connection in microseconds, where a hop to a worker
/// would double the latency), those that carry no reply (FORGET, INTERRUPT) and session
/// requests (INIT, DESTROY). Mutations go to the shard of their inode.
pub fn runs_inline(opcode: u32) -> bool {
    use crate::abi::Opcode as O;
    matches!(
        O::from_u32(opcode),
        Some(
            O::Lookup
                | O::Getattr
                | O::Readlink
                | O::Statfs
                | O::Read
                | O::Readdir
                | O::Readdirplus
                | O::Getxattr
                | O::Listxattr
                | O::Access
                | O::Open
                | O::Opendir
                | O::Release
                | O::Releasedir
                | O::Flush
                | O::Forget
                | O::BatchForget
                | O::Interrupt
                | O::Init
                | O::Destroy
        )
    )
}

/// One unit of work: decode, handle and reply to one request.
pub type Job = Box<dyn FnOnce(&Dispatcher) + Send>;

/// The worker pool shared by every transport thread.
pub struct Shards {
    /// One queue per worker; emptied by [`Shards::stop`], after which jobs run inline.
    senders: RwLock<Vec<Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    dispatcher: Arc<Dispatcher>,
}

impl Shards {
    /// Start `workers` threads (0: run every job on the calling thread).
    pub fn start(workers: usize, dispatcher: Arc<Dispatcher>) -> Arc<Shards> {
        let mut senders = Vec::with_capacity(workers);
        let mut threads = Vec::with_capacity(workers);
        for i in 0..workers {
            let (tx, rx) = unbounded::<Job>();
            let d = dispatcher.clone();
            match std::thread::Builder::new()
                .name(format!("worker-{i}"))
                .spawn(move || {
                    for job in rx {
                        job(&d);
                    }
                }) {
                Ok(h) => {
                    senders.push(tx);
                    threads.push(h);
                }
                Err(e) => tracing::error!("cannot start worker {i}: {e}"),
            }
        }
        Arc::new(Shards {
            senders: RwLock::new(senders),
            threads: Mutex::new(threads),
            dispatcher,
        })
    }

    /// Run `job` on the shard that owns inode `key`, or inline when there are no workers.
    pub fn submit(&self, key: u64, job: Job) {
        let senders = self.senders.read();
        if senders.is_empty() {
            drop(senders);
            job(&self.dispatcher);
            return;
        }
        let shard = shard_of(key, senders.len());
        if let Err(back) = senders[shard].send(job) {
            drop(senders);
            (back.into_inner())(&self.dispatcher);
        }
    }

    /// The dispatcher the workers run requests on.
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    /// Finish every queued job and join the workers.
    pub fn stop(&self) {
        self.senders.write().clear();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

/// Spread inode numbers (often consecutive) evenly over the shards.
fn shard_of(key: u64, shards: usize) -> usize {
    let mixed = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((mixed >> 32) as usize) % shards.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_inodes_spread_over_shards() {
        let mut hits = [0usize; 4];
        for ino in 1..=4000u64 {
            hits[shard_of(ino, 4)] += 1;
        }
        assert!(hits.iter().all(|&h| h > 800), "{hits:?}");
        assert_eq!(shard_of(7, 1), 0);
    }
}
