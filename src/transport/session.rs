//! A mount session: lock the database, mount, negotiate INIT, serve on several threads, and
//! shut down cleanly (unmount, join every thread, make everything durable, checkpoint the WAL).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dispatch::{Dispatcher, Negotiated};
use crate::knobs::Knobs;
use crate::protocol::{self, Operation};
use crate::store::Store;
use crate::sys::{lock, mount, mounts, registry, signals};

use super::devfuse::{self, Channel, Received};

/// Everything a session needs to start.
pub struct SessionConfig {
    pub db: PathBuf,
    pub mount_point: PathBuf,
    pub options: mount::MountOptions,
}

/// Why a session could not start; printed as one line.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Mount(#[from] mount::MountError),
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("FUSE handshake failed: {0}")]
    Handshake(String),
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

/// Mount and serve until unmounted or signalled. Returns after a clean shutdown.
pub fn run(cfg: &SessionConfig, knobs: &Knobs, ready: &mut dyn Ready) -> Result<(), SessionError> {
    let mnt = mount::check_mount_point(&cfg.mount_point)?;
    let db = std::fs::canonicalize(&cfg.db).unwrap_or_else(|_| cfg.db.clone());
    let _lock = lock::lock_db(&db)?;
    let store = Arc::new(Store::open(&db, cfg.options.readonly)?);
    if !cfg.options.readonly {
        match store.reap_orphans() {
            Ok(0) => {}
            Ok(n) => tracing::info!("reaped {n} orphaned inodes left by an earlier crash"),
            Err(e) => return Err(SessionError::Other(format!("reaping orphans: {e}"))),
        }
    }

    // Signals are blocked before any thread exists, so only the waiter below receives them.
    signals::block_shutdown_signals();
    let fd = if mount::can_mount_directly() {
        mount::mount_direct(&mnt, &cfg.options)?
    } else {
        mount::mount_fusermount(&mnt, &cfg.options)?
    };
    let chan = Arc::new(Channel::new(fd));
    let dispatcher = Arc::new(Dispatcher::new(store.clone(), knobs));

    let negotiated = match handshake(&chan, &dispatcher) {
        Ok(n) => n,
        Err(e) => {
            let _ = mount::unmount(&mnt, true);
            return Err(e);
        }
    };
    tracing::info!(
        "mounted {} on {} (protocol 7.{}, max_write {}, transport /dev/fuse)",
        db.display(),
        mnt.display(),
        negotiated.minor,
        negotiated.max_write
    );
    let record = registry::register(&registry::ServerRecord {
        pid: std::process::id(),
        db: db.clone(),
        mount_point: mnt.clone(),
        transport: "dev-fuse".into(),
    })
    .ok();
    ready.ready(&mnt);

    let buf_size = negotiated.max_write as usize + 64 * 1024;
    let threads = knobs.fuse_threads.max(1) as usize;
    let mut workers = Vec::with_capacity(threads);
    for i in 0..threads {
        let chan = chan.clone();
        let d = dispatcher.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("fuse-{i}"))
            .spawn(move || devfuse::serve_loop(&chan, &d, buf_size));
        match spawned {
            Ok(h) => workers.push(h),
            Err(e) => tracing::error!("cannot start transport thread {i}: {e}"),
        }
    }
    let signal_mnt = mnt.clone();
    let _ = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let sig = signals::wait_shutdown_signal();
            tracing::info!("signal {sig}: unmounting {}", signal_mnt.display());
            unmount_for_shutdown(&signal_mnt);
        });
    for w in workers {
        let _ = w.join();
    }
    // The connection is gone: every request has been answered. Make it all durable.
    let result = store
        .sync()
        .and_then(|_| store.checkpoint())
        .map_err(|e| SessionError::Other(format!("final checkpoint failed: {e}")));
    if let Some(p) = record {
        let _ = std::fs::remove_file(p);
    }
    tracing::info!(
        "served {} requests",
        chan.served.load(std::sync::atomic::Ordering::Relaxed)
    );
    result
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

/// Read INIT from the kernel and answer it.
fn handshake(chan: &Channel, dispatcher: &Dispatcher) -> Result<Negotiated, SessionError> {
    let mut buf = vec![0u8; 64 * 1024 + 4096];
    loop {
        let n = match chan.receive(&mut buf) {
            Ok(Received::Request(n)) => n,
            Ok(Received::Gone) => return Err(SessionError::Handshake("connection closed".into())),
            Err(e) => return Err(SessionError::Handshake(e.to_string())),
        };
        let req = protocol::decode(&buf[..n])
            .map_err(|e| SessionError::Handshake(format!("bad INIT: {}", e.why)))?;
        let Operation::Init {
            major,
            minor,
            max_readahead,
            flags,
        } = req.op
        else {
            return Err(SessionError::Handshake(format!(
                "expected INIT, got opcode {}",
                req.header.opcode
            )));
        };
        let (reply, negotiated) = dispatcher.init(major, minor, max_readahead, flags);
        chan.send(req.header.unique, &reply)
            .map_err(|e| SessionError::Handshake(format!("INIT reply: {e}")))?;
        match negotiated {
            Some(n) => return Ok(n),
            None if major > 7 => continue,
            None => {
                return Err(SessionError::Handshake(format!(
                    "kernel protocol {major}.{minor} unsupported"
                )))
            }
        }
    }
}

/// Writes one line to a pipe the launching parent reads: "ok" when live, or the error.
pub struct PipeReady(pub Option<std::fs::File>);

impl Ready for PipeReady {
    fn ready(&mut self, _: &Path) {
        if let Some(mut f) = self.0.take() {
            let _ = writeln!(f, "ok");
        }
    }
}
