//! One memory budget (`AGENTFS_MEMORY_BUDGET_MIB`) shared by every cache and buffer of a
//! server, and the figures `agentfs status` shows of it.
//!
//! The budget is split into four equal shares, each bounded by its consumer:
//!
//! * SQLite: the page caches of all connections together. The share is SQLite's soft heap
//!   limit (process-wide: past it, the page cache recycles its own pages instead of growing),
//!   and no single connection's `cache_size` exceeds it (nor `AGENTFS_SQLITE_CACHE_KIB`).
//! * Caches: the server's attribute, lookup and listing caches, weighed in bytes (a quarter,
//!   a quarter and half of the share).
//! * Batches: acknowledged-but-uncommitted WRITE data (`AGENTFS_BATCH_MAX_PENDING_MIB` caps it
//!   further); at the cap writers wait for a commit, which starts at half of it. A quarter of
//!   this share also bounds the free large buffers kept for reuse ([`pool`]): committed WRITE
//!   data and copied-out READ replies, handed to the next ones instead of mapped afresh.
//! * Transport: request buffers. A ring entry's payload must hold max_write bytes (the kernel
//!   refuses a smaller one), so the ring's depth per queue is what the share holds
//!   (`AGENTFS_FUSE_URING_DEPTH` caps it, at least one entry); the /dev/fuse threads' buffers
//!   count against the same share.
//!
//! What the budget does not hold is a fixed overhead: the program's text, thread stacks,
//! prepared statements and the allocator's own slack (measured in kernel-notes/memory.md).

use crate::knobs::Knobs;

pub mod pool;

const MIB: u64 = 1024 * 1024;

/// The budget's shares, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shares {
    pub total: u64,
    pub sqlite: u64,
    pub caches: u64,
    pub batch: u64,
    pub transport: u64,
}

impl Shares {
    pub fn from_knobs(k: &Knobs) -> Shares {
        Self::of(k.memory_budget_mib.saturating_mul(MIB))
    }

    /// Four equal shares of `total` bytes.
    pub fn of(total: u64) -> Shares {
        let q = total / 4;
        Shares {
            total,
            sqlite: q,
            caches: q,
            batch: q,
            transport: total - 3 * q,
        }
    }

    /// Each connection's page cache, in KiB: the SQLite share, at most the per-connection knob.
    pub fn sqlite_cache_kib(&self, k: &Knobs) -> u64 {
        (self.sqlite / 1024).clamp(64, k.sqlite_cache_kib.max(64))
    }

    /// Ring entries per queue: as many max_write payloads as the transport share holds once
    /// the /dev/fuse threads' buffers are counted, at least one, at most the depth knob.
    pub fn ring_depth(&self, k: &Knobs, queues: usize, payload: usize) -> usize {
        let devfuse = k.fuse_threads.saturating_mul(devfuse_buffer(k) as u64);
        let per_entry = (queues.max(1) as u64).saturating_mul(payload as u64 + 4096);
        let fits = self.transport.saturating_sub(devfuse) / per_entry.max(1);
        (fits as usize).clamp(1, k.fuse_uring_depth.max(1) as usize)
    }
}

impl Shares {
    /// Background requests (writeback WRITEs, readahead) the kernel may have outstanding at
    /// once: each may be a max_write copy queued for a worker, so as many as the batches'
    /// share holds, between 4 and 64 (the kernel queues the rest itself).
    pub fn max_background(&self, max_write: u32) -> u16 {
        let n = self.batch / u64::from(max_write.max(4096));
        n.clamp(4, 64) as u16
    }
}

/// The buffer each /dev/fuse thread reads requests into: the largest WRITE and its header.
pub fn devfuse_buffer(k: &Knobs) -> usize {
    k.fuse_max_write as usize + 64 * 1024
}

/// Where a server's memory goes, as published in its status record (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Resident set of the whole process (/proc/self/statm).
    pub rss: u64,
    /// The budget.
    pub budget: u64,
    /// What SQLite holds now, all connections together (sqlite3_memory_used).
    pub sqlite: u64,
    /// Attribute, lookup and listing caches, by their weight.
    pub caches: u64,
    /// Acknowledged WRITE data not yet committed.
    pub batch: u64,
    /// Request buffers: ring entries' payloads and the /dev/fuse threads' buffers.
    pub transport: u64,
    /// Free large buffers kept for reuse ([`pool`]).
    pub buffers: u64,
}

/// Watches a server for idleness and keeps its memory figures.
pub struct Idle {
    after: std::time::Duration,
    budget: u64,
    transport: u64,
    /// Requests served when last seen, since when that count stands, and whether memory was
    /// given back since.
    last: parking_lot::Mutex<(u64, std::time::Instant, bool)>,
}

impl Idle {
    /// `transport`: bytes of the request buffers the transport holds.
    pub fn new(k: &Knobs, transport: u64) -> Idle {
        Idle {
            after: std::time::Duration::from_millis(k.memory_idle_ms),
            budget: Shares::from_knobs(k).total,
            transport,
            last: parking_lot::Mutex::new((u64::MAX, std::time::Instant::now(), false)),
        }
    }

    /// Called periodically with the count of requests served: once no request arrived for the
    /// idle period, the caches shrink to their floor and freed memory goes back to the system
    /// (once per idle period). Pending WRITE data is left to the committer. `background`: the
    /// server did work of its own since the last call (an idle vacuum step, which fills the
    /// writer's page cache); the give-back waits until that work has ended, and comes again
    /// after it when it came before. True when it gave memory back now (the caller then has the
    /// transport threads hand back their buffers' tails).
    pub fn tick(&self, served: u64, background: bool, store: &crate::store::Store) -> bool {
        let mut last = self.last.lock();
        if last.0 != served {
            *last = (served, std::time::Instant::now(), false);
            return false;
        }
        if background {
            last.2 = false;
            return false;
        }
        if last.2 || last.1.elapsed() < self.after {
            return false;
        }
        last.2 = true;
        let before = crate::sys::memory::rss(None).unwrap_or(0);
        if let Err(e) = store.release_memory() {
            tracing::warn!("shrinking SQLite's memory failed: {e}");
        }
        pool::buffers().clear();
        crate::sys::memory::trim();
        let after = crate::sys::memory::rss(None).unwrap_or(0);
        tracing::info!(
            "idle: resident memory {} KiB -> {} KiB",
            before / 1024,
            after / 1024
        );
        true
    }

    /// Where memory goes now.
    pub fn usage(&self, store: &crate::store::Store) -> Usage {
        Usage {
            rss: crate::sys::memory::rss(None).unwrap_or(0),
            budget: self.budget,
            sqlite: crate::sys::memory::sqlite_used(),
            caches: store.cache_bytes(),
            batch: store.pending_bytes(),
            transport: self.transport,
            buffers: pool::buffers().bytes() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_and_ring_depth_follows_the_budget() {
        let k = crate::knobs::Knobs::defaults();
        let s = Shares::of(64 * MIB);
        assert_eq!(s.sqlite + s.caches + s.batch + s.transport, 64 * MIB);
        // 16 MiB for the transport: two /dev/fuse buffers of 1.06 MiB, then 1 MiB entries on
        // two queues.
        assert_eq!(s.ring_depth(&k, 2, 1 << 20), 6);
        assert_eq!(Shares::of(8 * MIB).ring_depth(&k, 2, 1 << 20), 1);
        assert_eq!(
            Shares::of(1024 * MIB).ring_depth(&k, 2, 1 << 20),
            k.fuse_uring_depth as usize
        );
        assert_eq!(Shares::of(8 * MIB).sqlite_cache_kib(&k), 2048);
        assert_eq!(Shares::of(64 * MIB).max_background(1 << 20), 16);
        assert_eq!(Shares::of(8 * MIB).max_background(1 << 20), 4);
        assert_eq!(Shares::of(64 * MIB).max_background(128 << 10), 64);
        assert_eq!(
            Shares::of(1024 * MIB).sqlite_cache_kib(&k),
            k.sqlite_cache_kib
        );
    }
}
