//! Sharded request workers.
//!
//! A request goes to the shard of its inode (the header's node id: the file for data and
//! attribute requests, the parent directory for namespace requests), so requests on one inode
//! run one at a time, in the order they reached the shard, while independent inodes proceed in
//! parallel. A shard's work runs on the transport thread that read the request when it can
//! ([`Shards::try_inline`]: nothing of that shard is queued or running, and the transport says
//! it can spare the thread), else on the shard's worker thread (`AGENTFS_FUSE_WORKERS` of them).
//! Running in place saves two thread hand-offs per request, each a cross-CPU wake-up that costs
//! tens of microseconds on a VM, and matters most for write-through WRITEs, where every
//! write(2) waits for its reply; the workers keep a blocked request (a barrier, a writer waiting
//! on the pending-byte cap) from stalling the transport. Namespace mutations stay totally
//! ordered and atomic because each is one transaction on the store's single writer; reads use
//! their own connections and never wait for a shard. With 0 workers, every request runs on the
//! transport thread that read it. A ring thread, the only reader of its CPU's queue, hands a
//! large READ to the least busy worker ([`Shards::submit_any`]) so that readahead's READs from
//! one CPU are served side by side, as /dev/fuse's threads serve them.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Sender};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};

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

/// A WRITE this long or shorter is latency-bound: run it in place when possible.
pub const LARGE_WRITE: usize = 64 * 1024;

/// A READ longer than this comes from readahead or a large read(2): a ring thread hands it to
/// a worker so that the next one can proceed beside it (see the ring's `is_large_read`).
pub const LARGE_READ: usize = 64 * 1024;

/// Whether a request may wait long in the server, so a transport thread that is the only
/// reader of its queue hands it to a worker instead of running it: barriers (a commit and an
/// fdatasync), and WRITEs over [`LARGE_WRITE`] bytes, which mostly come from the kernel's
/// writeback (no caller waits on one alone, and a hop costs little beside the copy) and are
/// the ones that wait when the pending-byte cap is reached. `len` is the request's length from
/// its header.
pub fn may_block(opcode: u32, len: u32) -> bool {
    use crate::abi::Opcode as O;
    match O::from_u32(opcode) {
        Some(O::Write) => len as usize > LARGE_WRITE,
        Some(
            O::Fsync
            | O::Fsyncdir
            | O::Syncfs
            | O::Fallocate
            | O::CopyFileRange
            | O::CopyFileRange64,
        ) => true,
        _ => false,
    }
}

/// One unit of work: decode, handle and reply to one request.
pub type Job = Box<dyn FnOnce(&Dispatcher) + Send>;

/// What every thread that runs a shard's work shares about it.
#[derive(Default)]
struct ShardState {
    /// Jobs sent to the worker and not yet finished.
    queued: AtomicUsize,
    /// Held while one of the shard's jobs runs, on its worker or inline.
    running: Mutex<()>,
}

/// The worker pool shared by every transport thread.
pub struct Shards {
    /// One queue per worker; emptied by [`Shards::stop`], after which jobs run inline.
    senders: RwLock<Vec<Sender<Job>>>,
    states: Vec<Arc<ShardState>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    dispatcher: Arc<Dispatcher>,
    /// Requests handed to a worker so far (the rest ran where they were read).
    handed: AtomicU64,
}

impl Shards {
    /// Start `workers` threads (0: run every job on the calling thread).
    pub fn start(workers: usize, dispatcher: Arc<Dispatcher>) -> Arc<Shards> {
        let mut senders = Vec::with_capacity(workers);
        let mut states = Vec::with_capacity(workers);
        let mut threads = Vec::with_capacity(workers);
        for i in 0..workers {
            let (tx, rx) = unbounded::<Job>();
            let d = dispatcher.clone();
            let state = Arc::new(ShardState::default());
            let st = state.clone();
            match std::thread::Builder::new()
                .name(format!("worker-{i}"))
                .spawn(move || {
                    for job in rx {
                        let running = st.running.lock();
                        // The dispatcher answers a panicking request itself; this keeps the
                        // worker and its shard's count alive if a job panics elsewhere.
                        let ran = std::panic::catch_unwind(AssertUnwindSafe(|| job(&d)));
                        drop(running);
                        st.queued.fetch_sub(1, Ordering::Release);
                        if ran.is_err() {
                            tracing::error!("a job of worker {i} panicked; the worker goes on");
                        }
                    }
                }) {
                Ok(h) => {
                    senders.push(tx);
                    states.push(state);
                    threads.push(h);
                }
                Err(e) => tracing::error!("cannot start worker {i}: {e}"),
            }
        }
        Arc::new(Shards {
            senders: RwLock::new(senders),
            states,
            threads: Mutex::new(threads),
            dispatcher,
            handed: AtomicU64::new(0),
        })
    }

    /// The shard of inode `key` among `workers` running ones (index and state); None when
    /// there are none, and the caller runs its work itself.
    fn shard(&self, key: u64, workers: usize) -> Option<(usize, &ShardState)> {
        if workers == 0 {
            return None;
        }
        let i = shard_of(key, workers);
        self.states.get(i).map(|s| (i, s.as_ref()))
    }

    /// Run `job` on the shard that owns inode `key`, or inline when there are no workers.
    pub fn submit(&self, key: u64, job: Job) {
        let senders = self.senders.read();
        match self.shard(key, senders.len()) {
            Some((shard, _)) => self.send(senders, shard, job),
            None => {
                drop(senders);
                job(&self.dispatcher);
            }
        }
    }

    /// Run `job`, which needs no shard's order, on the worker with the fewest jobs queued (the
    /// first such one), or inline when there are none. Its shard's later jobs wait behind it.
    pub fn submit_any(&self, job: Job) {
        let senders = self.senders.read();
        let least = (self.states.iter().take(senders.len()).enumerate())
            .min_by_key(|(_, s)| s.queued.load(Ordering::Acquire))
            .map(|(i, _)| i);
        match least {
            Some(i) => self.send(senders, i, job),
            None => {
                drop(senders);
                job(&self.dispatcher);
            }
        }
    }

    /// Queue `job` on worker `i` (a running one: `i < senders.len()`); run it here if the worker
    /// stopped meanwhile.
    fn send(&self, senders: RwLockReadGuard<'_, Vec<Sender<Job>>>, i: usize, job: Job) {
        let (Some(state), Some(sender)) = (self.states.get(i), senders.get(i)) else {
            drop(senders);
            job(&self.dispatcher);
            return;
        };
        state.queued.fetch_add(1, Ordering::Acquire);
        match sender.send(job) {
            Ok(()) => {
                self.handed.fetch_add(1, Ordering::Relaxed);
            }
            Err(back) => {
                drop(senders);
                state.queued.fetch_sub(1, Ordering::Release);
                (back.into_inner())(&self.dispatcher);
            }
        }
    }

    /// Requests handed to a worker so far.
    pub fn handed(&self) -> u64 {
        self.handed.load(Ordering::Relaxed)
    }

    /// Run `f` on the calling thread as the shard of inode `key`, if that keeps the shard's
    /// order: nothing of the shard is queued or running (else `None`, and the caller submits).
    /// Without workers (none configured, or stopped) it always runs here.
    pub fn try_inline<R>(&self, key: u64, f: impl FnOnce(&Dispatcher) -> R) -> Option<R> {
        let workers = self.senders.read().len();
        let Some((_, state)) = self.shard(key, workers) else {
            return Some(f(&self.dispatcher));
        };
        if state.queued.load(Ordering::Acquire) != 0 {
            return None;
        }
        let running = state.running.try_lock()?;
        // A job queued between the check and the lock would run after this one; both reached
        // the shard concurrently, so either order is an arrival order.
        let out = f(&self.dispatcher);
        drop(running);
        Some(out)
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

    fn pool(workers: usize) -> (tempfile::TempDir, Arc<Shards>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fs.db");
        crate::store::Store::create(&path, &Default::default()).unwrap();
        let store = crate::store::Store::open(&path, false).unwrap();
        let d = Dispatcher::new(Arc::new(store), crate::knobs::get());
        (dir, Shards::start(workers, Arc::new(d)))
    }

    /// Two inode numbers that share a shard and one that does not.
    fn keys(shards: usize) -> (u64, u64, u64) {
        let a = 1;
        let same = (2..)
            .find(|&k| shard_of(k, shards) == shard_of(a, shards))
            .unwrap();
        let other = (2..)
            .find(|&k| shard_of(k, shards) != shard_of(a, shards))
            .unwrap();
        (a, same, other)
    }

    #[test]
    fn a_free_shard_runs_in_place_a_busy_one_keeps_its_order() {
        let (_dir, shards) = pool(2);
        let (a, same, other) = keys(2);
        assert_eq!(
            shards.try_inline(a, |_| 1),
            Some(1),
            "a free shard runs here"
        );
        // Occupy a's shard with a job that waits for a signal.
        let (started_tx, started) = crossbeam_channel::bounded::<()>(1);
        let (go, go_rx) = crossbeam_channel::bounded::<()>(1);
        shards.submit(
            a,
            Box::new(move |_| {
                started_tx.send(()).unwrap();
                go_rx.recv().unwrap();
            }),
        );
        started.recv().unwrap();
        assert_eq!(
            shards.try_inline(a, |_| 2),
            None,
            "a running job keeps the shard"
        );
        assert_eq!(
            shards.try_inline(same, |_| 3),
            None,
            "for every inode of the shard"
        );
        assert_eq!(
            shards.try_inline(other, |_| 4),
            Some(4),
            "other shards are free"
        );
        // A job queued behind the running one also keeps the shard until it ran.
        let (ran_tx, ran) = crossbeam_channel::bounded::<()>(1);
        shards.submit(same, Box::new(move |_| ran_tx.send(()).unwrap()));
        go.send(()).unwrap();
        ran.recv().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while shards.try_inline(a, |_| ()).is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the shard never came free"
            );
            std::thread::yield_now();
        }
        assert_eq!(shards.handed(), 2);
        shards.stop();
        assert_eq!(
            shards.try_inline(a, |_| 5),
            Some(5),
            "stopped: everything runs here"
        );
    }

    #[test]
    fn a_panicking_job_leaves_its_worker_and_shard_serving() {
        let (_dir, shards) = pool(1);
        shards.submit(1, Box::new(|_| panic!("injected")));
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        shards.submit(1, Box::new(move |_| tx.send(()).unwrap()));
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the next job ran on the same worker");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while shards.try_inline(1, |_| ()).is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the shard never came free after a panic"
            );
            std::thread::yield_now();
        }
        assert_eq!(shards.handed(), 2, "both jobs went to the worker");
        shards.stop();
    }

    #[test]
    fn without_workers_everything_runs_in_place() {
        let (_dir, shards) = pool(0);
        assert_eq!(shards.try_inline(7, |_| 1), Some(1));
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        shards.submit(7, Box::new(move |_| tx.send(()).unwrap()));
        assert!(rx.try_recv().is_ok(), "submit ran the job before returning");
        assert_eq!(shards.handed(), 0);
    }

    /// A job without a shard goes to the worker with the fewest queued jobs, so two of them
    /// run side by side while one worker is busy; without workers it runs in place.
    #[test]
    fn a_job_without_a_shard_goes_to_the_least_busy_worker() {
        let (_dir, shards) = pool(2);
        let (a, _, _) = keys(2);
        let (go, wait) = crossbeam_channel::bounded::<()>(0);
        shards.submit(a, Box::new(move |_| wait.recv().unwrap()));
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        shards.submit_any(Box::new(move |_| tx.send(()).unwrap()));
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("ran on the idle worker while the other waits");
        go.send(()).unwrap();
        assert_eq!(shards.handed(), 2);
        shards.stop();
        let (_dir, none) = pool(0);
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        none.submit_any(Box::new(move |_| tx.send(()).unwrap()));
        assert!(rx.try_recv().is_ok(), "no workers: it ran before returning");
    }

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
