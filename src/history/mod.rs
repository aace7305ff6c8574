//! History of a delta's upper layer: snapshots as content-addressed objects in a SQLite
//! database of their own (docs/history.md), HEAD and tags, restore and undo as new commits,
//! path-level diffs of two snapshots, and gc.
//!
//! Works on paths only: the delta database and the store directory. A snapshot reads the
//! delta in one read transaction (safe beside a running server) and writes the store in one
//! transaction; a restore rewrites the delta's upper layer in one transaction and must run
//! with no server on the delta (the caller takes the server lock).

pub mod checkpoint;
pub mod db;
pub mod ignore;
pub mod object;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use rusqlite::Connection;

use crate::store::overlay::join;
use crate::store::upper::{Body, NewNode, Node, UpperCut, UpperWriter};
use crate::store::{Ino, Store, Timespec};
use db::{Db, FileKey, Unreachable};
pub use ignore::Ignore;
use object::{
    decode_commit, decode_tree, decode_whiteouts, encode_commit, encode_tree, encode_whiteouts,
    hex, Commit, CommitKind, Entry, Hash, ObjKind, State, Target,
};

/// What `snapshot` records besides the state.
#[derive(Clone)]
pub struct SnapOptions<'a> {
    pub kind: CommitKind,
    pub message: &'a str,
    /// Name the new commit (refused when the tag exists).
    pub tag: Option<&'a str>,
    pub ignore: &'a Ignore,
    /// Leave HEAD where it is (the commit is reachable only through its tag, if any).
    pub detached: bool,
    /// Record nothing when the state equals HEAD's.
    pub only_if_changed: bool,
    /// Called once the read transaction of the delta holds its snapshot, before the walk: a
    /// checkpoint thaws the sandbox here, since nothing written after it can enter the cut.
    pub on_cut: Option<&'a dyn Fn()>,
}

impl<'a> SnapOptions<'a> {
    pub fn manual(message: &'a str, ignore: &'a Ignore) -> Self {
        SnapOptions {
            kind: CommitKind::Manual,
            message,
            tag: None,
            ignore,
            detached: false,
            only_if_changed: false,
            on_cut: None,
        }
    }
}

/// What a snapshot did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapReport {
    /// The new commit (None: the state equals HEAD's and `only_if_changed` was asked).
    pub commit: Option<Hash>,
    pub tree: Hash,
    /// Objects of the upper layer recorded (files, directories, symlinks, special files).
    pub entries: u64,
    /// Files whose bytes were read and hashed (not found unchanged in the file cache).
    pub files_hashed: u64,
    /// Files recognised as unchanged by the file cache.
    pub files_cached: u64,
    /// Entries and whiteouts left out by the ignore patterns.
    pub ignored: u64,
    pub whiteouts: u64,
    /// New objects and the compressed bytes they added to the store.
    pub objects_added: u64,
    pub bytes_added: u64,
}

/// One commit as `log` and `list` show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitInfo {
    pub hash: Hash,
    pub commit: Commit,
    pub tags: Vec<String>,
    pub head: bool,
    /// A checkpoint retention pruned: listed, but its state is not kept.
    pub pruned: bool,
}

/// One path-level change between two snapshots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub path: Vec<u8>,
    /// 'A', 'M' or 'D'.
    pub change: char,
    /// file, dir, symlink, special or whiteout.
    pub kind: &'static str,
}

/// What a restore did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreReport {
    /// The commit the upper layer now equals.
    pub target: Hash,
    /// The commit recording the restore.
    pub commit: Hash,
    /// The commit that saved the state before the restore, when it differed from HEAD.
    pub saved: Option<Hash>,
    /// Ignored subtrees kept in place, and those dropped (their directory is gone).
    pub kept: Vec<Vec<u8>>,
    pub dropped: Vec<Vec<u8>>,
    pub files: u64,
}

/// What gc found (and, unless a dry run, deleted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcReport {
    pub objects: Vec<Unreachable>,
    pub bytes: u64,
    /// References to missing objects after the run (an empty list for a sound store).
    pub dangling: Vec<db::Finding>,
}

/// The history of one delta.
pub struct History {
    db: Db,
}

fn now() -> (i64, u32) {
    since_epoch(std::time::SystemTime::now())
}

fn since_epoch(t: std::time::SystemTime) -> (i64, u32) {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (d.as_secs() as i64, d.subsec_nanos())
}

/// How recent a file's times may be and its cache row still be trusted. The kernel stamps
/// the times of a file written through its writeback cache from a clock that moves once per
/// tick (at most 10 ms), so a write just after a snapshot can leave size, mtime and ctime as
/// the snapshot saw them while the bytes differ. A file stamped within this margin before the
/// snapshot began is read again by the next one.
const RACY_MARGIN: std::time::Duration = std::time::Duration::from_millis(20);

/// A tag name: 1..100 bytes of letters, digits, `.`, `_`, `-`; not `HEAD` nor a hash-like word.
pub fn check_tag(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !name.starts_with('-')
        && !name.starts_with("HEAD");
    if !ok {
        return Err(format!(
            "bad_tag: {name:?} (letters, digits, '.', '_', '-'; not starting with '-' or HEAD)"
        ));
    }
    Ok(())
}

fn load_commit(c: &Connection, h: &Hash) -> Result<Commit, String> {
    match db::get(c, h)? {
        (ObjKind::Commit, raw) => {
            decode_commit(&raw).map_err(|e| format!("bad_object: commit {}: {e}", hex(h)))
        }
        (k, _) => Err(format!(
            "bad_object: {} is a {}, not a commit",
            hex(h),
            k.name()
        )),
    }
}

/// The state of commit `h`; refused when retention pruned it (its objects may be gone).
fn load_state(c: &Connection, h: &Hash) -> Result<State, String> {
    if db::is_pruned(c, h).map_err(db::sql("history"))? {
        return Err(format!(
            "pruned: checkpoint {} was pruned by retention; its state is not kept",
            &hex(h)[..12]
        ));
    }
    Ok(load_commit(c, h)?.state)
}

fn load_tree(c: &Connection, h: &Hash) -> Result<Vec<Entry>, String> {
    let (_, raw) = db::get(c, h)?;
    decode_tree(&raw).map_err(|e| format!("bad_object: tree {}: {e}", hex(h)))
}

fn load_whiteouts(c: &Connection, h: &Option<Hash>) -> Result<Vec<Vec<u8>>, String> {
    match h {
        Some(h) => {
            let (_, raw) = db::get(c, h)?;
            decode_whiteouts(&raw).map_err(|e| format!("bad_object: whiteouts {}: {e}", hex(h)))
        }
        None => Ok(Vec::new()),
    }
}

/// Resolve a reference: `HEAD`, `HEAD~N`, `HEAD^`, a tag, or a unique hex prefix (4+ digits)
/// of a commit.
fn resolve_in(c: &Connection, r: &str) -> Result<Hash, String> {
    let sqle = |e| db::sql(format_args!("resolving {r}"))(e);
    if let Some(rest) = r.strip_prefix("HEAD") {
        let back: u64 = match rest {
            "" => 0,
            "^" => 1,
            _ => rest
                .strip_prefix('~')
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("unknown_ref: {r}"))?,
        };
        let mut h = db::head(c)
            .map_err(sqle)?
            .ok_or_else(|| format!("unknown_ref: {r} (no snapshot yet)"))?;
        for _ in 0..back {
            h = load_commit(c, &h)?
                .parent
                .ok_or_else(|| format!("unknown_ref: {r} (history is shorter)"))?;
        }
        return Ok(h);
    }
    let tagged: Option<Vec<u8>> = rusqlite::OptionalExtension::optional(c.query_row(
        "SELECT hash FROM tags WHERE name = ?1",
        [r],
        |row| row.get(0),
    ))
    .map_err(sqle)?;
    if let Some(h) = tagged {
        return h.try_into().map_err(|_| format!("tag {r}: bad key"));
    }
    let lower = r.to_ascii_lowercase();
    if lower.len() >= 4 && lower.len() <= 64 && lower.bytes().all(|b| b.is_ascii_hexdigit()) {
        let mut st = c
            .prepare("SELECT hash FROM objects WHERE kind = 3 AND lower(hex(hash)) LIKE ?1 || '%'")
            .map_err(sqle)?;
        let found: Vec<Vec<u8>> = st
            .query_map([&lower], |row| row.get(0))
            .map_err(sqle)?
            .collect::<rusqlite::Result<_>>()
            .map_err(sqle)?;
        return match found.len() {
            1 => found[0]
                .clone()
                .try_into()
                .map_err(|_| format!("{r}: bad key")),
            0 => Err(format!("unknown_ref: {r}")),
            n => Err(format!("ambiguous_ref: {r} names {n} commits")),
        };
    }
    Err(format!("unknown_ref: {r}"))
}

/// The walk of one snapshot: the upper layer's objects into the store.
struct Walk<'a, 'c> {
    c: &'a Connection,
    cut: &'a UpperCut<'c>,
    ignore: &'a Ignore,
    cache: &'a HashMap<i64, (FileKey, Hash)>,
    /// Regular files with more than one recorded name: inode -> the first name in byte order.
    links: HashMap<u64, Vec<u8>>,
    seen: HashSet<i64>,
    fresh: Vec<(FileKey, Hash)>,
    /// A file whose mtime or ctime is not before this is read but not cached (see
    /// [`RACY_MARGIN`]).
    racy_from: (i64, u32),
    report: SnapReport,
}

impl Walk<'_, '_> {
    fn put(&mut self, kind: ObjKind, raw: &[u8], children: &[Hash]) -> Result<Hash, String> {
        let (h, added) = db::put(self.c, kind, raw, children)?;
        if added > 0 {
            self.report.objects_added += 1;
            self.report.bytes_added += added;
        }
        Ok(h)
    }

    fn blob(&mut self, n: &Node) -> Result<Hash, String> {
        let key = FileKey {
            ino: n.ino.0 as i64,
            size: n.size as i64,
            mtime: (n.mtime.sec, n.mtime.nsec),
            ctime: (n.ctime.sec, n.ctime.nsec),
        };
        self.seen.insert(key.ino);
        // A cached blob is stored: gc deletes a blob's cache rows in its own transaction.
        if let Some((k, h)) = self.cache.get(&key.ino) {
            if *k == key {
                self.report.files_cached += 1;
                return Ok(*h);
            }
        }
        let bytes = self.cut.content(n.ino)?;
        self.report.files_hashed += 1;
        let h = self.put(ObjKind::Blob, &bytes, &[])?;
        if key.mtime < self.racy_from && key.ctime < self.racy_from {
            self.fresh.push((key, h));
        }
        Ok(h)
    }

    /// Every regular file the snapshot records under more than one name, with the first of
    /// those names in byte order (ignored names are not recorded, so they do not count).
    fn find_links(&mut self) {
        let mut names: HashMap<u64, (usize, Vec<u8>)> = HashMap::new();
        let mut dirs = vec![(self.cut.root.ino, b"/".to_vec())];
        while let Some((ino, path)) = dirs.pop() {
            for child in self.cut.children(ino) {
                if self.ignore.name(&child.name) {
                    continue;
                }
                let p = join(&path, &child.name);
                match child.mode & libc::S_IFMT {
                    libc::S_IFDIR => dirs.push((child.ino, p)),
                    libc::S_IFREG => {
                        let e = names.entry(child.ino.0).or_insert((0, p.clone()));
                        e.0 += 1;
                        if p < e.1 {
                            e.1 = p;
                        }
                    }
                    _ => {}
                }
            }
        }
        self.links = names
            .into_iter()
            .filter(|(_, (n, _))| *n > 1)
            .map(|(ino, (_, first))| (ino, first))
            .collect();
    }

    /// The entry of `n` at `path`; `depth` bounds the recursion by the deepest possible path.
    fn entry(&mut self, n: &Node, path: &[u8], root: bool, depth: usize) -> Result<Entry, String> {
        self.report.entries += 1;
        let target = match n.mode & libc::S_IFMT {
            libc::S_IFDIR => Target::Dir {
                tree: self.dir(n.ino, path, depth + 1)?,
            },
            libc::S_IFREG => match self.links.get(&n.ino.0) {
                Some(first) if first.as_slice() != path => Target::Link {
                    path: first.clone(),
                },
                _ => Target::File {
                    blob: self.blob(n)?,
                    size: n.size,
                },
            },
            libc::S_IFLNK => Target::Symlink {
                target: self.cut.symlink(n.ino)?,
            },
            _ => Target::Special,
        };
        Ok(Entry {
            name: n.name.clone(),
            mode: n.mode,
            uid: n.uid,
            gid: n.gid,
            rdev: n.rdev,
            mtime_sec: n.mtime.sec,
            mtime_nsec: n.mtime.nsec,
            origin: if root { None } else { self.cut.origin(n.ino) },
            xattrs: self.cut.xattrs(n.ino),
            target,
        })
    }

    fn dir(&mut self, ino: Ino, path: &[u8], depth: usize) -> Result<Hash, String> {
        // A path has at most PATH_MAX / 2 components: deeper means a cycle of names.
        if depth > libc::PATH_MAX as usize / 2 {
            return Err(format!(
                "directory inode {} is nested too deep (a cycle?)",
                ino.0
            ));
        }
        let cut = self.cut;
        let mut entries = Vec::new();
        for child in cut.children(ino) {
            if self.ignore.name(&child.name) {
                self.report.ignored += 1;
                continue;
            }
            entries.push(self.entry(child, &join(path, &child.name), false, depth)?);
        }
        let raw = encode_tree(&mut entries);
        let refs: Vec<Hash> = entries.iter().filter_map(Entry::child).collect();
        self.put(ObjKind::Tree, &raw, &refs)
    }

    fn state(&mut self) -> Result<State, String> {
        let cut = self.cut;
        self.find_links();
        let root = self.entry(&cut.root, b"/", true, 0)?;
        self.report.entries -= 1;
        let mut paths: Vec<Vec<u8>> = Vec::new();
        for p in &cut.whiteouts {
            if self.ignore.path(p) {
                self.report.ignored += 1;
            } else {
                paths.push(p.clone());
            }
        }
        self.report.whiteouts = paths.len() as u64;
        let whiteouts = if paths.is_empty() {
            None
        } else {
            let raw = encode_whiteouts(&mut paths);
            Some(self.put(ObjKind::Whiteouts, &raw, &[])?)
        };
        Ok(State { root, whiteouts })
    }
}

fn ts(sec: i64, nsec: u32) -> Timespec {
    Timespec { sec, nsec }
}

/// Writes a stored state into the delta (inside the replacing transaction).
/// What [`History::fill_upper`] made: the state, what was kept, the files (inode, blob, size,
/// mtime) and their change time.
type Filled = (
    State,
    crate::store::upper::Kept,
    Vec<(Ino, Hash, u64, (i64, u32))>,
    (i64, u32),
);

struct Fill<'a> {
    c: &'a Connection,
    files: Vec<(Ino, Hash, u64, (i64, u32))>,
    /// Regular files made, by path (the targets of hard links).
    by_path: HashMap<Vec<u8>, Ino>,
    /// Hard links to make once every file exists: (directory path, name, target path).
    links: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)>,
}

impl Fill<'_> {
    fn node<'e>(e: &'e Entry, body: Body<'e>) -> NewNode<'e> {
        NewNode {
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
            rdev: e.rdev,
            mtime: ts(e.mtime_sec, e.mtime_nsec),
            origin: e.origin,
            xattrs: &e.xattrs,
            body,
        }
    }

    fn dir(&mut self, w: &mut UpperWriter<'_>, path: &[u8], tree: &Hash) -> Result<(), String> {
        for e in load_tree(self.c, tree)? {
            let bytes;
            let body = match &e.target {
                Target::Dir { .. } => Body::Dir,
                Target::File { blob, .. } => {
                    bytes = db::get(self.c, blob)?.1;
                    Body::File(&bytes)
                }
                Target::Symlink { target } => Body::Symlink(target),
                Target::Special => Body::Special,
                Target::Link { path: to } => {
                    self.links.push((path.to_vec(), e.name.clone(), to.clone()));
                    continue;
                }
            };
            let ino = w.add(path, &e.name, &Self::node(&e, body))?;
            match &e.target {
                Target::Dir { tree } => self.dir(w, &join(path, &e.name), tree)?,
                Target::File { blob, size } => {
                    self.by_path.insert(join(path, &e.name), ino);
                    self.files
                        .push((ino, *blob, *size, (e.mtime_sec, e.mtime_nsec)))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Make the hard links recorded in the state, after every file exists.
    fn links(&mut self, w: &mut UpperWriter<'_>) -> Result<(), String> {
        for (dir, name, to) in std::mem::take(&mut self.links) {
            let ino = *self.by_path.get(&to).ok_or_else(|| {
                let shown = String::from_utf8_lossy(&join(&dir, &name)).into_owned();
                format!("{shown}: hard link to a file the state does not hold")
            })?;
            w.link(&dir, &name, ino)?;
        }
        Ok(())
    }
}

impl History {
    /// Open (creating when absent) the history kept in store directory `dir`.
    pub fn open(dir: &Path) -> Result<History, String> {
        Ok(History { db: Db::open(dir)? })
    }

    pub fn db_path(&self) -> &Path {
        self.db.path()
    }

    /// Record the upper layer of `delta` as a new commit (see [`SnapOptions`]).
    pub fn snapshot(&mut self, delta: &Path, o: &SnapOptions<'_>) -> Result<SnapReport, String> {
        if let Some(t) = o.tag {
            check_tag(t)?;
        }
        let store = Store::open(delta, true).map_err(|e| format!("{}: {e}", e.code()))?;
        self.db.write(|c| {
            let sqle = |e| db::sql("history")(e);
            if let Some(t) = o.tag {
                let exists: bool = c
                    .query_row(
                        "SELECT EXISTS(SELECT 1 FROM tags WHERE name = ?1)",
                        [t],
                        |r| r.get(0),
                    )
                    .map_err(sqle)?;
                if exists {
                    return Err(format!("tag_exists: {t}"));
                }
            }
            let cache = db::load_cache(c).map_err(sqle)?;
            let parent = db::head(c).map_err(sqle)?;
            let racy_from = since_epoch(std::time::SystemTime::now() - RACY_MARGIN);
            let (state, walk_report, seen, fresh) =
                store.upper_cut_then(o.on_cut.unwrap_or(&|| {}), |cut| {
                    let mut w = Walk {
                        racy_from,
                        c,
                        cut,
                        ignore: o.ignore,
                        cache: &cache,
                        links: HashMap::new(),
                        seen: HashSet::new(),
                        fresh: Vec::new(),
                        report: SnapReport::default(),
                    };
                    let state = w.state()?;
                    Ok((state, w.report, w.seen, w.fresh))
                })?;
            let mut report = walk_report;
            report.tree = state.tree();
            for ino in cache.keys().filter(|i| !seen.contains(i)) {
                db::cache_drop(c, *ino).map_err(sqle)?;
            }
            for (k, h) in &fresh {
                db::cache_put(c, k, h).map_err(sqle)?;
            }
            if o.only_if_changed {
                if let Some(p) = &parent {
                    if load_commit(c, p)?.state == state {
                        return Ok(report);
                    }
                }
            }
            let (time_sec, time_nsec) = now();
            let commit = Commit {
                state,
                parent,
                kind: o.kind,
                time_sec,
                time_nsec,
                message: o.message.to_string(),
            };
            let (h, added) = db::put(
                c,
                ObjKind::Commit,
                &encode_commit(&commit),
                &commit.children(),
            )?;
            report.objects_added += 1;
            report.bytes_added += added;
            if !o.detached {
                db::set_head(c, &h).map_err(sqle)?;
            }
            if let Some(t) = o.tag {
                c.execute("INSERT INTO tags (name, hash) VALUES (?1, ?2)", (t, &h[..]))
                    .map_err(sqle)?;
            }
            report.commit = Some(h);
            Ok(report)
        })
    }

    /// Resolve a reference (see `resolve_in`).
    pub fn resolve(&mut self, r: &str) -> Result<Hash, String> {
        self.db.read(|c| resolve_in(c, r))
    }

    /// The commit `h`.
    pub fn commit(&mut self, h: &Hash) -> Result<Commit, String> {
        self.db.read(|c| load_commit(c, h))
    }

    pub fn head(&mut self) -> Result<Option<Hash>, String> {
        self.db.read(|c| db::head(c).map_err(db::sql("history")))
    }

    /// Make the upper layer of `delta` equal the commit `target` names, as a new commit.
    /// The current state is saved first when it differs from HEAD's, so nothing is lost.
    /// Ignored paths of the current layer stay where they are (see docs/history.md). The
    /// caller holds the delta's server lock.
    pub fn restore(
        &mut self,
        delta: &Path,
        target: &str,
        ignore: &Ignore,
    ) -> Result<RestoreReport, String> {
        let h = self.resolve(target)?;
        let saved = self.save_current(delta, ignore)?;
        self.restore_to(delta, &h, ignore, &format!("restore {target}"), saved)
    }

    /// Go back to the state before HEAD (HEAD's parent), as a new commit: a second undo goes
    /// forward again. Unsaved changes are saved first and are what the undo takes back.
    pub fn undo(&mut self, delta: &Path, ignore: &Ignore) -> Result<RestoreReport, String> {
        let saved = self.save_current(delta, ignore)?;
        let head = self.head()?.ok_or("nothing_to_undo: no snapshot yet")?;
        let parent = self
            .commit(&head)?
            .parent
            .ok_or("nothing_to_undo: HEAD is the first snapshot")?;
        let msg = format!("undo {}", &hex(&head)[..12]);
        self.restore_to(delta, &parent, ignore, &msg, saved)
    }

    fn save_current(&mut self, delta: &Path, ignore: &Ignore) -> Result<Option<Hash>, String> {
        let o = SnapOptions {
            only_if_changed: true,
            ..SnapOptions::manual("saved before restore", ignore)
        };
        Ok(self.snapshot(delta, &o)?.commit)
    }

    fn restore_to(
        &mut self,
        delta: &Path,
        target: &Hash,
        ignore: &Ignore,
        message: &str,
        saved: Option<Hash>,
    ) -> Result<RestoreReport, String> {
        let (state, kept, files, ctime) = self.fill_upper(delta, target, ignore)?;
        self.db.write(|c| {
            let sqle = |e| db::sql("history")(e);
            let (time_sec, time_nsec) = now();
            let commit = Commit {
                state,
                parent: db::head(c).map_err(sqle)?,
                kind: CommitKind::Restore,
                time_sec,
                time_nsec,
                message: message.to_string(),
            };
            let (h, _) = db::put(
                c,
                ObjKind::Commit,
                &encode_commit(&commit),
                &commit.children(),
            )?;
            db::set_head(c, &h).map_err(sqle)?;
            // The restored files are known: the next snapshot need not read them again.
            c.execute("DELETE FROM file_cache", []).map_err(sqle)?;
            for (ino, blob, size, mtime) in &files {
                let key = FileKey {
                    ino: ino.0 as i64,
                    size: *size as i64,
                    mtime: *mtime,
                    ctime,
                };
                db::cache_put(c, &key, blob).map_err(sqle)?;
            }
            Ok(RestoreReport {
                target: *target,
                commit: h,
                saved,
                kept: kept.subtrees,
                dropped: kept.dropped,
                files: files.len() as u64,
            })
        })
    }

    /// Make the upper layer of `delta` equal the commit `target`, keeping the current layer's
    /// paths `ignore` matches; returns the state, what was kept, the files made (inode, blob,
    /// size, mtime) and the change time they got. Records nothing in the history.
    fn fill_upper(
        &mut self,
        delta: &Path,
        target: &Hash,
        ignore: &Ignore,
    ) -> Result<Filled, String> {
        let store = Store::open(delta, false).map_err(|e| format!("{}: {e}", e.code()))?;
        self.db.read(|c| {
            let state = load_state(c, target)?;
            let whiteouts = load_whiteouts(c, &state.whiteouts)?;
            let mut fill = Fill {
                c,
                files: Vec::new(),
                by_path: HashMap::new(),
                links: Vec::new(),
            };
            let mut ctime = (0, 0);
            let kept = store.replace_upper(&|p: &[u8]| ignore.path(p), |w| {
                w.root(&Fill::node(&state.root, Body::Dir))?;
                fill.dir(w, b"/", &state.tree())?;
                fill.links(w)?;
                for p in &whiteouts {
                    w.whiteout(p)?;
                }
                ctime = (w.now().sec, w.now().nsec);
                Ok(())
            })?;
            Ok((state, kept, fill.files, ctime))
        })
    }

    /// Make the upper layer of `delta`, a copy of a project's delta and never the live one,
    /// exactly the snapshot `reference` names (the copy's own paths, ignored ones too, are
    /// dropped), so `agentfs apply --from` reads a frozen state. Returns the commit.
    pub fn materialize(&mut self, delta: &Path, reference: &str) -> Result<Hash, String> {
        let h = self.resolve(reference)?;
        self.fill_upper(delta, &h, &Ignore::none())?;
        Ok(h)
    }

    /// Apply the checkpoint retention: along the history from HEAD, the newest `keep`
    /// checkpoints keep their state, and of the older ones the newest of each hour (UTC);
    /// every other checkpoint is pruned (see [`db::prune`]). HEAD and its parent, tagged
    /// commits and commits of other kinds are never pruned. `keep` 0 prunes nothing. Returns
    /// the commits pruned now.
    pub fn prune_checkpoints(&mut self, keep: u64) -> Result<Vec<Hash>, String> {
        if keep == 0 {
            return Ok(Vec::new());
        }
        self.db.write(|c| {
            let sqle = |e| db::sql("history")(e);
            let head = db::head(c).map_err(sqle)?;
            let tagged: HashSet<Hash> = db::tags(c)
                .map_err(sqle)?
                .into_iter()
                .map(|t| t.1)
                .collect();
            let mut seen = 0u64;
            let mut hours = HashSet::new();
            let mut gone = Vec::new();
            let mut next = head;
            let mut depth = 0;
            while let Some(h) = next {
                let commit = load_commit(c, &h)?;
                next = commit.parent;
                depth += 1;
                if commit.kind != CommitKind::Checkpoint || tagged.contains(&h) || depth <= 2 {
                    continue;
                }
                seen += 1;
                let newest_of_hour = hours.insert(commit.time_sec.div_euclid(3600));
                if seen <= keep || newest_of_hour || db::is_pruned(c, &h).map_err(sqle)? {
                    continue;
                }
                db::prune(c, &h, commit.parent.as_ref()).map_err(sqle)?;
                gone.push(h);
            }
            Ok(gone)
        })
    }

    /// Every commit with its tags, oldest first, HEAD marked.
    pub fn list(&mut self) -> Result<Vec<CommitInfo>, String> {
        self.db.read(|c| {
            let sqle = |e| db::sql("history")(e);
            let head = db::head(c).map_err(sqle)?;
            let tags = db::tags(c).map_err(sqle)?;
            let hashes: Vec<Vec<u8>> = {
                let mut st = c
                    .prepare("SELECT hash FROM objects WHERE kind = 3")
                    .map_err(sqle)?;
                let it = st.query_map([], |r| r.get(0)).map_err(sqle)?;
                it.collect::<rusqlite::Result<_>>().map_err(sqle)?
            };
            let mut out = Vec::new();
            for h in hashes {
                let Ok(h) = Hash::try_from(h) else { continue };
                out.push(info(c, h, &head, &tags)?);
            }
            out.sort_by_key(|i| (i.commit.time_sec, i.commit.time_nsec, i.hash));
            Ok(out)
        })
    }

    /// The history back from HEAD, newest first.
    pub fn log(&mut self) -> Result<Vec<CommitInfo>, String> {
        self.log_upto(usize::MAX)
    }

    /// The first `n` commits of [`History::log`] (1: HEAD's alone, without reading the rest).
    pub fn log_upto(&mut self, n: usize) -> Result<Vec<CommitInfo>, String> {
        self.db.read(|c| {
            let sqle = |e| db::sql("history")(e);
            let head = db::head(c).map_err(sqle)?;
            let tags = db::tags(c).map_err(sqle)?;
            let mut out = Vec::new();
            let mut next = head;
            while let Some(h) = next.filter(|_| out.len() < n) {
                let i = info(c, h, &head, &tags)?;
                next = i.commit.parent;
                out.push(i);
            }
            Ok(out)
        })
    }

    /// Path-level changes from the state of `a` to the state of `b`, sorted by path.
    pub fn diff(&mut self, a: &str, b: &str) -> Result<Vec<Change>, String> {
        self.db.read(|c| {
            let sa = load_state(c, &resolve_in(c, a)?)?;
            let sb = load_state(c, &resolve_in(c, b)?)?;
            let mut out: BTreeMap<Vec<u8>, Change> = BTreeMap::new();
            if !sa.root.same_attrs(&sb.root) {
                push(&mut out, b"/", 'M', "dir");
            }
            diff_trees(c, b"/", Some(&sa.tree()), Some(&sb.tree()), &mut out)?;
            let wa: HashSet<Vec<u8>> = load_whiteouts(c, &sa.whiteouts)?.into_iter().collect();
            let wb: HashSet<Vec<u8>> = load_whiteouts(c, &sb.whiteouts)?.into_iter().collect();
            for p in wb.difference(&wa) {
                push(&mut out, p, 'D', "whiteout");
            }
            for p in wa.difference(&wb) {
                push(&mut out, p, 'A', "whiteout");
            }
            Ok(out.into_values().collect())
        })
    }

    /// Delete (or with `dry_run` only list) every object no tag or HEAD reaches.
    pub fn gc(&mut self, dry_run: bool) -> Result<GcReport, String> {
        self.db.write(|c| {
            let sqle = |e| db::sql("history")(e);
            let objects = db::unreachable(c).map_err(sqle)?;
            if !dry_run {
                db::delete(c, &objects).map_err(sqle)?;
            }
            let dangling = db::dangling(c).map_err(sqle)?;
            let bytes = objects.iter().map(|u| u.stored).sum();
            Ok(GcReport {
                objects,
                bytes,
                dangling,
            })
        })
    }

    /// The store's integrity check: its findings, none when sound.
    pub fn check(&mut self) -> Result<Vec<db::Finding>, String> {
        self.db.read(db::check)
    }

    /// (objects, stored bytes) in the store.
    pub fn usage(&mut self) -> Result<(u64, u64), String> {
        self.db.read(|c| {
            c.query_row(
                "SELECT count(*), coalesce(sum(length(body)), 0) FROM objects",
                [],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
            )
            .map_err(db::sql("history"))
        })
    }
}

fn info(
    c: &Connection,
    h: Hash,
    head: &Option<Hash>,
    tags: &[(String, Hash)],
) -> Result<CommitInfo, String> {
    Ok(CommitInfo {
        hash: h,
        commit: load_commit(c, &h)?,
        tags: tags
            .iter()
            .filter(|(_, t)| *t == h)
            .map(|(n, _)| n.clone())
            .collect(),
        head: head.as_ref() == Some(&h),
        pruned: db::is_pruned(c, &h).map_err(db::sql("history"))?,
    })
}

fn push(out: &mut BTreeMap<Vec<u8>, Change>, path: &[u8], change: char, kind: &'static str) {
    out.entry(path.to_vec()).or_insert(Change {
        path: path.to_vec(),
        change,
        kind,
    });
}

/// Every entry beneath the tree `h` at `path` reported as `change`.
fn whole(
    c: &Connection,
    path: &[u8],
    h: &Hash,
    change: char,
    out: &mut BTreeMap<Vec<u8>, Change>,
) -> Result<(), String> {
    for e in load_tree(c, h)? {
        let p = join(path, &e.name);
        push(out, &p, change, e.kind_name());
        if let Target::Dir { tree } = &e.target {
            whole(c, &p, tree, change, out)?;
        }
    }
    Ok(())
}

fn diff_trees(
    c: &Connection,
    path: &[u8],
    a: Option<&Hash>,
    b: Option<&Hash>,
    out: &mut BTreeMap<Vec<u8>, Change>,
) -> Result<(), String> {
    if a == b {
        return Ok(());
    }
    let ea = match a {
        Some(h) => load_tree(c, h)?,
        None => Vec::new(),
    };
    let eb = match b {
        Some(h) => load_tree(c, h)?,
        None => Vec::new(),
    };
    let ma: BTreeMap<&[u8], &Entry> = ea.iter().map(|e| (e.name.as_slice(), e)).collect();
    let mb: BTreeMap<&[u8], &Entry> = eb.iter().map(|e| (e.name.as_slice(), e)).collect();
    let names: std::collections::BTreeSet<&[u8]> = ma.keys().chain(mb.keys()).copied().collect();
    for name in names {
        let p = join(path, name);
        match (ma.get(name), mb.get(name)) {
            (Some(x), None) => {
                push(out, &p, 'D', x.kind_name());
                if let Target::Dir { tree } = &x.target {
                    whole(c, &p, tree, 'D', out)?;
                }
            }
            (None, Some(y)) => {
                push(out, &p, 'A', y.kind_name());
                if let Target::Dir { tree } = &y.target {
                    whole(c, &p, tree, 'A', out)?;
                }
            }
            (Some(x), Some(y)) => match (&x.target, &y.target) {
                (Target::Dir { tree: ta }, Target::Dir { tree: tb }) => {
                    if !x.same_attrs(y) {
                        push(out, &p, 'M', "dir");
                    }
                    diff_trees(c, &p, Some(ta), Some(tb), out)?;
                }
                _ if x.kind_name() != y.kind_name() => {
                    push(out, &p, 'M', y.kind_name());
                    if let Target::Dir { tree } = &x.target {
                        whole(c, &p, tree, 'D', out)?;
                    }
                    if let Target::Dir { tree } = &y.target {
                        whole(c, &p, tree, 'A', out)?;
                    }
                }
                _ => {
                    if x != y {
                        push(out, &p, 'M', y.kind_name());
                    }
                }
            },
            (None, None) => {}
        }
    }
    Ok(())
}
