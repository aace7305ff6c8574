//! Partial-origin files: a copied-up regular file whose unchanged chunks still come from the
//! base file (SPEC.md "Partial-origin overlay mode").
//!
//! Chunk k is the delta's when (ino, k) is in fs_chunk_override (a missing fs_data row there
//! reads as zeros); otherwise it is the base file's bytes [k*cs, min((k+1)*cs, base length)),
//! zeros past the base's end. Before a chunk is changed, the delta takes it over in one
//! transaction that stores the base bytes it still needs and the override row, so a crash
//! between that and the change leaves the old content, never zeros. Every use of base bytes
//! first checks the recorded fingerprint: a base file that changed gives EIO.

use std::collections::{HashMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use super::base::BaseLayer;
use crate::errno::Errno;
use crate::store::backup::PartialOrigin;
use crate::store::overlay::{OverlayConfig, PartialOriginPolicy};
use crate::store::{Ino, Store};

/// One partial-origin file.
pub struct PartialFile {
    origin: PartialOrigin,
    /// The base path below the base root.
    path: Vec<u8>,
    chunk: u64,
    /// Chunks the delta owns; the lock also serialises taking chunks over.
    owned: Mutex<HashSet<u64>>,
}

/// The partial-origin policy and the files that use it.
pub struct Partials {
    config: OverlayConfig,
    chunk: u64,
    inline: u64,
    /// Known state per delta inode (None: not partial). Unused when nothing is partial.
    files: Mutex<HashMap<Ino, Option<Arc<PartialFile>>>>,
    /// Whether any file can be partial: the policy is on, or the database has such files.
    active: std::sync::atomic::AtomicBool,
}

impl Partials {
    pub fn new(config: OverlayConfig, chunk: u64, inline: u64) -> Partials {
        Partials {
            active: std::sync::atomic::AtomicBool::new(true),
            config,
            chunk,
            inline,
            files: Mutex::new(HashMap::new()),
        }
    }

    /// Skip the per-inode check when the policy is off and the database has no partial file.
    pub fn settle(&self, store: &Store) -> Result<(), Errno> {
        let any = self.config.partial_origin != PartialOriginPolicy::Off
            || store.has_partial_origins()?;
        self.active.store(any, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// The fs_partial_origin row for copying up the base file `path` with stat `st`, if the
    /// policy wants it partial (files above the inline threshold only: smaller ones are
    /// cheaper to copy than to track).
    pub fn origin_for(&self, path: &[u8], st: &libc::stat) -> Option<PartialOrigin> {
        let size = u64::try_from(st.st_size).ok()?;
        if !self.config.partial_origin_for(size) || size <= self.inline {
            return None;
        }
        let host = self.config.base_path.join(std::ffi::OsStr::from_bytes(
            path.strip_prefix(b"/").unwrap_or(path),
        ));
        Some(PartialOrigin {
            delta_ino: 0,
            base_ino: i64::try_from(st.st_ino).ok()?,
            base_path: host.to_str()?.to_string(),
            base_size: st.st_size,
            base_fingerprint_size: st.st_size,
            base_mtime: st.st_mtime,
            base_mtime_nsec: st.st_mtime_nsec,
            base_ctime: st.st_ctime,
            base_ctime_nsec: st.st_ctime_nsec,
        })
    }

    /// The partial state of delta inode `x`, loaded on first use.
    pub fn get(&self, store: &Store, x: Ino) -> Result<Option<Arc<PartialFile>>, Errno> {
        if !self.active.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        if let Some(f) = self.files.lock().get(&x) {
            return Ok(f.clone());
        }
        let f = match store.partial_origin(x)? {
            Some(origin) => {
                let host = PathBuf::from(&origin.base_path);
                let path = match host.strip_prefix(&self.config.base_path) {
                    Ok(r) => {
                        let mut p = b"/".to_vec();
                        p.extend_from_slice(r.as_os_str().as_bytes());
                        p
                    }
                    // Recorded for another base directory: its bytes cannot be reached.
                    Err(_) => return Err(Errno::EIO),
                };
                let owned = store.overrides(x)?;
                Some(Arc::new(PartialFile {
                    origin,
                    path,
                    chunk: self.chunk,
                    owned: Mutex::new(owned),
                }))
            }
            None => None,
        };
        if f.is_some() {
            self.active
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.files.lock().insert(x, f.clone());
        Ok(f)
    }

    /// Before `x` changes size: the delta takes over every chunk between the old and the new
    /// end, so base bytes past a shrink never show again after a later extension.
    pub fn resize(&self, store: &Store, base: &BaseLayer, x: Ino, size: u64) -> Result<(), Errno> {
        let Some(p) = self.get(store, x)? else {
            return Ok(());
        };
        let old = store.getattr(x)?.size;
        let (lo, hi) = (old.min(size), old.max(size));
        if lo == hi {
            return Ok(());
        }
        p.own_within_base(store, base, x, lo, hi - lo, lo)
    }

    /// Forget the state of a deleted inode.
    pub fn forget(&self, x: Ino) {
        self.files.lock().remove(&x);
    }
}

impl PartialFile {
    /// The base file, after checking it is still the recorded version.
    fn base_file(&self, base: &BaseLayer) -> Result<std::fs::File, Errno> {
        let f = base.open_file(&self.path).map_err(|e| {
            tracing::warn!(
                "partial-origin read refused: base file {}: {e}",
                self.origin.base_path
            );
            Errno::EIO
        })?;
        if let Err(e) = self.origin.check_fingerprint(&f.metadata()?) {
            tracing::warn!("partial-origin read refused: {e}");
            return Err(Errno::EIO);
        }
        Ok(f)
    }

    /// The length of the base file (as recorded; [`PartialFile::base_file`] checks it).
    fn base_len(&self) -> u64 {
        u64::try_from(self.origin.expected_size()).unwrap_or(0)
    }

    /// Take over the chunks of [off, off + len) that hold base bytes (chunks past the base's
    /// end read as zeros whoever owns them), keeping bytes below `keep_below`: before a size
    /// change or an fallocate, whose range can be far larger than the file.
    pub fn own_within_base(
        &self,
        store: &Store,
        base: &BaseLayer,
        x: Ino,
        off: u64,
        len: u64,
        keep_below: u64,
    ) -> Result<(), Errno> {
        let end = off.saturating_add(len).min(self.base_len());
        if len == 0 || off >= end {
            return Ok(());
        }
        self.own(
            store,
            base,
            x,
            off / self.chunk,
            (end - 1) / self.chunk,
            keep_below,
        )
    }

    /// Take over chunks `first..=last` that the delta does not own yet, keeping the bytes
    /// below `keep_below` (the file's content there) and making the rest holes.
    fn own(
        &self,
        store: &Store,
        base: &BaseLayer,
        x: Ino,
        first: u64,
        last: u64,
        keep_below: u64,
    ) -> Result<(), Errno> {
        let mut owned = self.owned.lock();
        let missing: Vec<u64> = (first..=last).filter(|i| !owned.contains(i)).collect();
        if missing.is_empty() {
            return Ok(());
        }
        let file = self.base_file(base)?;
        let base_len = self.base_len();
        let mut chunks = Vec::with_capacity(missing.len());
        for idx in missing.iter().copied() {
            let start = idx * self.chunk;
            let end = ((idx + 1) * self.chunk).min(keep_below).min(base_len);
            if start >= end {
                chunks.push((idx, None));
                continue;
            }
            let mut buf = vec![0u8; (end - start) as usize];
            file.read_exact_at(&mut buf, start)?;
            chunks.push((idx, Some(buf)));
        }
        store.own_chunks(x, &chunks)?;
        owned.extend(missing);
        Ok(())
    }

    /// Before bytes [off, off + len) change: take over the chunks they touch.
    pub fn own_range(
        &self,
        store: &Store,
        base: &BaseLayer,
        x: Ino,
        off: u64,
        len: u64,
    ) -> Result<(), Errno> {
        if len == 0 {
            return Ok(());
        }
        let size = store.getattr(x)?.size;
        let last = off.saturating_add(len - 1) / self.chunk;
        self.own(store, base, x, off / self.chunk, last, size)
    }

    /// Up to `size` bytes at `off`, chunk by chunk from the delta or the base.
    pub fn read(
        &self,
        store: &Store,
        base: &BaseLayer,
        x: Ino,
        off: u64,
        size: u32,
    ) -> Result<Vec<u8>, Errno> {
        let file_size = store.getattr(x)?.size;
        let end = off.saturating_add(u64::from(size)).min(file_size);
        if off >= end {
            return Ok(Vec::new());
        }
        let mut buf = crate::memory::pool::buffers().zeroed((end - off) as usize);
        let owned = self.owned.lock().clone();
        let mut base_file = None;
        let mut pos = off;
        while pos < end {
            let idx = pos / self.chunk;
            let stop = ((idx + 1) * self.chunk).min(end);
            let into = &mut buf[(pos - off) as usize..(stop - off) as usize];
            if owned.contains(&idx) {
                let got = store.read(x, pos, (stop - pos) as u32)?;
                into[..got.len()].copy_from_slice(&got);
            } else {
                if base_file.is_none() {
                    base_file = Some(self.base_file(base)?);
                }
                if let Some(f) = &base_file {
                    let avail = stop.min(self.base_len());
                    if pos < avail {
                        f.read_exact_at(&mut into[..(avail - pos) as usize], pos)?;
                    }
                }
            }
            pos = stop;
        }
        Ok(buf)
    }
}
