//! Overlay mode: a read-only base directory under a copy-on-write delta kept in the store.
//!
//! The merged view (SPEC.md "Overlay"): a name is looked up in the delta first, then in the
//! whiteouts, then in the base. A delta directory merges with the base directory at its path
//! only if it is the root or a copy of that base directory (it has an fs_origin row); a
//! directory made in the overlay is opaque, which is how a base directory removed and made
//! again hides its old children. Merged directories keep their path for their whole life
//! (renaming one is EXDEV), so their path is cached by inode.
//!
//! Copy-up happens on the first change of a base object's data or metadata, never on a read:
//! its ancestors first, then the object, each in one transaction that also records fs_origin
//! (st_ino stays the base's). A regular file is copied whole, streamed chunk by chunk, or — in
//! partial-origin mode — not at all: only the chunks it writes move into the delta
//! ([`partial`]). The base is never written and is only reached beneath its root
//! (`crate::sys::beneath`).
//!
//! Locking: `change` serialises every overlay namespace change and copy-up (they are
//! serialised on the store's writer anyway); WRITE to a delta file and every read path run
//! without it. Lock order: `change`, then the store's writer, then the node table.

mod base;
mod nodes;
mod partial;

pub use base::kernel_rdev;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::dispatch::{Entry, Filesystem, LookupRefs};
use crate::errno::Errno;
use crate::store::overlay::{
    join, last_name, parent_path, BaseMeta, BaseSeen, Content, OverlayConfig,
};
use crate::store::{
    Attr, Caller, DirEntry, Effects, Ino, Liveness, NewKind, RenameFlags, SetAttr, StatFs, Store,
    Timespec,
};

use base::BaseLayer;
use nodes::{Fingerprint, Nodes, Target};

/// Readdir cookies at and above this number index the base part of a listing.
const BASE_COOKIE: u64 = 1 << 62;
/// Set in the st_ino of every object that is not a copy of a base object (and of the root),
/// so it never equals the inode number of a base object below 2^63 (all of them on ext4, xfs,
/// btrfs and tmpfs; a base on overlayfs with xino may use the top bits).
const DELTA_INO_BIT: u64 = 1 << 63;
/// How often a lookup retries when a copy-up raced it.
const RETRIES: usize = 16;

/// Where a name of a directory is in the merged view.
enum Presence {
    Delta(Attr),
    Base(libc::stat),
    /// Nowhere; `whiteout` if a whiteout hides a base entry of that name.
    Absent {
        whiteout: bool,
    },
}

pub struct Overlay {
    store: Arc<Store>,
    base: BaseLayer,
    nodes: Arc<Nodes>,
    /// fs_origin: delta inode -> base st_ino. Directories in it merge with the base.
    origins: RwLock<HashMap<Ino, u64>>,
    /// Paths of merged directories (they never move).
    paths: Mutex<HashMap<Ino, Vec<u8>>>,
    /// Serialises namespace changes and copy-ups (see the module docs).
    change: Mutex<()>,
    partial: partial::Partials,
}

/// The kernel's references, seen through the node table: a copied-up inode is referenced
/// when the virtual node that names it is.
struct Live<'a> {
    refs: &'a LookupRefs,
    nodes: &'a Arc<Nodes>,
}

impl Liveness for Live<'_> {
    fn retain_orphan(&self, ino: Ino) -> bool {
        self.refs.retain_orphan(self.nodes.for_delta(ino))
    }

    fn shared(&self) -> Option<Arc<dyn Liveness + Send>> {
        Some(Arc::new(Held {
            refs: self.refs.clone(),
            nodes: Arc::clone(self.nodes),
        }))
    }
}

/// [`Live`], owned: for an unlink whose statements run after its reply.
struct Held {
    refs: LookupRefs,
    nodes: Arc<Nodes>,
}

impl Liveness for Held {
    fn retain_orphan(&self, ino: Ino) -> bool {
        let live = Live {
            refs: &self.refs,
            nodes: &self.nodes,
        };
        live.retain_orphan(ino)
    }
}

fn is_dir(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFDIR
}

impl Overlay {
    /// The overlay of `store` over `cfg.base`.
    pub fn open(
        store: Arc<Store>,
        cfg: &OverlayConfig,
        files_cap: usize,
    ) -> Result<Overlay, String> {
        let root = &cfg.base_path;
        let md = std::fs::metadata(root)
            .map_err(|e| format!("base directory {}: {e}", root.display()))?;
        if !md.is_dir() {
            return Err(format!("base {} is not a directory", root.display()));
        }
        let base = BaseLayer::open(root, files_cap)
            .map_err(|e| format!("base directory {}: {e}", root.display()))?;
        let origins = store
            .origins()
            .map_err(|e| format!("reading fs_origin: {e}"))?;
        let chunk = store.config().chunk_size;
        let inline = store.config().inline_threshold;
        let partial = partial::Partials::new(cfg.clone(), chunk, inline);
        partial
            .settle(&store)
            .map_err(|e| format!("reading fs_partial_origin: {e}"))?;
        Ok(Overlay {
            partial,
            store,
            base,
            nodes: Arc::default(),
            origins: RwLock::new(origins),
            paths: Mutex::new(HashMap::new()),
            change: Mutex::new(()),
        })
    }

    fn resolve(&self, node: Ino) -> Result<Target, Errno> {
        self.nodes.resolve(node).ok_or(Errno(libc::ESTALE))
    }

    /// Whether delta directory `dir` merges with the base.
    fn merged(&self, dir: Ino) -> bool {
        dir == Ino::ROOT || self.origins.read().contains_key(&dir)
    }

    /// The path of merged directory `dir`.
    fn path_of(&self, dir: Ino) -> Result<Vec<u8>, Errno> {
        if let Some(p) = self.paths.lock().get(&dir) {
            return Ok(p.clone());
        }
        let p = self.store.dir_path(dir)?;
        self.paths.lock().insert(dir, p.clone());
        Ok(p)
    }

    /// Attributes as the mount shows them: st_ino of the base for copies, the delta inode
    /// number with [`DELTA_INO_BIT`] for everything else, and link count 1 for merged
    /// directories (their subdirectories are not counted), as overlayfs does.
    fn fix(&self, mut a: Attr) -> Attr {
        let origin = self.origins.read().get(&a.ino).copied();
        if let Some(b) = origin {
            if is_dir(a.mode) {
                a.nlink = 1;
            }
            a.ino = Ino(b);
        } else {
            if a.ino == Ino::ROOT {
                a.nlink = 1;
            }
            a.ino = Ino(a.ino.0 | DELTA_INO_BIT);
        }
        a
    }

    /// The entry reply for delta inode attributes `a` (a virtual node gains a reference).
    fn delta_entry(&self, a: Attr) -> Entry {
        Entry {
            node: self.nodes.entry_for_delta(a.ino),
            attr: self.fix(a),
        }
    }

    /// The entry for the base object at `path`: None if absent, Err(EAGAIN) if a copy-up
    /// raced the caller (look again).
    fn base_entry(&self, path: &[u8], seen: u64) -> Result<Option<Entry>, Errno> {
        let Some(st) = self.base.lstat(path)? else {
            return Ok(None);
        };
        let fp = (st.st_mode & libc::S_IFMT == libc::S_IFREG).then(|| Fingerprint::of(&st));
        match self.nodes.for_base(path, fp, seen) {
            Some(node) => Ok(Some(Entry {
                node,
                attr: base::attr_of(&st),
            })),
            None => Err(Errno::EAGAIN),
        }
    }

    fn lookup_once(&self, parent: Ino, name: &[u8], seen: u64) -> Result<Entry, Errno> {
        match self.resolve(parent)? {
            Target::Delta(p) => match self.store.lookup(p, name) {
                Ok(a) => Ok(self.delta_entry(a)),
                Err(e) if e == Errno::ENOENT && self.merged(p) => {
                    let path = join(&self.path_of(p)?, name);
                    if self.store.is_whiteout(&path)? {
                        return Err(Errno::ENOENT);
                    }
                    self.base_entry(&path, seen)?.ok_or(Errno::ENOENT)
                }
                Err(e) => Err(e),
            },
            Target::Base { path, .. } => self
                .base_entry(&join(&path, name), seen)?
                .ok_or(Errno::ENOENT),
        }
    }

    /// Where `name` of delta directory `dir` is in the merged view.
    fn presence(&self, dir: Ino, name: &[u8]) -> Result<(Presence, Option<Vec<u8>>), Errno> {
        match self.store.lookup(dir, name) {
            Ok(a) => {
                let path = if self.merged(dir) {
                    Some(join(&self.path_of(dir)?, name))
                } else {
                    None
                };
                Ok((Presence::Delta(a), path))
            }
            Err(e) if e == Errno::ENOENT => {
                if !self.merged(dir) {
                    return Ok((Presence::Absent { whiteout: false }, None));
                }
                let path = join(&self.path_of(dir)?, name);
                if self.store.is_whiteout(&path)? {
                    return Ok((Presence::Absent { whiteout: true }, Some(path)));
                }
                let p = match self.base.lstat(&path)? {
                    Some(st) => Presence::Base(st),
                    None => Presence::Absent { whiteout: false },
                };
                Ok((p, Some(path)))
            }
            Err(e) => Err(e),
        }
    }

    /// EEXIST unless `name` of delta directory `dir` is free in the merged view; the path of
    /// the whiteout a new entry there must remove, if any.
    fn free_name(&self, dir: Ino, name: &[u8]) -> Result<Option<Vec<u8>>, Errno> {
        match self.presence(dir, name)? {
            (Presence::Delta(_) | Presence::Base(_), _) => Err(Errno::EEXIST),
            (Presence::Absent { whiteout }, path) => Ok(path.filter(|_| whiteout)),
        }
    }

    /// Whether the base has something at `path` (None: not a merged location).
    fn base_has(&self, path: Option<&[u8]>) -> Result<bool, Errno> {
        match path {
            Some(p) => Ok(self.base.lstat(p)?.is_some()),
            None => Ok(false),
        }
    }

    /// ENOTEMPTY unless every base child of merged directory `path` is hidden (whited out or
    /// shadowed by a delta entry, which the store's own emptiness check then catches).
    fn base_children_hidden(&self, dir: Option<Ino>, path: &[u8]) -> Result<(), Errno> {
        let children = self.base.list(path, true)?;
        if children.is_empty() {
            return Ok(());
        }
        let hidden = self.store.whiteouts_in(path)?;
        for c in children.iter() {
            if hidden.contains(&c.name) {
                continue;
            }
            let shadowed = match dir {
                Some(d) => self.store.lookup(d, &c.name).is_ok(),
                None => false,
            };
            if !shadowed {
                return Err(Errno::ENOTEMPTY);
            }
        }
        Ok(())
    }

    /// The delta inode of `node`, copying it (and its ancestors) up first if it is a base
    /// object. Takes the change lock when a copy-up is needed.
    fn ensure_delta(&self, node: Ino) -> Result<Ino, Errno> {
        match self.resolve(node)? {
            Target::Delta(x) => Ok(x),
            Target::Base { .. } => {
                let _g = self.change.lock();
                self.ensure_delta_locked(node)
            }
        }
    }

    /// [`Overlay::ensure_delta`] with the change lock held.
    fn ensure_delta_locked(&self, node: Ino) -> Result<Ino, Errno> {
        match self.resolve(node)? {
            Target::Delta(x) => Ok(x),
            // A base file removed through the mount while still open: copied into an orphan
            // that lives until the kernel forgets the node (unlink-while-open).
            Target::Base {
                path,
                fp: Some(fp),
                unlinked: true,
            } => {
                let st = self.current(&path, Some(fp))?;
                let x = self.store_copy(None, &path, &st, false, &|_| {})?;
                // Before the node names it, so the copy never shows another st_ino.
                self.origins.write().insert(x, st.st_ino);
                self.nodes.orphan_copied(node, x);
                Ok(x)
            }
            Target::Base { unlinked: true, .. } => Err(Errno::ENOENT),
            Target::Base { path, fp, .. } => self.copy_up(&path, fp),
        }
    }

    /// lstat of the base object at `path`, which must still be version `expect` of a regular
    /// file when given (EIO otherwise: it changed under the mount).
    fn current(&self, path: &[u8], expect: Option<Fingerprint>) -> Result<libc::stat, Errno> {
        let st = self.base.lstat(path)?.ok_or(Errno::ENOENT)?;
        if let Some(fp) = expect {
            if st.st_mode & libc::S_IFMT != libc::S_IFREG || Fingerprint::of(&st) != fp {
                return Err(Errno::EIO);
            }
        }
        Ok(st)
    }

    /// Copy the base object at `path` (and missing ancestors) into the delta; returns its
    /// delta inode (the existing one if it is already there). `expect`: the version the kernel
    /// was shown of a regular file; a different file now is EIO (drift).
    fn copy_up(&self, path: &[u8], expect: Option<Fingerprint>) -> Result<Ino, Errno> {
        self.copy_up_as(path, expect, false)
    }

    /// [`Overlay::copy_up`]; `empty`: a regular file's bytes are not needed (it is about to be
    /// truncated to zero).
    fn copy_up_as(
        &self,
        path: &[u8],
        expect: Option<Fingerprint>,
        empty: bool,
    ) -> Result<Ino, Errno> {
        if path == b"/" {
            return Ok(Ino::ROOT);
        }
        // The object first: a node that saw another version must not copy its ancestors.
        let st = self.current(path, expect)?;
        let parent = self.copy_up(parent_path(path), None)?;
        let name = last_name(path);
        match self.store.lookup(parent, name) {
            Ok(a) => return Ok(a.ino),
            Err(e) if e != Errno::ENOENT => return Err(e),
            Err(_) => {}
        }
        let fp = (st.st_mode & libc::S_IFMT == libc::S_IFREG).then(|| Fingerprint::of(&st));
        let publish = |ino: Ino| {
            self.origins.write().insert(ino, st.st_ino);
            if is_dir(st.st_mode) {
                self.paths.lock().insert(ino, path.to_vec());
            }
            self.nodes.publish(path, ino);
        };
        let copied = std::cell::Cell::new(None);
        let out = self.store_copy(Some(parent), path, &st, empty, &|ino| {
            copied.set(Some(ino));
            publish(ino);
        });
        match (&out, copied.get()) {
            (Ok(ino), _) => self.nodes.settle(path, *ino),
            (Err(_), Some(ino)) => {
                self.origins.write().remove(&ino);
                self.paths.lock().remove(&ino);
                self.nodes.revert(path, ino, fp);
            }
            (Err(_), None) => {}
        }
        out
    }

    /// One copy-up transaction of the base object at `path` (stat `st`) as `name` of
    /// `parent`, or as an orphan; `publish` runs inside it (see `Store::copy_up`).
    fn store_copy(
        &self,
        parent: Option<Ino>,
        path: &[u8],
        st: &libc::stat,
        empty: bool,
        publish: &dyn Fn(Ino),
    ) -> Result<Ino, Errno> {
        let name = last_name(path);
        let ts = |s: i64, n: i64| Timespec {
            sec: s,
            nsec: u32::try_from(n).unwrap_or(0),
        };
        let seen = BaseSeen::of_stat(st);
        let meta = BaseMeta {
            mode: st.st_mode,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: base::kernel_rdev(st.st_rdev),
            size: seen.size,
            atime: ts(st.st_atime, st.st_atime_nsec),
            mtime: seen.mtime,
            ctime: seen.ctime,
            ino: st.st_ino,
            xattrs: self.base.xattrs_to_copy(path, st)?,
            seen,
            path: path.to_vec(),
        };
        let no_check = || Ok(());
        let store = &self.store;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => store.copy_up(parent, name, &meta, Content::Dir, &no_check, publish),
            libc::S_IFLNK => {
                let target = self.base.readlink(path)?;
                let content = Content::Symlink(&target);
                store.copy_up(parent, name, &meta, content, &no_check, publish)
            }
            libc::S_IFREG if empty => {
                let mut nothing = |_: &mut [u8]| Ok(0);
                let content = Content::File(&mut nothing);
                store.copy_up(parent, name, &meta, content, &no_check, publish)
            }
            libc::S_IFREG => match self.partial.origin_for(path, st) {
                Some(po) => {
                    let content = Content::Partial(&po);
                    store.copy_up(parent, name, &meta, content, &no_check, publish)
                }
                None => {
                    let file = self.base.open_file(path)?;
                    let want = Fingerprint::of(st);
                    let verify = || {
                        let now = crate::sys::beneath::fstat(&file)?;
                        if Fingerprint::of(&now) == want {
                            Ok(())
                        } else {
                            Err(Errno::EIO)
                        }
                    };
                    let mut off = 0u64;
                    let mut read = |buf: &mut [u8]| -> Result<usize, Errno> {
                        use std::os::unix::fs::FileExt;
                        let n = file.read_at(buf, off)?;
                        off += n as u64;
                        Ok(n)
                    };
                    let content = Content::File(&mut read);
                    store.copy_up(parent, name, &meta, content, &verify, publish)
                }
            },
            _ => store.copy_up(parent, name, &meta, Content::Special, &no_check, publish),
        }
    }

    /// Return `n` references of virtual node `node`; when they were its last, close its base
    /// file, and reap what it named if that is an orphan (the orphan copy of a base file
    /// unlinked while open never went through the reference table's orphan set; the store's
    /// reap checks nlink itself).
    fn release(&self, node: Ino, n: u64) {
        if let Some(target) = self.nodes.release(node, n) {
            self.base.close(node);
            if let Target::Delta(x) = target {
                self.reap(&[x]);
            }
        }
    }

    fn reap(&self, xs: &[Ino]) {
        for &x in xs {
            self.partial.forget(x);
        }
        if let Err(e) = self.store.reap(xs) {
            tracing::error!("reaping {} orphan inodes failed: {e}", xs.len());
        }
    }

    /// Create `name` in `parent` (copied up first) unless the merged view has it.
    fn create(
        &self,
        parent: Ino,
        name: &[u8],
        kind: NewKind<'_>,
        caller: Caller,
    ) -> Result<Entry, Errno> {
        let _g = self.change.lock();
        let p = self.ensure_delta_locked(parent)?;
        let unwhiteout = self.free_name(p, name)?;
        let fx = Effects {
            unwhiteout: unwhiteout.as_deref(),
            ..Effects::NONE
        };
        let a = self.store.create_fx(p, name, kind, caller, &fx)?;
        Ok(self.delta_entry(a))
    }

    /// Read or write through a byte range of a regular file `node` that is (or becomes) a
    /// delta inode: copy_file_range between layers.
    fn copy_range_slow(
        &self,
        node_in: Ino,
        off_in: u64,
        node_out: Ino,
        off_out: u64,
        len: u64,
    ) -> Result<u64, Errno> {
        const STEP: u64 = 1 << 20;
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(STEP) as u32;
            let buf = self.read(node_in, off_in + done, n)?;
            if buf.is_empty() {
                break;
            }
            let w = self.write(node_out, off_out + done, &buf)?;
            done += u64::from(w);
            if (w as usize) < buf.len() {
                break;
            }
        }
        Ok(done)
    }

    /// One page of the merged listing of `node`: up to `max` entries after cookie `offset`.
    ///
    /// A merged directory lists first the delta's own names (cookies as in a plain mount) that
    /// the base does not have, then every base name that is not whited out, sorted, at cookies
    /// from 2^62 on — taken from the delta when the delta has it. A name's place therefore does
    /// not move when it is copied up during a listing, so no name is skipped or repeated.
    fn list(&self, node: Ino, offset: u64, max: usize) -> Result<Vec<(DirEntry, Source)>, Errno> {
        let mut out = Vec::new();
        let (dir, path) = match self.resolve(node)? {
            Target::Delta(d) if !self.merged(d) => {
                for (e, a) in self.store.readdirplus(d, offset, max)? {
                    out.push((e, Source::Delta(a)));
                }
                return Ok(out);
            }
            Target::Delta(d) => (Some(d), self.path_of(d)?),
            Target::Base { path, .. } => (None, path),
        };
        let listing = self.base.list(&path, offset == 0)?;
        let in_base = |name: &[u8]| {
            listing
                .binary_search_by(|e| e.name.as_slice().cmp(name))
                .is_ok()
        };
        if offset < BASE_COOKIE {
            match dir {
                Some(d) => {
                    let mut cur = offset;
                    while out.len() < max {
                        let want = max - out.len();
                        let page = self.store.readdirplus(d, cur, want)?;
                        let n = page.len();
                        for (e, a) in page {
                            cur = e.offset;
                            let dot = e.name == b"." || e.name == b"..";
                            if dot || !in_base(&e.name) {
                                out.push((e, Source::Delta(a)));
                            }
                        }
                        if n < want {
                            break;
                        }
                    }
                    if out.len() >= max {
                        return Ok(out);
                    }
                }
                None => {
                    let st = self.base.lstat(&path)?.ok_or(Errno::ENOENT)?;
                    let up = parent_path(&path).to_vec();
                    let up_st = self.base.lstat(&up)?.unwrap_or(st);
                    for (name, off, st) in [(&b"."[..], 1, st), (&b".."[..], 2, up_st)] {
                        if offset < off && out.len() < max {
                            let e = DirEntry {
                                ino: Ino(st.st_ino),
                                name: name.to_vec(),
                                kind: libc::S_IFDIR,
                                offset: off,
                            };
                            out.push((e, Source::Dot(base::attr_of(&st))));
                        }
                    }
                }
            }
        }
        let hidden = match dir {
            Some(_) => self.store.whiteouts_in(&path)?,
            None => Default::default(),
        };
        let from = usize::try_from(offset.saturating_sub(BASE_COOKIE)).unwrap_or(usize::MAX);
        for (i, e) in listing.iter().enumerate().skip(from) {
            if out.len() >= max {
                break;
            }
            if hidden.contains(&e.name) {
                continue;
            }
            let cookie = BASE_COOKIE + i as u64 + 1;
            if let Some(d) = dir {
                if let Ok(a) = self.store.lookup(d, &e.name) {
                    let entry = DirEntry {
                        ino: a.ino,
                        name: e.name.clone(),
                        kind: a.mode & libc::S_IFMT,
                        offset: cookie,
                    };
                    out.push((entry, Source::Delta(a)));
                    continue;
                }
            }
            let child = join(&path, &e.name);
            let kind = if e.kind == libc::DT_UNKNOWN {
                match self.base.lstat(&child)? {
                    Some(st) => st.st_mode & libc::S_IFMT,
                    None => continue,
                }
            } else {
                u32::from(e.kind) << 12
            };
            let entry = DirEntry {
                ino: Ino(e.ino),
                name: e.name.clone(),
                kind,
                offset: cookie,
            };
            out.push((entry, Source::Base(child)));
        }
        Ok(out)
    }
}

/// Where a listed entry comes from.
enum Source {
    Delta(Attr),
    Base(Vec<u8>),
    /// "." or ".." of a base directory.
    Dot(Attr),
}

impl Filesystem for Overlay {
    fn has_base(&self) -> bool {
        true
    }

    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Entry, Errno> {
        for _ in 0..RETRIES {
            let seen = self.nodes.generation();
            match self.lookup_once(parent, name, seen) {
                Err(e) if e == Errno::EAGAIN => continue,
                r => return r,
            }
        }
        Err(Errno::EAGAIN)
    }

    fn peek(&self, parent: Ino, name: &[u8]) -> Option<Entry> {
        match self.nodes.resolve(parent)? {
            Target::Delta(p) => self.store.lookup(p, name).ok().map(|a| Entry {
                node: self.nodes.for_delta(a.ino),
                attr: self.fix(a),
            }),
            Target::Base { .. } => None,
        }
    }

    fn getattr(&self, node: Ino) -> Result<Attr, Errno> {
        match self.resolve(node)? {
            Target::Delta(x) => Ok(self.fix(self.store.getattr(x)?)),
            Target::Base { path, unlinked, .. } => {
                let st = self.base.lstat(&path)?.ok_or(Errno::ENOENT)?;
                let mut a = base::attr_of(&st);
                if unlinked {
                    a.nlink = 0;
                }
                Ok(a)
            }
        }
    }

    fn setattr(&self, node: Ino, set: &SetAttr) -> Result<Attr, Errno> {
        if set.size.is_some_and(|s| s > i64::MAX as u64) {
            return Err(Errno::EFBIG);
        }
        // Truncating a base file to zero (O_TRUNC) copies none of its bytes.
        let x = match (self.resolve(node)?, set.size) {
            (
                Target::Base {
                    path,
                    fp,
                    unlinked: false,
                },
                Some(0),
            ) => {
                let _g = self.change.lock();
                match self.resolve(node)? {
                    Target::Delta(x) => x,
                    _ => self.copy_up_as(&path, fp, true)?,
                }
            }
            _ => self.ensure_delta(node)?,
        };
        let mut partial = false;
        if let Some(size) = set.size {
            partial = self.partial.get(&self.store, x)?.is_some();
            self.partial.resize(&self.store, &self.base, x, size)?;
        }
        let a = if partial {
            self.store.setattr_now(x, set)?
        } else {
            self.store.setattr(x, set)?
        };
        Ok(self.fix(a))
    }

    fn readlink(&self, node: Ino) -> Result<Vec<u8>, Errno> {
        match self.resolve(node)? {
            Target::Delta(x) => self.store.readlink(x),
            Target::Base { path, .. } => self.base.readlink(&path),
        }
    }

    fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> Result<Entry, Errno> {
        self.create(parent, name, NewKind::Node { mode, rdev }, caller)
    }

    fn mkdir(&self, parent: Ino, name: &[u8], mode: u32, caller: Caller) -> Result<Entry, Errno> {
        self.create(parent, name, NewKind::Dir { perm: mode }, caller)
    }

    fn tmpfile(&self, parent: Ino, perm: u32, caller: Caller) -> Result<Entry, Errno> {
        // The directory is copied up so the new inode's group follows it as in the base.
        let p = self.ensure_delta(parent)?;
        let a = self.store.tmpfile(p, perm, caller)?;
        Ok(self.delta_entry(a))
    }

    fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        caller: Caller,
    ) -> Result<Entry, Errno> {
        self.create(parent, name, NewKind::Symlink { target }, caller)
    }

    fn link(&self, node: Ino, newparent: Ino, newname: &[u8]) -> Result<Entry, Errno> {
        let _g = self.change.lock();
        if let Target::Base { path, .. } = self.resolve(node)? {
            if self.base.lstat(&path)?.is_some_and(|st| is_dir(st.st_mode)) {
                return Err(Errno::EPERM);
            }
        }
        let x = self.ensure_delta_locked(node)?;
        let np = self.ensure_delta_locked(newparent)?;
        let unwhiteout = self.free_name(np, newname)?;
        let fx = Effects {
            unwhiteout: unwhiteout.as_deref(),
            ..Effects::NONE
        };
        let a = self.store.link_fx(x, np, newname, &fx)?;
        Ok(self.delta_entry(a))
    }

    fn unlink(&self, parent: Ino, name: &[u8], refs: &LookupRefs) -> Result<Option<Ino>, Errno> {
        let _g = self.change.lock();
        let p = self.ensure_delta_locked(parent)?;
        let live = Live {
            refs,
            nodes: &self.nodes,
        };
        match self.presence(p, name)? {
            (Presence::Delta(_), path) => {
                let kept = if self.base_has(path.as_deref())? {
                    let fx = Effects {
                        whiteout: path.as_deref(),
                        ..Effects::NONE
                    };
                    self.store.remove_fx(p, name, false, &live, &fx)?
                } else {
                    // Nothing to hide in the base: a plain unlink, which the caches may answer.
                    self.store.unlink(p, name, &live)?
                };
                Ok(kept.map(|x| self.nodes.for_delta(x)))
            }
            (Presence::Base(st), Some(path)) => {
                if is_dir(st.st_mode) {
                    return Err(Errno::EISDIR);
                }
                self.store
                    .whiteout(p, &path, false, &BaseSeen::of_stat(&st))?;
                self.nodes.unlinked(&path);
                Ok(None)
            }
            _ => Err(Errno::ENOENT),
        }
    }

    fn rmdir(&self, parent: Ino, name: &[u8], refs: &LookupRefs) -> Result<(), Errno> {
        if name == b"." {
            return Err(Errno::EINVAL);
        }
        if name == b".." {
            return Err(Errno::ENOTEMPTY);
        }
        let _g = self.change.lock();
        let p = self.ensure_delta_locked(parent)?;
        let live = Live {
            refs,
            nodes: &self.nodes,
        };
        match self.presence(p, name)? {
            (Presence::Delta(a), path) => {
                if !is_dir(a.mode) {
                    return Err(Errno::ENOTDIR);
                }
                if let (true, Some(path)) = (self.merged(a.ino), path.as_deref()) {
                    self.base_children_hidden(Some(a.ino), path)?;
                }
                if self.base_has(path.as_deref())? {
                    let fx = Effects {
                        whiteout: path.as_deref(),
                        clear_children: path.as_deref(),
                        ..Effects::NONE
                    };
                    self.store.remove_fx(p, name, true, &live, &fx)?;
                } else {
                    // Nothing to hide in the base: a plain rmdir, which the caches may answer.
                    self.store.rmdir_clearing(p, name, path.as_deref(), &live)?;
                }
                self.paths.lock().remove(&a.ino);
                Ok(())
            }
            (Presence::Base(st), Some(path)) => {
                if !is_dir(st.st_mode) {
                    return Err(Errno::ENOTDIR);
                }
                self.base_children_hidden(None, &path)?;
                self.store
                    .whiteout(p, &path, true, &BaseSeen::of_stat(&st))?;
                self.nodes.unlinked(&path);
                Ok(())
            }
            _ => Err(Errno::ENOENT),
        }
    }

    fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: RenameFlags,
        refs: &LookupRefs,
    ) -> Result<(), Errno> {
        let _g = self.change.lock();
        let p = self.ensure_delta_locked(parent)?;
        let np = self.ensure_delta_locked(newparent)?;
        let live = Live {
            refs,
            nodes: &self.nodes,
        };
        let (src, src_path) = self.presence(p, name)?;
        // A directory that has a base part cannot move: its children would have to move too.
        let src_ino = match src {
            Presence::Absent { .. } => return Err(Errno::ENOENT),
            Presence::Base(st) if is_dir(st.st_mode) => return Err(Errno::EXDEV),
            Presence::Delta(a) if is_dir(a.mode) && self.merged(a.ino) => return Err(Errno::EXDEV),
            Presence::Delta(a) => a.ino,
            Presence::Base(_) => {
                let path = src_path.as_deref().ok_or(Errno::EIO)?;
                self.copy_up(path, None)?
            }
        };
        let src_attr = self.store.getattr(src_ino)?;
        let (dst, dst_path) = self.presence(np, newname)?;
        let mut fx = Effects::NONE;
        let mut replaced_base = false;
        let dst_seen;
        match dst {
            Presence::Delta(a) if a.ino == src_ino => return Ok(()),
            Presence::Delta(a) => {
                if is_dir(a.mode) && self.merged(a.ino) {
                    if flags.exchange {
                        return Err(Errno::EXDEV);
                    }
                    if is_dir(src_attr.mode) {
                        if let Some(path) = dst_path.as_deref() {
                            self.base_children_hidden(Some(a.ino), path)?;
                        }
                    }
                    fx.clear_children = dst_path.as_deref();
                }
            }
            Presence::Base(st) => {
                if flags.noreplace {
                    return Err(Errno::EEXIST);
                }
                if flags.exchange {
                    if is_dir(st.st_mode) {
                        return Err(Errno::EXDEV);
                    }
                    let path = dst_path.as_deref().ok_or(Errno::EIO)?;
                    self.copy_up(path, None)?;
                } else {
                    match (is_dir(src_attr.mode), is_dir(st.st_mode)) {
                        (true, false) => return Err(Errno::ENOTDIR),
                        (false, true) => return Err(Errno::EISDIR),
                        (true, true) => {
                            let path = dst_path.as_deref().ok_or(Errno::EIO)?;
                            self.base_children_hidden(None, path)?;
                        }
                        (false, false) => {}
                    }
                    replaced_base = true;
                    dst_seen = BaseSeen::of_stat(&st);
                    fx.seen = dst_path.as_deref().map(|p| (p, &dst_seen));
                }
            }
            Presence::Absent { whiteout } => {
                if flags.exchange {
                    return Err(Errno::ENOENT);
                }
                if whiteout {
                    fx.unwhiteout = dst_path.as_deref();
                }
            }
        }
        if !flags.exchange && self.base_has(src_path.as_deref())? {
            fx.whiteout = src_path.as_deref();
        }
        self.store
            .rename_fx(p, name, np, newname, flags, &live, &fx)?;
        if replaced_base {
            if let Some(path) = dst_path.as_deref() {
                self.nodes.unlinked(path);
            }
        }
        Ok(())
    }

    fn forget(&self, forgotten: &[(Ino, u64)], refs: &LookupRefs) {
        let mut released = Vec::new();
        for &(node, n) in forgotten {
            let f = refs.forget(node, n);
            if node.0 & nodes::VIRTUAL != 0 {
                self.release(node, n);
            } else if f.orphan_released {
                released.push(node);
            }
        }
        self.reap(&released);
    }

    fn adopt_orphans(&self, refs: &LookupRefs) -> Result<(), Errno> {
        // A copy-up into an orphan commits before its node names it; both happen under the
        // change lock, so no such orphan is seen unnamed here.
        let _change = self.change.lock();
        let live = Live {
            refs,
            nodes: &self.nodes,
        };
        let mut unreferenced = self.store.orphans()?;
        unreferenced.retain(|&x| !live.retain_orphan(x));
        self.reap(&unreferenced);
        Ok(())
    }

    fn unused(&self, node: Ino) {
        if node.0 & nodes::VIRTUAL != 0 {
            self.release(node, 1);
        }
    }

    fn read(&self, node: Ino, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        match self.resolve(node)? {
            Target::Delta(x) => match self.partial.get(&self.store, x)? {
                Some(p) => p.read(&self.store, &self.base, x, offset, size),
                None => self.store.read(x, offset, size),
            },
            Target::Base { path, fp, .. } => match fp {
                Some(fp) => self.base.read(node, &path, fp, offset, size),
                None => {
                    let st = self.base.lstat(&path)?.ok_or(Errno::ENOENT)?;
                    Err(if is_dir(st.st_mode) {
                        Errno::EISDIR
                    } else {
                        Errno::EINVAL
                    })
                }
            },
        }
    }

    fn write(&self, node: Ino, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let x = self.ensure_delta(node)?;
        if let Some(p) = self.partial.get(&self.store, x)? {
            p.own_range(&self.store, &self.base, x, offset, data.len() as u64)?;
        }
        self.store.write(x, offset, data)
    }

    fn fallocate(&self, node: Ino, offset: u64, length: u64, mode: u32) -> Result<(), Errno> {
        if offset
            .checked_add(length)
            .is_none_or(|e| e > i64::MAX as u64)
        {
            return Err(Errno::EFBIG);
        }
        let x = self.ensure_delta(node)?;
        if let Some(p) = self.partial.get(&self.store, x)? {
            let size = self.store.getattr(x)?.size;
            p.own_within_base(&self.store, &self.base, x, offset, length, size)?;
        }
        self.store.fallocate(x, offset, length, mode)
    }

    fn lseek(&self, node: Ino, offset: u64, whence: u32) -> Result<u64, Errno> {
        let whole = |size: u64| -> Result<u64, Errno> {
            if offset >= size {
                return Err(Errno::ENXIO);
            }
            Ok(if whence == libc::SEEK_DATA as u32 {
                offset
            } else {
                size
            })
        };
        match self.resolve(node)? {
            Target::Delta(x) => match self.partial.get(&self.store, x)? {
                Some(_) => whole(self.store.getattr(x)?.size),
                None => self.store.lseek(x, offset, whence),
            },
            Target::Base { .. } => whole(self.getattr(node)?.size),
        }
    }

    fn copy_file_range(
        &self,
        node_in: Ino,
        off_in: u64,
        node_out: Ino,
        off_out: u64,
        len: u64,
    ) -> Result<u64, Errno> {
        let out = self.ensure_delta(node_out)?;
        if let Target::Delta(i) = self.resolve(node_in)? {
            let whole = |x| Ok::<_, Errno>(self.partial.get(&self.store, x)?.is_none());
            if whole(i)? && whole(out)? {
                return self.store.copy_file_range(i, off_in, out, off_out, len);
            }
        }
        self.copy_range_slow(node_in, off_in, node_out, off_out, len)
    }

    fn fsync(&self, node: Ino) -> Result<(), Errno> {
        match self.resolve(node)? {
            Target::Delta(x) => self.store.fsync(x),
            Target::Base { .. } => Ok(()),
        }
    }

    fn sync(&self) -> Result<(), Errno> {
        self.store.sync()
    }

    fn readdir(&self, node: Ino, offset: u64, max: usize) -> Result<Vec<DirEntry>, Errno> {
        Ok(self
            .list(node, offset, max)?
            .into_iter()
            .map(|(mut e, src)| {
                if let Source::Delta(a) = src {
                    e.ino = self.fix(a).ino;
                }
                e
            })
            .collect())
    }

    fn readdirplus(
        &self,
        node: Ino,
        offset: u64,
        max: usize,
    ) -> Result<Vec<(DirEntry, Entry)>, Errno> {
        let mut out = Vec::new();
        for (e, src) in self.list(node, offset, max)? {
            let dot = e.name == b"." || e.name == b"..";
            let entry = match src {
                Source::Delta(a) if dot => Entry {
                    node: Ino(0),
                    attr: self.fix(a),
                },
                Source::Delta(a) => self.delta_entry(a),
                Source::Dot(a) => Entry {
                    node: Ino(0),
                    attr: a,
                },
                Source::Base(path) => {
                    let mut found = None;
                    for _ in 0..RETRIES {
                        let seen = self.nodes.generation();
                        match self.base_entry(&path, seen) {
                            Err(err) if err == Errno::EAGAIN => continue,
                            r => {
                                found = r?;
                                break;
                            }
                        }
                    }
                    // Gone from the base since the listing was read: leave it out.
                    match found {
                        Some(en) => en,
                        None => continue,
                    }
                }
            };
            out.push((
                DirEntry {
                    ino: entry.attr.ino,
                    ..e
                },
                entry,
            ));
        }
        Ok(out)
    }

    fn statfs(&self) -> Result<StatFs, Errno> {
        self.store.statfs()
    }

    fn setxattr(&self, node: Ino, name: &[u8], value: &[u8], flags: u32) -> Result<(), Errno> {
        let x = self.ensure_delta(node)?;
        self.store.setxattr(x, name, value, flags)
    }

    fn getxattr(&self, node: Ino, name: &[u8]) -> Result<Vec<u8>, Errno> {
        match self.resolve(node)? {
            Target::Delta(x) => self.store.getxattr(x, name),
            Target::Base { path, .. } => Ok(self.base.xattrs(&path)?.get(name)?),
        }
    }

    fn listxattr(&self, node: Ino) -> Result<Vec<u8>, Errno> {
        match self.resolve(node)? {
            Target::Delta(x) => self.store.listxattr(x),
            Target::Base { path, .. } => Ok(self.base.xattrs(&path)?.names()?),
        }
    }

    fn removexattr(&self, node: Ino, name: &[u8]) -> Result<(), Errno> {
        match self.resolve(node)? {
            Target::Delta(x) => self.store.removexattr(x, name),
            Target::Base { path, .. } => {
                self.base.xattrs(&path)?.get(name)?;
                let x = self.ensure_delta(node)?;
                self.store.removexattr(x, name)
            }
        }
    }

    fn node_path(&self, node: Ino) -> Result<Option<Vec<u8>>, Errno> {
        match self.resolve(node)? {
            Target::Base { unlinked: true, .. } => Ok(None),
            Target::Base { path, .. } => Ok(Some(path)),
            Target::Delta(ino) => Filesystem::node_path(self.store.as_ref(), ino),
        }
    }

    fn store(&self) -> &Store {
        &self.store
    }
}
