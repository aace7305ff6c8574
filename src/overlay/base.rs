//! The read-only base layer: attributes, listings and file bytes of the base directory, every
//! access confined beneath it (`crate::sys::beneath`). Nothing here writes.
//!
//! Paths are absolute within the base ("/" is the base directory itself).

use std::fs::File;
use std::num::NonZeroUsize;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use lru::LruCache;
use parking_lot::Mutex;

use super::nodes::Fingerprint;
use crate::errno::Errno;
use crate::store::{Attr, Ino, Timespec};
use crate::sys::beneath::{Beneath, Dirent, XattrHandle, Xattrs};

/// Listings of base directories kept between READDIR calls of one pass.
const LISTINGS_CAP: usize = 64;

/// An open base file and the version it was opened at.
struct OpenFile {
    file: File,
    fp: Fingerprint,
}

pub struct BaseLayer {
    tree: Beneath,
    /// Sorted listings by directory path, refreshed when a listing starts over.
    listings: Mutex<LruCache<Vec<u8>, Arc<Vec<Dirent>>>>,
    /// Open files by node id, bounded by AGENTFS_FUSE_INO_FILES_CAP.
    files: Mutex<LruCache<u64, Arc<OpenFile>>>,
}

/// The path below the base root as `beneath` takes it.
fn rel(path: &[u8]) -> &[u8] {
    path.strip_prefix(b"/").unwrap_or(path)
}

/// The kernel's 32-bit device encoding (new_encode_dev) of a stat st_rdev.
pub fn kernel_rdev(rdev: u64) -> u32 {
    let major = libc::major(rdev);
    let minor = libc::minor(rdev);
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

fn ts(sec: i64, nsec: i64) -> Timespec {
    Timespec {
        sec,
        nsec: u32::try_from(nsec).unwrap_or(0),
    }
}

/// stat(2) numbers as attributes (st_ino is the base's).
pub fn attr_of(st: &libc::stat) -> Attr {
    Attr {
        ino: Ino(st.st_ino),
        mode: st.st_mode,
        nlink: u32::try_from(st.st_nlink).unwrap_or(u32::MAX),
        uid: st.st_uid,
        gid: st.st_gid,
        size: u64::try_from(st.st_size).unwrap_or(0),
        blocks: u64::try_from(st.st_blocks).unwrap_or(0),
        atime: ts(st.st_atime, st.st_atime_nsec),
        mtime: ts(st.st_mtime, st.st_mtime_nsec),
        ctime: ts(st.st_ctime, st.st_ctime_nsec),
        rdev: kernel_rdev(st.st_rdev),
    }
}

/// Nothing reachable there: missing, or behind a symlink (never followed).
fn not_found(e: &std::io::Error) -> bool {
    crate::sys::beneath::is_missing(e) || crate::sys::beneath::is_escape(e)
}

impl BaseLayer {
    pub fn open(root: &Path, files_cap: usize) -> std::io::Result<BaseLayer> {
        let cap = |n: usize| NonZeroUsize::new(n.max(1)).unwrap_or(NonZeroUsize::MIN);
        Ok(BaseLayer {
            tree: Beneath::open(root)?,
            listings: Mutex::new(LruCache::new(cap(LISTINGS_CAP))),
            files: Mutex::new(LruCache::new(cap(files_cap))),
        })
    }

    /// lstat of `path`; None when nothing is there.
    pub fn lstat(&self, path: &[u8]) -> Result<Option<libc::stat>, Errno> {
        match self.tree.lstat(rel(path)) {
            Ok(st) => Ok(st.map(|s| s.raw)),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The base object at `path`, held for reading its extended attributes.
    pub fn xattrs(&self, path: &[u8]) -> Result<XattrHandle, Errno> {
        Ok(self.tree.xattr_handle(rel(path))?)
    }

    /// The extended attributes a copy of the base object at `path` (stat `st`) takes along.
    /// EIO when another object is there now. An attribute that cannot be read is left out with
    /// a warning (the copy matters more than it); so are all of them when none can be listed.
    pub fn xattrs_to_copy(&self, path: &[u8], st: &libc::stat) -> Result<Xattrs, Errno> {
        let h = self.xattrs(path)?;
        if (h.stat.st_dev, h.stat.st_ino) != (st.st_dev, st.st_ino) {
            return Err(Errno::EIO);
        }
        let shown = || String::from_utf8_lossy(path).into_owned();
        let names = match h.names() {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(
                    "copy-up of {}: extended attributes not copied: {e}",
                    shown()
                );
                return Ok(Vec::new());
            }
        };
        let mut out = Vec::new();
        for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
            match h.get(name) {
                Ok(v) => out.push((name.to_vec(), v)),
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
                Err(e) => tracing::warn!(
                    "copy-up of {}: extended attribute {} not copied: {e}",
                    shown(),
                    String::from_utf8_lossy(name)
                ),
            }
        }
        Ok(out)
    }

    pub fn readlink(&self, path: &[u8]) -> Result<Vec<u8>, Errno> {
        Ok(self.tree.read_link(rel(path))?)
    }

    /// Open `path` for a copy or a partial-origin read.
    pub fn open_file(&self, path: &[u8]) -> Result<File, Errno> {
        Ok(self.tree.open_file(rel(path))?)
    }

    /// The entries of directory `path`, sorted by name. `fresh` re-reads the directory (a new
    /// listing pass); otherwise the listing of the current pass is reused so offsets stay put.
    pub fn list(&self, path: &[u8], fresh: bool) -> Result<Arc<Vec<Dirent>>, Errno> {
        if !fresh {
            if let Some(l) = self.listings.lock().get(path) {
                return Ok(l.clone());
            }
        }
        let mut entries = match self.tree.entries(rel(path)) {
            Ok(e) => e,
            Err(e) if not_found(&e) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let entries = Arc::new(entries);
        self.listings.lock().put(path.to_vec(), entries.clone());
        Ok(entries)
    }

    /// Read from the base file behind `node`, which the kernel knows as version `fp`. EIO if
    /// the file is no longer that version: bytes of two versions are never mixed.
    pub fn read(
        &self,
        node: Ino,
        path: &[u8],
        fp: Fingerprint,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, Errno> {
        let cached = self.files.lock().get(&node.0).cloned();
        let f = match cached {
            Some(f) => f,
            None => {
                let file = self.open_file(path)?;
                let st = crate::sys::beneath::fstat(&file)?;
                let f = Arc::new(OpenFile {
                    file,
                    fp: Fingerprint::of(&st),
                });
                self.files.lock().put(node.0, f.clone());
                f
            }
        };
        let now = Fingerprint::of(&crate::sys::beneath::fstat(&f.file)?);
        if f.fp != fp || now != fp {
            self.files.lock().pop(&node.0);
            tracing::warn!(
                "base file {} changed under the mount; reads of the old version fail",
                String::from_utf8_lossy(path)
            );
            return Err(Errno::EIO);
        }
        let mut buf = crate::memory::pool::buffers().zeroed(size as usize);
        let mut have = 0;
        while have < buf.len() {
            match f.file.read_at(&mut buf[have..], offset + have as u64) {
                Ok(0) => break,
                Ok(n) => have += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        buf.truncate(have);
        Ok(buf)
    }

    /// Close the file behind `node` (the kernel forgot it, or it was copied up).
    pub fn close(&self, node: Ino) {
        self.files.lock().pop(&node.0);
    }
}
