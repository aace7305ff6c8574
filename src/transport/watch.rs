//! External changes: another process (`agentfs fs ... write`, `agentfs kv`, any SQLite client)
//! committed to a mounted database. A background thread polls [`Store::external_change`]
//! every `AGENTFS_EXTERNAL_POLL_MS`; on a change the store has already dropped its caches, and
//! this thread tells the kernel: FUSE_NOTIFY_INVAL_ENTRY for every name the server's caches
//! held that now resolves differently, then FUSE_NOTIFY_INVAL_INODE (attributes and page
//! cache) for the root and every inode the kernel holds a reference to. When the kernel speaks
//! protocol 7.44 or later, FUSE_NOTIFY_INC_EPOCH then makes it revalidate every name it
//! cached; with an older kernel, names the caches did not hold follow the entry timeout.
//!
//! Under the writeback cache the kernel keeps its own size and times of a regular file and
//! ignores the server's once the inode is cached (fuse_get_cache_mask), so an invalidation
//! alone never shows an external size change. With protocol 7.45, FUSE_NOTIFY_PRUNE then asks
//! the kernel to evict every referenced inode nobody is using (no open file, no working
//! directory): the next lookup builds it again from the server's attributes. A file that
//! stays open keeps the kernel's size until it is closed and evicted.
//!
//! The same thread tells the kernel about a failed commit that lost acknowledged operations
//! (the store's [`crate::store::Failure`] wakes it): FUSE_NOTIFY_INVAL_ENTRY for every name the
//! lost operations changed, then the same inode invalidations, epoch and prune as above, so
//! the kernel shows what the database holds instead of what it was told.
//!
//! Notifications go out from this thread only, never from a request handler: the kernel may
//! hold locks of the very inode a request is about while it waits for the reply, and an
//! invalidation of that inode would wait for them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::devfuse::Channel;
use crate::abi;
use crate::dispatch::{Dispatcher, Negotiated};
use crate::protocol::reply;
use crate::store::{ChangedName, Ino, Store};

/// The running poller; [`Watcher::stop`] joins it.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Watcher {
    /// Start polling every `interval` (zero: no polling, only failures), and watching for
    /// failed commits. None when no thread could start.
    pub fn start(
        store: Arc<Store>,
        dispatcher: Arc<Dispatcher>,
        chan: Arc<Channel>,
        interval: Duration,
        kernel: Negotiated,
    ) -> Option<Watcher> {
        let how = How {
            epoch: kernel.minor >= INC_EPOCH_MINOR,
            prune: kernel.minor >= PRUNE_MINOR && kernel.flags & abi::FUSE_WRITEBACK_CACHE != 0,
        };
        // The baseline: changes from now on are external.
        let mut poll = !interval.is_zero();
        if poll {
            if let Err(e) = store.external_change() {
                tracing::warn!("cannot watch the database for external changes: {e}");
                poll = false;
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let watched = store.clone();
        let thread = std::thread::Builder::new()
            .name("watch".into())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    if poll {
                        std::thread::park_timeout(interval);
                    } else {
                        std::thread::park();
                    }
                    if flag.load(Ordering::Acquire) {
                        break;
                    }
                    let mut told = true;
                    if let Some(names) = store.failure().take_untold() {
                        let why = "a failed commit undid acknowledged operations";
                        told = notify(&chan, why, &names, &dispatcher.kernel_inodes(), how);
                    }
                    if poll && told {
                        match store.external_change() {
                            Ok(Some(names)) => {
                                if let Err(e) = dispatcher.adopt_orphans() {
                                    tracing::warn!("reaping orphans left by another process: {e}");
                                }
                                let why = "database changed by another process";
                                let inodes = dispatcher.kernel_inodes();
                                told = notify(&chan, why, &names, &inodes, how);
                            }
                            Ok(None) => {}
                            Err(e) => tracing::warn!("checking for external changes failed: {e}"),
                        }
                    }
                    if !told {
                        break;
                    }
                }
            })
            .map_err(|e| tracing::error!("cannot start the external-change watcher: {e}"))
            .ok()?;
        let waker = thread.thread().clone();
        waker.unpark();
        watched
            .failure()
            .set_notify(Box::new(move || waker.unpark()));
        Some(Watcher { stop, thread })
    }

    pub fn stop(self) {
        self.stop.store(true, Ordering::Release);
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}

/// The protocol minors that introduced FUSE_NOTIFY_INC_EPOCH and FUSE_NOTIFY_PRUNE.
pub(crate) const INC_EPOCH_MINOR: u32 = 44;
const PRUNE_MINOR: u32 = 45;
/// Node ids per prune message (the kernel copies them in batches of this size).
const PRUNE_BATCH: usize = 512;

/// Which optional notifications the kernel understands and needs.
#[derive(Clone, Copy)]
struct How {
    epoch: bool,
    prune: bool,
}

/// Send the invalidations; false once the connection is gone.
fn notify(chan: &Channel, why: &str, names: &[ChangedName], inodes: &[Ino], how: How) -> bool {
    tracing::info!(
        "{why}: invalidating {} names and {} inodes",
        names.len(),
        inodes.len()
    );
    let messages = names
        .iter()
        .map(|(parent, name)| reply::notify_inval_entry(parent.0, name, 0))
        .chain(
            inodes
                .iter()
                .map(|ino| reply::notify_inval_inode(ino.0, 0, 0)),
        )
        .chain(how.epoch.then(reply::notify_inc_epoch))
        .chain(
            inodes
                .chunks(PRUNE_BATCH)
                .filter(|_| how.prune)
                .map(|c| reply::notify_prune(&c.iter().map(|i| i.0).collect::<Vec<_>>())),
        );
    for m in messages {
        match chan.send_raw(&m, &[]) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return false,
            Err(e) => tracing::warn!("invalidation notification failed: {e}"),
        }
    }
    true
}
