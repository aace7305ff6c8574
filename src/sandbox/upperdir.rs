//! The overlayfs backend's bridge to the delta (docs/sandbox.md, Mount backends): at launch the
//! delta is exported into an overlayfs upper directory under the project's directory, the
//! kernel serves the view from it over the host directory, and at each checkpoint and at the
//! end the upper directory is imported back into the delta, which stays the one truth for
//! diff, apply, snapshots and everything else.
//!
//! The mapping, both ways:
//!
//! | delta | upper |
//! |---|---|
//! | a file, symlink or special file | the same object, whole (partial-origin files with their base bytes) |
//! | a copy of a base object (`fs_origin`) that is not a directory | the object with an empty `user.overlay.origin` (what overlayfs writes on a copy-up in a user namespace) |
//! | a copied-up (merged) directory | a directory without `user.overlay.opaque`; the base directory at its path shows through |
//! | a directory made in the overlay (no `fs_origin`) | a directory with `user.overlay.opaque=y` |
//! | a whiteout (`fs_whiteout`) | a 0/0 character device, parents made like the base's where missing |
//! | hard links | hard links |
//! | mode, mtime, user and other extended attributes | the same (atime = mtime) |
//!
//! Owners: the upper holds the command's ids (as its files are written), so the command can
//! change what it sees; an import stores the upper's owners. `user.overlay.*` attributes are
//! overlayfs' own and never reach the delta, except `user.overlay.overlay.X`: overlayfs'
//! escape of a `user.overlay.X` the command set, stored in the delta as that.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::overlay::kernel_rdev;
use crate::store::overlay::join;
use crate::store::upper::{Body, NewNode, UpperCut, UpperError, UpperWriter, Xattrs};
use crate::store::{Ino, Store, Timespec};
use crate::sys::beneath::Beneath;

/// The upper directory of the project whose directory is `project_dir`.
pub fn upper_dir(project_dir: &Path) -> PathBuf {
    project_dir.join("upper")
}

/// What an upper directory is renamed to while it is removed.
const REMOVED: &str = "upper.removed";

/// Overlayfs' work directory beside it.
pub fn work_dir(project_dir: &Path) -> PathBuf {
    project_dir.join("work")
}

const OPAQUE: &[u8] = b"user.overlay.opaque";
const ORIGIN: &[u8] = b"user.overlay.origin";
/// Attributes overlayfs keeps for itself (with `userxattr`; `trusted.` without). One of these
/// names set through the mount is stored escaped, with a second `overlay.`.
const OWN_PREFIXES: [&[u8]; 2] = [b"user.overlay.", b"trusted.overlay."];

/// An attribute's name as the upper stores it: overlayfs' prefixes escaped.
fn escaped(name: &[u8]) -> Vec<u8> {
    for p in OWN_PREFIXES {
        if let Some(rest) = name.strip_prefix(p) {
            return [p, b"overlay.", rest].concat();
        }
    }
    name.to_vec()
}

/// The name an upper's attribute had when it was set through the mount; None for overlayfs'
/// own.
fn unescaped(name: &[u8]) -> Option<Vec<u8>> {
    for p in OWN_PREFIXES {
        if let Some(rest) = name.strip_prefix(p) {
            return rest.strip_prefix(b"overlay.").map(|r| [p, r].concat());
        }
    }
    Some(name.to_vec())
}

fn is_dir(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFDIR
}

/// `/a/b` of the delta as `a/b` below a tree's root.
fn rel(path: &[u8]) -> &[u8] {
    path.strip_prefix(b"/").unwrap_or(path)
}

fn show(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

fn io(what: &[u8]) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{}: {e}", show(what))
}

/// Give every directory under `dir` its owner's full access: overlayfs leaves directories
/// of mode 0 in its work directory.
fn open_up(dir: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(m) = std::fs::symlink_metadata(dir) else {
        return;
    };
    if !m.is_dir() {
        return;
    }
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            open_up(&e.path());
        }
    }
}

/// Remove the upper and work directories of `project_dir` (absent is fine).
pub fn remove(project_dir: &Path) -> Result<(), String> {
    // Renamed away first: a removal that stops halfway (a crash, a file it cannot delete)
    // leaves no partial upper that a later command would take for a run's changes.
    let (upper, gone) = (upper_dir(project_dir), project_dir.join(REMOVED));
    remove_dir(&gone)?;
    match std::fs::rename(&upper, &gone) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", upper.display())),
    }
    remove_dir(&gone)?;
    remove_dir(&work_dir(project_dir))
}

/// Remove the directory `d` and all it holds (absent is fine).
fn remove_dir(d: &Path) -> Result<(), String> {
    open_up(d);
    match std::fs::remove_dir_all(d) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("{}: {e}", d.display())),
    }
}

/// Make the directory `d`, owned by `owner` when given.
fn make_dir(d: &Path, owner: Option<(u32, u32)>) -> Result<(), String> {
    std::fs::create_dir(d).map_err(|e| format!("{}: {e}", d.display()))?;
    if let Some((u, g)) = owner {
        std::os::unix::fs::chown(d, Some(u), Some(g))
            .map_err(|e| format!("{}: {e}", d.display()))?;
    }
    Ok(())
}

/// An empty work directory beside an upper directory a run takes over as it is (owned by
/// `owner` as [`export`] makes it): overlayfs' leftovers of an earlier mount removed.
pub fn fresh_work(project_dir: &Path, owner: Option<(u32, u32)>) -> Result<(), String> {
    let work = work_dir(project_dir);
    remove_dir(&work)?;
    make_dir(&work, owner)
}

/// Export the delta of `store` (whose base is `source`) into a fresh upper directory (and an
/// empty work directory) of `project_dir`. `owner`: the ids every object gets (a root-started
/// sandbox's command); None leaves them to the caller's.
pub fn export(
    store: &Store,
    source: &Path,
    project_dir: &Path,
    owner: Option<(u32, u32)>,
) -> Result<(), String> {
    remove(project_dir)?;
    let upper = upper_dir(project_dir);
    let work = work_dir(project_dir);
    for d in [&upper, &work] {
        make_dir(d, owner)?;
    }
    let tree = Beneath::open(&upper).map_err(|e| format!("{}: {e}", upper.display()))?;
    let base = Beneath::open(source).map_err(|e| format!("{}: {e}", source.display()))?;
    store.upper_cut(|cut| {
        let mut out = Exporter {
            cut,
            tree: &tree,
            base: &base,
            owner,
            linked: HashMap::new(),
            finish: Vec::new(),
        };
        for (name, value) in cut.xattrs(cut.root.ino) {
            tree.set_xattr(b"", &escaped(&name), &value)
                .map_err(io(b"/"))?;
        }
        out.dir(cut.root.ino, b"/")?;
        for w in &cut.whiteouts {
            out.whiteout(w)?;
        }
        // Children before their parents: a directory's time is set after its last entry.
        let root = &cut.root;
        out.finish.push((b"/".to_vec(), root.mode, root.mtime));
        for (path, mode, mtime) in out.finish.iter().rev() {
            let r = rel(path);
            if mode & libc::S_IFMT != libc::S_IFLNK {
                tree.chmod(r, *mode).map_err(io(path))?;
            }
            tree.set_times(r, mtime.sec, mtime.nsec).map_err(io(path))?;
        }
        Ok(())
    })
}

struct Exporter<'a, 'c> {
    cut: &'a UpperCut<'c>,
    tree: &'a Beneath,
    base: &'a Beneath,
    owner: Option<(u32, u32)>,
    /// The first path of each inode with several names.
    linked: HashMap<Ino, Vec<u8>>,
    /// (path, mode, mtime) of every object made, in the order made.
    finish: Vec<(Vec<u8>, u32, Timespec)>,
}

impl Exporter<'_, '_> {
    fn dir(&mut self, ino: Ino, path: &[u8]) -> Result<(), String> {
        let mut children: Vec<_> = self.cut.children(ino).iter().collect();
        children.sort_by(|a, b| a.name.cmp(&b.name));
        for n in children {
            let p = join(path, &n.name);
            let r = rel(&p);
            if let Some(first) = self.linked.get(&n.ino) {
                self.tree.link(rel(first), r).map_err(io(&p))?;
                continue;
            }
            let kind = n.mode & libc::S_IFMT;
            match kind {
                libc::S_IFDIR => self.tree.mkdir(r, 0o700).map_err(io(&p))?,
                libc::S_IFREG => {
                    let data = self.cut.content(n.ino)?;
                    self.tree.create_file(r, &data, 0o600).map_err(io(&p))?;
                }
                libc::S_IFLNK => {
                    let target = self.cut.symlink(n.ino)?;
                    self.tree.symlink(&target, r).map_err(io(&p))?;
                }
                _ => self.tree.mknod(r, n.mode, n.rdev).map_err(io(&p))?,
            }
            for (name, value) in self.cut.xattrs(n.ino) {
                self.tree
                    .set_xattr(r, &escaped(&name), &value)
                    .map_err(io(&p))?;
            }
            match (kind, self.cut.origin(n.ino)) {
                (libc::S_IFDIR, None) => self.tree.set_xattr(r, OPAQUE, b"y").map_err(io(&p))?,
                (libc::S_IFDIR | libc::S_IFLNK, _) | (_, None) => {}
                (_, Some(_)) => self.tree.set_xattr(r, ORIGIN, b"").map_err(io(&p))?,
            }
            self.tree.chown(r, self.owner).map_err(io(&p))?;
            self.finish.push((p.clone(), n.mode, n.mtime));
            if kind == libc::S_IFDIR {
                self.dir(n.ino, &p)?;
            } else {
                self.linked.insert(n.ino, p);
            }
        }
        Ok(())
    }

    /// A 0/0 character device at `path` unless the upper has something there; missing parents
    /// are made as copies of the base's directories (merged, so not opaque).
    fn whiteout(&mut self, path: &[u8]) -> Result<(), String> {
        let r = rel(path);
        if r.is_empty() || self.tree.lstat(r).map_err(io(path))?.is_some() {
            return Ok(());
        }
        let mut at = 0;
        while let Some(i) = r[at..].iter().position(|b| *b == b'/') {
            let dir = &r[..at + i];
            at += i + 1;
            match self.tree.lstat(dir).map_err(io(dir))? {
                Some(st) if is_dir(st.mode) => continue,
                // A file of the delta replaced the directory: nothing below it to hide.
                Some(_) => return Ok(()),
                None => {}
            }
            let Some(b) = self.base.lstat(dir).map_err(io(dir))? else {
                return Ok(());
            };
            if !is_dir(b.mode) {
                return Ok(());
            }
            self.tree.mkdir(dir, 0o700).map_err(io(dir))?;
            self.tree.chown(dir, self.owner).map_err(io(dir))?;
            let mtime = Timespec {
                sec: b.raw.st_mtime,
                nsec: u32::try_from(b.raw.st_mtime_nsec).unwrap_or(0),
            };
            let mut p = b"/".to_vec();
            p.extend_from_slice(dir);
            self.finish.push((p, b.mode, mtime));
        }
        self.tree
            .mknod(r, libc::S_IFCHR, 0)
            .and_then(|()| self.tree.chown(r, self.owner))
            .map_err(io(path))
    }
}

/// What an import wrote into the delta.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct Imported {
    pub objects: u64,
    pub whiteouts: u64,
}

impl std::fmt::Display for Imported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} objects, {} whiteouts", self.objects, self.whiteouts)
    }
}

/// Replace the delta's upper layer of `store` (whose base is `source`) with what the upper
/// directory of `project_dir` holds, in one transaction. The caller holds the delta's lock.
/// A failure says whether the database ran out of space ([`UpperError::full`]); such a
/// failure also marks the project full (`agentfs status` shows it until an apply).
pub fn import(store: &Store, source: &Path, project_dir: &Path) -> Result<Imported, UpperError> {
    let upper = upper_dir(project_dir);
    let tree = Beneath::open(&upper).map_err(|e| format!("{}: {e}", upper.display()))?;
    let base = Beneath::open(source).map_err(|e| format!("{}: {e}", source.display()))?;
    let mut done = Imported::default();
    store
        .replace_upper(&|_| false, |w| {
            let mut i = Importer {
                tree: &tree,
                base: &base,
                w,
                linked: HashMap::new(),
                done: &mut done,
            };
            i.root()?;
            i.dir(b"/", true)
        })
        .map_err(|e| {
            if e.full {
                crate::store::space::mark_full(store.path());
            }
            e.context(format!("importing {}", upper.display()))
        })?;
    Ok(done)
}

struct Importer<'a, 'w> {
    tree: &'a Beneath,
    base: &'a Beneath,
    w: &'a mut UpperWriter<'w>,
    /// (st_dev, st_ino) of upper files with several names, and their inode in the delta.
    linked: HashMap<(u64, u64), Ino>,
    done: &'a mut Imported,
}

fn mtime_of(st: &libc::stat) -> Timespec {
    Timespec {
        sec: st.st_mtime,
        nsec: u32::try_from(st.st_mtime_nsec).unwrap_or(0),
    }
}

impl Importer<'_, '_> {
    /// The object's own extended attributes (overlayfs' left out), and whether overlayfs marked
    /// it opaque (`y`) or copied up (an origin of any value).
    fn xattrs(&self, path: &[u8]) -> Result<(Xattrs, bool, bool), UpperError> {
        let h = self.tree.xattr_handle(rel(path)).map_err(io(path))?;
        let names = h.names().map_err(io(path))?;
        let (mut own, mut opaque, mut origin) = (Vec::new(), false, false);
        for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
            let value = h.get(name).map_err(io(path))?;
            if name == OPAQUE {
                opaque = value == b"y";
            } else if name == ORIGIN {
                origin = true;
            } else if let Some(name) = unescaped(name) {
                own.push((name, value));
            }
        }
        own.sort();
        Ok((own, opaque, origin))
    }

    /// Record what the base holds at `path` and beneath it.
    fn seen_tree(&mut self, path: &[u8]) -> Result<(), UpperError> {
        let r = rel(path);
        let Some(st) = self.base.lstat(r).map_err(io(path))? else {
            return Ok(());
        };
        self.w.seen(path, &st.raw)?;
        if st.kind() == libc::S_IFDIR {
            for name in self.base.list(r).map_err(io(path))? {
                self.seen_tree(&join(path, &name))?;
            }
        }
        Ok(())
    }

    fn root(&mut self) -> Result<(), UpperError> {
        let st = self
            .tree
            .lstat(b"")
            .map_err(io(b"/"))?
            .ok_or("the upper directory vanished")?;
        let (xattrs, _, _) = self.xattrs(b"/")?;
        self.w.root(&NewNode {
            mode: st.mode,
            uid: st.raw.st_uid,
            gid: st.raw.st_gid,
            rdev: 0,
            mtime: mtime_of(&st.raw),
            origin: None,
            xattrs: &xattrs,
            body: Body::Dir,
        })
    }

    /// Import the entries of the upper directory at `path`; `merged`: the base directory at
    /// `path` shows through it (whiteouts and origins then mean something).
    fn dir(&mut self, path: &[u8], merged: bool) -> Result<(), UpperError> {
        let names = self.tree.list(rel(path)).map_err(io(path))?;
        for name in names {
            let p = join(path, &name);
            let r = rel(&p);
            let Some(st) = self.tree.lstat(r).map_err(io(&p))? else {
                continue;
            };
            let kind = st.kind();
            let lower = if merged {
                self.base.lstat(r).map_err(io(&p))?
            } else {
                None
            };
            if kind == libc::S_IFCHR && st.raw.st_rdev == 0 {
                if lower.is_some() {
                    self.w.whiteout(&p)?;
                    self.seen_tree(&p)?;
                    self.done.whiteouts += 1;
                }
                continue;
            }
            let key = (st.raw.st_dev, st.raw.st_ino);
            if kind != libc::S_IFDIR && st.raw.st_nlink > 1 {
                if let Some(ino) = self.linked.get(&key) {
                    self.w.link(path, &name, *ino)?;
                    continue;
                }
            }
            let (xattrs, opaque, copied) = self.xattrs(&p)?;
            let same_kind = lower.filter(|l| l.kind() == kind);
            if let Some(l) = lower {
                // A base object changed here, and all it held when it is no longer merged.
                if l.kind() == libc::S_IFDIR && (kind != libc::S_IFDIR || opaque) {
                    self.seen_tree(&p)?;
                } else {
                    self.w.seen(&p, &l.raw)?;
                }
            }
            let origin = match kind {
                libc::S_IFDIR if !opaque => same_kind.map(|l| l.raw.st_ino),
                libc::S_IFDIR => None,
                _ if copied => same_kind.map(|l| l.raw.st_ino),
                _ => None,
            };
            let data;
            let body = match kind {
                libc::S_IFDIR => Body::Dir,
                libc::S_IFREG => {
                    data = self.tree.read_file(r).map_err(io(&p))?;
                    Body::File(&data)
                }
                libc::S_IFLNK => {
                    data = self.tree.read_link(r).map_err(io(&p))?;
                    Body::Symlink(&data)
                }
                _ => Body::Special,
            };
            let ino = self.w.add(
                path,
                &name,
                &NewNode {
                    mode: st.mode,
                    uid: st.raw.st_uid,
                    gid: st.raw.st_gid,
                    rdev: kernel_rdev(st.raw.st_rdev),
                    mtime: mtime_of(&st.raw),
                    origin,
                    xattrs: &xattrs,
                    body,
                },
            )?;
            self.done.objects += 1;
            if kind == libc::S_IFDIR {
                self.dir(&p, origin.is_some())?;
            } else if st.raw.st_nlink > 1 {
                self.linked.insert(key, ino);
            }
        }
        Ok(())
    }
}

/// An upper directory a run left (its supervisor was killed before the end, or the delta had no
/// room for it) is newer than the delta `db`: a command about to change the delta from outside
/// a run, holding its lock, takes it in first, so the change starts from what the run did and
/// no later import of the stale upper overwrites it. None when `db` is not a project's delta or
/// no upper waits. An import that fails leaves the upper and the delta as they were (`full`
/// says the delta had no room).
pub fn settle(_held: &crate::sys::lock::DbLock, db: &Path) -> Result<Option<Imported>, UpperError> {
    let Some(dir) = waiting_beside(db) else {
        return Ok(None);
    };
    let store = Store::open(db, false).map_err(|e| format!("{}: {e}", db.display()))?;
    let source = store
        .overlay_config()?
        .map(|c| c.base_path)
        .ok_or("the project overlays no directory")?;
    let done = import(&store, &source, dir)?;
    drop(store);
    remove(dir)?;
    Ok(Some(done))
}

/// The upper directory of `project_dir`, for messages.
pub fn shown(project_dir: &Path) -> String {
    upper_dir(project_dir).display().to_string()
}

/// The project directory of `db` when `db` is a project's delta and an upper directory waits
/// beside it (a live overlayfs run's, or one a run left).
pub fn waiting_beside(db: &Path) -> Option<&Path> {
    let is_delta = db.file_name() == Some(std::ffi::OsStr::new(crate::project::DELTA));
    db.parent().filter(|d| is_delta && left_over(d))
}

/// Whether `project_dir` holds an upper directory a previous run left unimported.
pub fn left_over(project_dir: &Path) -> bool {
    upper_dir(project_dir).is_dir()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlayfs_names_are_escaped_both_ways() {
        assert_eq!(escaped(b"user.mine"), b"user.mine");
        assert_eq!(
            escaped(b"user.overlay.opaque"),
            b"user.overlay.overlay.opaque"
        );
        assert_eq!(
            unescaped(b"user.overlay.overlay.opaque").unwrap(),
            b"user.overlay.opaque"
        );
        assert_eq!(unescaped(b"user.overlay.opaque"), None);
        assert_eq!(unescaped(b"trusted.overlay.origin"), None);
        assert_eq!(unescaped(b"user.mine").unwrap(), b"user.mine");
    }
}
