//! The changes an overlay delta makes to its base directory (`agentfs diff`), as a git patch
//! ([`patch`]) and applied to the base ([`apply`]). SPEC.md, "Overlay delta: diff and apply",
//! describes the classification and the hashes.
//!
//! Only the delta tables are walked; the base is looked at (lstat, and reads of the files being
//! compared) at the paths the delta names, and listed in full only beneath directories that are
//! deleted or replaced by an opaque delta directory. Every base access goes through
//! [`Beneath`], so no symlink in the base is ever followed.

pub mod apply;
mod gitdelta;
mod hunks;
pub mod journal;
pub mod patch;

use crate::store::overlay::parent_path as parent;
use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::store::overlay::{join, DeltaEntry, PinnedRead, Snapshot};
use crate::store::{Ino, Store};
use crate::sys::beneath::{is_escape, Beneath, Stat};

/// What happened at a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    /// Ordered before `Added` so a type change lists the removal first.
    Deleted,
    Added,
    Modified,
}

impl Change {
    pub fn letter(self) -> char {
        match self {
            Change::Added => 'A',
            Change::Modified => 'M',
            Change::Deleted => 'D',
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Modified => "modified",
            Change::Deleted => "deleted",
        }
    }
}

/// The type of a filesystem object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A device, FIFO or socket: listed by diff, refused by patch and apply.
    Special,
}

impl Kind {
    pub fn of_mode(mode: u32) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Special,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
            Kind::Special => "special",
        }
    }
}

/// Where one side of a change lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Base,
    /// A delta inode; `origin` when it is a copy-up of the base object at its path.
    Delta {
        ino: Ino,
        origin: bool,
    },
}

/// One side (before: base, after: delta) of a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Side {
    pub kind: Kind,
    /// st_mode: type and permission bits.
    pub mode: u32,
    /// sha256 (hex) of the content: a file's bytes, a symlink's target; the empty input for
    /// directories and special files.
    pub hash: String,
    pub source: Source,
    /// Owner (uid, gid).
    pub owner: (u32, u32),
}

/// One reported change. `old` is the base side (absent for Added), `new` the delta side
/// (absent for Deleted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Absolute path in the overlay ("/a/b").
    pub path: Vec<u8>,
    pub change: Change,
    pub old: Option<Side>,
    pub new: Option<Side>,
}

impl Entry {
    /// The kind the entry reports: the delta side's, or the base side's for a deletion.
    pub fn kind(&self) -> Kind {
        self.new
            .as_ref()
            .or(self.old.as_ref())
            .map_or(Kind::File, |s| s.kind)
    }
}

/// sha256 as lowercase hex.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// Bytes as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes as a JSON string: themselves when UTF-8, else each byte outside valid UTF-8 as
/// `\xHH` (`diff --json` sends the exact bytes along in hex).
pub fn escaped(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// The path relative to the base root ("/a/b" -> "a/b").
pub fn rel(path: &[u8]) -> &[u8] {
    path.strip_prefix(b"/").unwrap_or(path)
}

fn show(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// A valid single name: not empty, not "." or "..", no '/' or NUL.
fn valid_name(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/') && !name.contains(&0)
}

/// A valid normalized absolute path other than "/".
fn valid_path(path: &[u8]) -> bool {
    path.len() > 1 && path[0] == b'/' && path[1..].split(|b| *b == b'/').all(valid_name)
}

/// An overlay delta opened for diff and apply: one read transaction on the database (so every
/// read sees the same cut, even while a mount writes), its snapshot and the base directory.
pub struct Overlay {
    reader: PinnedRead,
    pub snap: Snapshot,
    base: Beneath,
}

impl Overlay {
    /// Open the delta database `db` read-only and its base directory.
    pub fn open(db: &Path) -> Result<Overlay, String> {
        // Errors name their code first (`CODE: MESSAGE`), for the command line to classify.
        let store = Store::open(db, true).map_err(|e| format!("{}: {e}", e.code()))?;
        let reader = store.overlay_pinned()?;
        let snap = reader.snapshot()?;
        let base = Beneath::open(&snap.config.base_path).map_err(|e| {
            let code = match crate::errors::Code::of_io(&e) {
                crate::errors::Code::NotFound => crate::errors::Code::BaseMissing,
                c => c,
            };
            format!("{code}: base {}: {e}", snap.config.base_path.display())
        })?;
        Ok(Overlay { reader, snap, base })
    }

    pub fn base(&self) -> &Beneath {
        &self.base
    }

    /// lstat in the base; nothing when a component on the way is a symlink (the base has no
    /// object at that path without following one).
    pub fn base_stat(&self, path: &[u8]) -> Result<Option<Stat>, String> {
        match self.base.lstat(rel(path)) {
            Ok(s) => Ok(s),
            Err(e) if is_escape(&e) => Ok(None),
            Err(e) => Err(format!("base {}: {e}", show(path))),
        }
    }

    /// The content of one side: a file's bytes or a symlink's target (empty otherwise).
    pub fn content(&self, path: &[u8], side: &Side) -> Result<Vec<u8>, String> {
        let base_err = |e: std::io::Error| format!("base {}: {e}", show(path));
        match (side.kind, side.source) {
            (Kind::File, Source::Delta { ino, .. }) => {
                let po = i64::try_from(ino.0)
                    .ok()
                    .and_then(|i| self.snap.partial.get(&i));
                self.reader.file(ino, po)
            }
            (Kind::Symlink, Source::Delta { ino, .. }) => self.reader.symlink(ino),
            (Kind::File, Source::Base) => self.base.read_file(rel(path)).map_err(base_err),
            (Kind::Symlink, Source::Base) => self.base.read_link(rel(path)).map_err(base_err),
            _ => Ok(Vec::new()),
        }
    }

    pub(crate) fn base_side(&self, path: &[u8], st: &Stat) -> Result<(Side, Vec<u8>), String> {
        let mut side = Side {
            kind: Kind::of_mode(st.mode),
            mode: st.mode,
            hash: String::new(),
            source: Source::Base,
            owner: (st.raw.st_uid, st.raw.st_gid),
        };
        let content = self.content(path, &side)?;
        side.hash = sha256_hex(&content);
        Ok((side, content))
    }

    fn delta_side(&self, path: &[u8], e: &DeltaEntry) -> Result<(Side, Vec<u8>), String> {
        let mut side = Side {
            kind: Kind::of_mode(e.meta.mode),
            mode: e.meta.mode,
            hash: String::new(),
            source: Source::Delta {
                ino: e.meta.ino,
                origin: e.origin,
            },
            owner: (e.meta.uid, e.meta.gid),
        };
        let content = self.content(path, &side)?;
        side.hash = sha256_hex(&content);
        Ok((side, content))
    }

    /// Every change, sorted by path (a type change: Deleted, then Added).
    pub fn changes(&self) -> Result<Vec<Entry>, String> {
        let mut out = Changes::default();
        let root = self
            .snap
            .delta
            .entries
            .get(b"/".as_slice())
            .ok_or("the delta has no root directory")?;
        self.walk_dir(b"/", root, true, &mut out)?;
        self.orphan_whiteouts(&mut out)?;
        Ok(out.0.into_values().collect())
    }

    /// The children of delta directory `path`; `base_dir`: the base has a directory there.
    fn walk_dir(
        &self,
        path: &[u8],
        e: &DeltaEntry,
        base_dir: bool,
        out: &mut Changes,
    ) -> Result<(), String> {
        for name in &e.children {
            if !valid_name(name) {
                return Err(format!(
                    "invalid name {:?} in delta directory {}",
                    show(name),
                    show(path)
                ));
            }
            let cpath = join(path, name);
            let child = self
                .snap
                .delta
                .entries
                .get(&cpath)
                .ok_or_else(|| format!("delta entry {} vanished", show(&cpath)))?;
            self.visit(&cpath, child, base_dir, out)?;
        }
        if !base_dir {
            return Ok(());
        }
        let merging = e.origin || path == b"/";
        if merging {
            let whiteouts = self.snap.delta.whiteouts.get(path).map(Vec::as_slice);
            for w in whiteouts.unwrap_or_default() {
                if !valid_path(w) {
                    return Err(format!("invalid whiteout path {:?}", show(w)));
                }
                if self.snap.delta.entries.contains_key(w) {
                    continue;
                }
                if let Some(st) = self.base_stat(w)? {
                    self.deleted_tree(w, &st, out)?;
                }
            }
        } else {
            let names = self
                .base
                .list(rel(path))
                .map_err(|err| format!("base {}: {err}", show(path)))?;
            for name in names {
                if e.children.contains(&name) {
                    continue;
                }
                let cpath = join(path, &name);
                if let Some(st) = self.base_stat(&cpath)? {
                    self.deleted_tree(&cpath, &st, out)?;
                }
            }
        }
        Ok(())
    }

    /// Classify delta entry `path` against the base (`parent_base_dir`: the base has a
    /// directory at the parent path, so it may have something here).
    fn visit(
        &self,
        path: &[u8],
        e: &DeltaEntry,
        parent_base_dir: bool,
        out: &mut Changes,
    ) -> Result<(), String> {
        let base = if parent_base_dir {
            self.base_stat(path)?
        } else {
            None
        };
        let (new, new_content) = self.delta_side(path, e)?;
        let is_dir = new.kind == Kind::Dir;
        let base_dir = match base {
            Some(st) if Kind::of_mode(st.mode) == new.kind => {
                let (old, old_content) = self.base_side(path, &st)?;
                if old.mode & 0o7777 != new.mode & 0o7777 || old_content != new_content {
                    out.push(path, Change::Modified, Some(old), Some(new));
                }
                true
            }
            Some(st) => {
                self.deleted_tree(path, &st, out)?;
                out.push(path, Change::Added, None, Some(new));
                false
            }
            None => {
                out.push(path, Change::Added, None, Some(new));
                false
            }
        };
        if is_dir {
            self.walk_dir(path, e, base_dir, out)?;
        }
        Ok(())
    }

    /// Report base object `path` and, for a directory, everything beneath it as deleted.
    fn deleted_tree(&self, path: &[u8], st: &Stat, out: &mut Changes) -> Result<(), String> {
        let (old, _) = self.base_side(path, st)?;
        let dir = old.kind == Kind::Dir;
        out.push(path, Change::Deleted, Some(old), None);
        if dir {
            let names = self
                .base
                .list(rel(path))
                .map_err(|e| format!("base {}: {e}", show(path)))?;
            for name in names {
                let cpath = join(path, &name);
                if let Some(cst) = self.base_stat(&cpath)? {
                    self.deleted_tree(&cpath, &cst, out)?;
                }
            }
        }
        Ok(())
    }

    /// Whiteouts whose parent is not in the delta: they hide a base entry when the nearest
    /// delta ancestor is a merging directory and no whiteout lies between.
    fn orphan_whiteouts(&self, out: &mut Changes) -> Result<(), String> {
        let d = &self.snap.delta;
        let mut all: Vec<&Vec<u8>> = d.whiteout_set.iter().collect();
        all.sort();
        for w in all {
            if !valid_path(w) {
                return Err(format!("invalid whiteout path {:?}", show(w)));
            }
            if d.entries.contains_key(w) {
                continue;
            }
            let mut anc = parent(w);
            if d.entries.contains_key(anc) {
                continue; // handled by walk_dir
            }
            let effective = loop {
                if d.whiteout_set.contains(anc) {
                    break false;
                }
                anc = parent(anc);
                if let Some(a) = d.entries.get(anc) {
                    break a.meta.is_dir() && (a.origin || anc == b"/");
                }
            };
            if effective {
                if let Some(st) = self.base_stat(w)? {
                    self.deleted_tree(w, &st, out)?;
                }
            }
        }
        Ok(())
    }
}

/// Changes keyed by (path, change), so the result is sorted and nothing is listed twice.
#[derive(Default)]
struct Changes(BTreeMap<(Vec<u8>, Change), Entry>);

impl Changes {
    fn push(&mut self, path: &[u8], change: Change, old: Option<Side>, new: Option<Side>) {
        self.0.insert(
            (path.to_vec(), change),
            Entry {
                path: path.to_vec(),
                change,
                old,
                new,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_names() {
        assert_eq!(parent(b"/a/b"), b"/a");
        assert_eq!(parent(b"/a"), b"/");
        assert!(valid_path(b"/a/b"));
        for bad in [&b"/"[..], b"a", b"/a/../b", b"/a//b", b"/a/", b"/./a"] {
            assert!(!valid_path(bad), "{bad:?}");
        }
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
