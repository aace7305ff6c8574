//! A server: the store opened and locked, the filesystem built on it, INIT negotiated on a FUSE
//! connection, requests served on several threads, and a clean shutdown (join every thread, make
//! everything durable, checkpoint the WAL). `agentfs mount` mounts first and hands its
//! connection here; the sandbox receives its connection from inside its mount namespace.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::abi;
use crate::dispatch::shards::Shards;
use crate::dispatch::{Dispatcher, Filesystem, Negotiated};
use crate::knobs::Knobs;
use crate::overlay::Overlay;
use crate::protocol::{self, Operation};
use crate::store::Store;
use crate::sys::{lock, mount, mounts, registry, signals};
use crate::transport::devfuse::{self, Channel, Received};
use crate::transport::{uring, watch};

/// Why a server could not start or lost work; printed as one line.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Mount(#[from] mount::MountError),
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("FUSE handshake failed: {0}")]
    Handshake(String),
    /// A commit failed after the work it carried was acknowledged (SPEC.md "Durability").
    #[error("{0}")]
    Lost(String),
    #[error("{0}")]
    Other(String),
}

/// Reports the moment the mount is live (used by the background launcher).
pub trait Ready {
    fn ready(&mut self, mount_point: &Path);
}

impl Ready for () {
    fn ready(&mut self, _: &Path) {}
}

/// A database opened for serving: locked, orphans reaped, the filesystem (plain or overlay)
/// built on it. Nothing is mounted yet.
pub struct Prepared {
    db: PathBuf,
    _lock: lock::DbLock,
    store: Arc<Store>,
    fs: Arc<dyn Filesystem>,
}

/// How a prepared server runs once it has its connection.
pub struct ServeOptions {
    /// Where the filesystem is mounted (as the mounting process sees it).
    pub mount_point: PathBuf,
    /// Keep a status record for `agentfs status` / `agentfs umount` (a host mount).
    pub register: bool,
    /// Where a background server's standard error goes (shown by `agentfs status`).
    pub log: Option<PathBuf>,
    /// Unmount `mount_point` on SIGINT, SIGTERM or SIGHUP (the caller blocked them).
    pub unmount_on_signal: bool,
    /// Show every inode as owned by this uid and gid, and give them every new inode (the
    /// sandbox: its command's ids as the mount's user namespace maps them). None: the stored
    /// owners, and new inodes belong to whoever creates them.
    pub owner: Option<(u32, u32)>,
    /// What the server refuses by path (a sandbox's fence inside its project); None: nothing.
    pub guard: Option<Arc<crate::dispatch::guard::Guard>>,
    /// Which device the mount is, for its readahead.
    pub device: MountDevice,
}

/// The device (major, minor) of the server's mount, whose readahead it raises after INIT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountDevice {
    /// `mount_point` in this process's mount table (a mount made here).
    AtMountPoint,
    /// Known to whoever made the mount: a sandbox's is in another mount namespace, where
    /// `mount_point` names the host directory under it (whose own device must not be touched).
    Known(u32, u32),
    /// Not known: the kernel's readahead stays.
    Unknown,
}

/// Lock and open the database at `db` and build the filesystem it holds.
pub fn prepare(db: &Path, readonly: bool, knobs: &Knobs) -> Result<Prepared, ServerError> {
    crate::sys::memory::return_large_frees();
    let db = std::fs::canonicalize(db).unwrap_or_else(|_| db.to_path_buf());
    let lock = lock::lock_db(&db)?;
    let store = Arc::new(Store::open(&db, readonly)?);
    if !readonly {
        match store.reap_orphans() {
            Ok(0) => {}
            Ok(n) => tracing::info!("reaped {n} orphaned inodes left by an earlier crash"),
            Err(e) => return Err(ServerError::Other(format!("reaping orphans: {e}"))),
        }
    }
    let fs: Arc<dyn Filesystem> = match store.overlay_config() {
        Ok(None) => store.clone(),
        Ok(Some(ov)) => {
            let cap = knobs.fuse_ino_files_cap as usize;
            let o = Overlay::open(store.clone(), &ov, cap).map_err(ServerError::Other)?;
            tracing::info!("overlay mode: base {}", ov.base_path.display());
            Arc::new(o)
        }
        Err(e) => return Err(ServerError::Other(e)),
    };
    Ok(Prepared {
        db,
        _lock: lock,
        store,
        fs,
    })
}

impl Prepared {
    /// The database, canonical.
    pub fn db(&self) -> &Path {
        &self.db
    }

    /// The store the server will serve (its barrier is `Store::sync`).
    pub fn store(&self) -> Arc<Store> {
        self.store.clone()
    }

    /// Serve the FUSE connection `fd` until the kernel closes it (unmount, or the last
    /// process of a sandbox's mount namespace exits). Returns after a clean shutdown, or with
    /// [`ServerError::Lost`] when a failed commit lost acknowledged work.
    pub fn serve(
        self,
        fd: OwnedFd,
        opts: &ServeOptions,
        knobs: &Knobs,
        ready: &mut dyn Ready,
    ) -> Result<(), ServerError> {
        let Prepared {
            db,
            store,
            fs,
            _lock,
        } = self;
        let mnt = opts.mount_point.clone();
        let chan = Arc::new(Channel::new(fd));
        let dispatcher = Arc::new(Dispatcher::new(fs, knobs));
        if let Some((uid, gid)) = opts.owner {
            dispatcher.set_owner(crate::store::Caller { uid, gid });
        }
        if let Some(g) = &opts.guard {
            dispatcher.set_guard(g.clone());
        }
        let notify_chan = chan.clone();
        dispatcher.set_notifier(Box::new(move |m| {
            if let Err(e) = notify_chan.send_raw(m, &[]) {
                if e.raw_os_error() != Some(libc::ENODEV) {
                    tracing::warn!("notification failed: {e}");
                }
            }
        }));

        let Handshake { negotiated, queues } = handshake(&chan, &dispatcher, knobs)?;
        // After the INIT reply: the kernel set the readahead from it, capped at 128 KiB.
        if knobs.fuse_readahead_kib > 0 {
            let device = match opts.device {
                MountDevice::AtMountPoint => mounts::find(&mnt).map(|m| (m.major, m.minor)),
                MountDevice::Known(major, minor) => Some((major, minor)),
                MountDevice::Unknown => None,
            };
            if let Some(Err(e)) = device.map(|d| mount::set_readahead(d, knobs.fuse_readahead_kib))
            {
                tracing::debug!("readahead left at the kernel's default: {e}");
            }
        }
        let ring_stats = Arc::new(uring::RingStats::default());
        let buf_size = negotiated.max_write as usize + 64 * 1024;
        let threads = knobs.fuse_threads.max(1) as usize;
        let transport_bytes = uring::mapped_bytes(&queues) + (threads * buf_size) as u64;
        let ring_queues = queues.len();
        let shards = Shards::start(knobs.fuse_workers as usize, dispatcher.clone());
        let mut workers = uring::start(queues, chan.raw_fd(), shards.clone(), ring_stats.clone());
        tracing::info!(
            "mounted {} on {} (protocol 7.{}, max_write {}, transport {})",
            db.display(),
            mnt.display(),
            negotiated.minor,
            negotiated.max_write,
            if ring_queues > 0 {
                format!("io-uring with {ring_queues} queues, /dev/fuse for forgets")
            } else {
                "/dev/fuse".to_string()
            }
        );
        let reporter = Reporter {
            record: registry::ServerRecord {
                pid: std::process::id(),
                db: db.clone(),
                mount_point: mnt.clone(),
                ring_queues,
                log: opts.log.clone(),
                ..Default::default()
            },
            store: store.clone(),
            chan: chan.clone(),
            ring: ring_stats.clone(),
            shards: shards.clone(),
            served: std::sync::atomic::AtomicU64::new(u64::MAX),
            memory: crate::memory::Idle::new(knobs, transport_bytes),
        };
        let record = if opts.register {
            reporter.write()
        } else {
            None
        };
        let watcher = watch::Watcher::start(
            store.clone(),
            dispatcher.clone(),
            chan.clone(),
            std::time::Duration::from_millis(knobs.external_poll_ms),
            negotiated,
        );
        ready.ready(&mnt);

        let micros =
            |on: bool, us: u64| (on && us > 0).then(|| std::time::Duration::from_micros(us));
        let pacing = devfuse::Pacing {
            forget_pause: micros(ring_queues > 0, knobs.fuse_forget_pause_us),
            spin: micros(ring_queues == 0, knobs.fuse_spin_us),
        };
        for i in 0..threads {
            let chan = chan.clone();
            let d = dispatcher.clone();
            let sh = shards.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("fuse-{i}"))
                .spawn(move || devfuse::serve_loop(&chan, &sh, &d, buf_size, pacing));
            match spawned {
                Ok(h) => workers.push(h),
                Err(e) => tracing::error!("cannot start transport thread {i}: {e}"),
            }
        }
        if opts.unmount_on_signal {
            let signal_mnt = mnt.clone();
            let _ = std::thread::Builder::new()
                .name("signals".into())
                .spawn(move || {
                    let sig = signals::wait_shutdown_signal();
                    tracing::info!("signal {sig}: unmounting {}", signal_mnt.display());
                    unmount_for_shutdown(&signal_mnt);
                });
        }
        // Dropping `stop` wakes the status thread at once (shutdown does not wait out a tick).
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let reporter_thread = {
            let step = knobs.vacuum_step_pages;
            let register = opts.register;
            std::thread::Builder::new()
                .name("status".into())
                .spawn(move || {
                    let tick = std::time::Duration::from_millis(500);
                    while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                        stopped.recv_timeout(tick)
                    {
                        let vacuumed = reporter.idle_vacuum(step);
                        if reporter
                            .memory
                            .tick(reporter.served(), vacuumed, &reporter.store)
                        {
                            reporter.chan.release_idle_buffers();
                        }
                        if register {
                            reporter.write();
                        }
                    }
                })
                .ok()
        };
        for w in workers {
            let _ = w.join();
        }
        // Transport threads are gone; let the workers finish what they hold.
        shards.stop();
        if let Some(w) = watcher {
            w.stop();
        }
        drop(stop);
        if let Some(t) = reporter_thread {
            let _ = t.join();
        }
        // The connection is gone, and with it every reference the kernel held: an orphan whose
        // last FORGET was still queued in the kernel (or paused, see `serve_loop`) goes now,
        // not at the next mount.
        if store.failure().summary().is_none() {
            match store.reap_orphans() {
                Ok(_) | Err(crate::errno::Errno::EROFS) => {}
                Err(e) => tracing::warn!("reaping orphans at unmount: {e}"),
            }
        }
        // Every request has been answered. Make it all durable, hand free pages back, and fold
        // the WAL into the main file, also after a failed commit (the database is consistent).
        let synced = store.sync();
        let checkpointed = match &synced {
            Ok(()) if store.failure().summary().is_none() => store
                .give_back(None, knobs.vacuum_free_percent)
                .and_then(|_| store.checkpoint()),
            _ => store.checkpoint(),
        };
        let result = match (store.failure().summary(), synced, checkpointed) {
            (Some(lost), _, _) => Err(ServerError::Lost(lost)),
            (None, Err(e), _) => Err(ServerError::Other(format!("final sync failed: {e}"))),
            (None, Ok(()), Err(e)) => {
                Err(ServerError::Other(format!("final checkpoint failed: {e}")))
            }
            (None, Ok(()), Ok(())) => Ok(()),
        };
        if let Err(e) = &result {
            tracing::error!("{e}");
        }
        if let Some(p) = record {
            let failure = result.as_ref().err().map(|e| e.to_string());
            if let Err(e) = registry::record_exit(std::process::id(), failure.as_deref()) {
                tracing::warn!("cannot leave the outcome for agentfs umount: {e}");
            }
            let _ = std::fs::remove_file(p);
        }
        tracing::info!(
            "served {} requests over /dev/fuse and {} over io_uring",
            chan.served.load(std::sync::atomic::Ordering::Relaxed),
            ring_stats.served.load(std::sync::atomic::Ordering::Relaxed)
        );
        result
    }
}

/// Unmount at shutdown: a normal unmount, and when busy a lazy one (open files keep being
/// served until closed).
fn unmount_for_shutdown(mnt: &Path) {
    if mount::unmount(mnt, false).is_ok() {
        return;
    }
    if let Err(e) = mount::unmount(mnt, true) {
        tracing::error!("unmounting {} failed: {e}", mnt.display());
        if let Some(m) = mounts::find(mnt) {
            let _ = mounts::abort_connection(&m);
        }
    }
}

/// Keeps the server's status record current: transport, requests served on each, and the
/// database's free-page share; hands free pages back while the mount is idle.
struct Reporter {
    record: registry::ServerRecord,
    store: Arc<Store>,
    chan: Arc<Channel>,
    ring: Arc<uring::RingStats>,
    shards: Arc<Shards>,
    /// Requests served at the last tick (idle: no request since).
    served: std::sync::atomic::AtomicU64,
    /// The memory budget's figures and the idle give-back.
    memory: crate::memory::Idle,
}

impl Reporter {
    fn served(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        self.chan.served.load(Relaxed) + self.ring.served.load(Relaxed)
    }

    /// One vacuum step (at most `step` pages) when no request arrived since the last tick and
    /// nothing is pending.
    /// Whether pages were handed back this time (the writer's page cache filled doing it).
    fn idle_vacuum(&self, step: u64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let now = self.served();
        let idle = self.served.swap(now, Relaxed) == now && self.store.pending_bytes() == 0;
        if !idle {
            return false;
        }
        let pct = crate::knobs::get().vacuum_free_percent;
        match self.store.give_back(Some(step), pct) {
            Ok(handed) => handed > 0,
            Err(e) => {
                tracing::warn!("handing free pages back failed: {e}");
                false
            }
        }
    }

    /// The transport as the kernel decided it: a refused REGISTER means the kernel went back
    /// to /dev/fuse for everything.
    fn write(&self) -> Option<PathBuf> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut rec = self.record.clone();
        rec.devfuse_requests = self.chan.served.load(Relaxed);
        rec.forgets = self.chan.unanswered.load(Relaxed);
        rec.polled = self.chan.polled.load(Relaxed);
        rec.ring_requests = self.ring.served.load(Relaxed);
        rec.worker_requests = self.shards.handed();
        rec.lost = self.store.failure().summary().unwrap_or_default();
        rec.memory = self.memory.usage(&self.store);
        if let Ok(p) = self.store.pages() {
            rec.db_pages = p.pages;
            rec.free_pages = p.free;
        }
        rec.transport = if rec.ring_queues > 0 && self.ring.failed.load(Relaxed) == 0 {
            "io-uring".into()
        } else {
            "dev-fuse".into()
        };
        registry::register(&rec).ok()
    }
}

/// What INIT settled, and the rings to serve when the kernel took FUSE_OVER_IO_URING.
struct Handshake {
    negotiated: Negotiated,
    queues: Vec<uring::Queue>,
}

/// Read INIT from the kernel and answer it. When the kernel offers FUSE-over-io_uring (and the
/// knob allows it), the rings are created before the reply, so a failure there just means the
/// flag is not requested.
fn handshake(
    chan: &Channel,
    dispatcher: &Dispatcher,
    knobs: &Knobs,
) -> Result<Handshake, ServerError> {
    let mut buf = vec![0u8; 64 * 1024 + 4096];
    loop {
        let n = match chan.receive(&mut buf, false) {
            Ok(Received::Request(n)) => n,
            Ok(Received::Interrupted) => continue,
            Ok(Received::Gone) => return Err(ServerError::Handshake("connection closed".into())),
            Err(e) => return Err(ServerError::Handshake(e.to_string())),
        };
        let req = protocol::decode(&buf[..n])
            .map_err(|e| ServerError::Handshake(format!("bad INIT: {}", e.why)))?;
        let Operation::Init {
            major,
            minor,
            max_readahead,
            flags,
        } = req.op
        else {
            return Err(ServerError::Handshake(format!(
                "expected INIT, got opcode {}",
                req.header.opcode
            )));
        };
        let mut queues = Vec::new();
        if knobs.fuse_uring && flags & abi::FUSE_OVER_IO_URING != 0 {
            // The kernel rejects payload buffers smaller than max(8192, max_write,
            // max_pages * 4096); our max_pages * 4096 never exceeds max_write.
            let payload = (knobs.fuse_max_write as usize).max(8192);
            let cpus = uring::possible_cpus();
            let depth = crate::memory::Shares::from_knobs(knobs).ring_depth(knobs, cpus, payload);
            match uring::prepare(cpus, depth, payload) {
                Ok(q) => queues = q,
                Err(e) => tracing::warn!("io_uring unavailable ({e}); serving /dev/fuse only"),
            }
        }
        let (reply, negotiated) =
            dispatcher.init(major, minor, max_readahead, flags, !queues.is_empty());
        chan.send(req.header.unique, &reply)
            .map_err(|e| ServerError::Handshake(format!("INIT reply: {e}")))?;
        match negotiated {
            Some(negotiated) => {
                if negotiated.flags & abi::FUSE_OVER_IO_URING == 0 {
                    queues.clear();
                }
                return Ok(Handshake { negotiated, queues });
            }
            None if major > 7 => continue,
            None => {
                return Err(ServerError::Handshake(format!(
                    "kernel protocol {major}.{minor} unsupported"
                )))
            }
        }
    }
}
