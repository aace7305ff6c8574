//! Server-side caches keyed by inode, shared by every worker: attributes as stored (before the
//! store merges pending writes into them), name lookups (positive and negative) and whole
//! directory listings.
//!
//! They are acceleration structures only: every value is a copy of database rows, dropped by
//! the store's mutation methods after their transaction and before they return, and all of
//! them at once by [`Caches::clear`] (another process committed, or a transaction the store
//! cannot account for was rolled back). How a reader that raced a mutation is kept from
//! inserting what it read before the commit is explained at [`lru::Lru`].

mod lru;

use std::sync::Arc;

use crate::knobs::Knobs;
use crate::store::{Attr, DirEntry, Ino, Timespec};

pub use lru::Ticket;

/// Capacities in bytes (as weighed by [`attr_weight`], [`lookup_weight`] and
/// [`listing_weight`]); 0 turns a cache off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Attributes of inodes (a sixteenth of it for the marks of new inodes known to have no
    /// extended attributes).
    pub attr: usize,
    /// (directory, name) lookups.
    pub lookup: usize,
    /// Whole directory listings.
    pub readdir: usize,
}

impl CacheConfig {
    /// No caching at all.
    pub const OFF: CacheConfig = CacheConfig {
        attr: 0,
        lookup: 0,
        readdir: 0,
    };

    /// The caches' share of the memory budget (a quarter each for attributes and lookups,
    /// half for listings), or [`CacheConfig::OFF`] under the kill switch `AGENTFS_CACHE=0`.
    pub fn from_knobs(k: &Knobs) -> CacheConfig {
        if !k.cache {
            return Self::OFF;
        }
        let share =
            usize::try_from(crate::memory::Shares::from_knobs(k).caches).unwrap_or(usize::MAX);
        CacheConfig {
            attr: share / 4,
            lookup: share / 4,
            readdir: share - 2 * (share / 4),
        }
    }
}

/// A directory's whole listing in cookie order ("." and ".." first), or the note that it has
/// more entries than the cache may hold (so the store pages through the database instead).
#[derive(Clone, Debug)]
pub enum Listing {
    Entries(Vec<DirEntry>),
    TooBig,
}

/// What a change of one name did to its directory's listing, for a cached listing to follow
/// the change instead of being dropped.
#[derive(Debug)]
pub enum ListingEdit {
    /// Not known (a rename, a failed operation): the listing goes.
    Unknown,
    /// The name was added as this entry, whose cookie is larger than every other entry's of
    /// the directory (a new dentry's id is larger than every id in the table).
    Added(DirEntry),
    /// The name of this inode went.
    Removed(Ino),
}

/// Most entries a cached listing may have for a change to be followed in it rather than drop
/// it: each edit looks the name up in the whole listing, so following every create in a
/// directory of n entries would cost O(n²).
const FOLLOW_MAX: usize = 1024;

impl ListingEdit {
    /// Apply the change of `name` to `l`, whether or not `l` already saw it; false when it
    /// cannot be followed (the listing must go). `limit`: most entries a listing may hold.
    fn apply(&self, name: &[u8], l: &mut Listing, limit: usize) -> bool {
        let Listing::Entries(es) = l else {
            // Only the note that the directory is too big to cache: it carries no entries.
            return !matches!(self, ListingEdit::Unknown);
        };
        if es.len() > FOLLOW_MAX {
            return false;
        }
        let at = es.iter().position(|x| x.name == name);
        match (self, at) {
            (ListingEdit::Unknown, _) => false,
            (ListingEdit::Added(e), Some(i)) => es[i].ino == e.ino && es[i].offset == e.offset,
            (ListingEdit::Added(e), None) => {
                let last = es.last().map_or(0, |l| l.offset);
                let fits = last < e.offset && es.len() < limit;
                if fits {
                    es.push(e.clone());
                }
                fits
            }
            (ListingEdit::Removed(ino), Some(i)) => {
                let same = es[i].ino == *ino;
                if same {
                    es.remove(i);
                }
                same
            }
            (ListingEdit::Removed(_), None) => true,
        }
    }
}

/// What one entry costs beside its key and value: the LRU list's links and the hash table's
/// slot, rounded up.
const ENTRY_OVERHEAD: usize = 64;

/// Bytes one cached attribute takes.
fn attr_weight() -> usize {
    std::mem::size_of::<(Ino, Attr)>() + ENTRY_OVERHEAD
}

/// Bytes one mark of an inode without extended attributes takes.
fn bare_weight() -> usize {
    std::mem::size_of::<Ino>() + ENTRY_OVERHEAD
}

/// Bytes one cached lookup of `name` takes.
fn lookup_weight(name: &[u8]) -> usize {
    std::mem::size_of::<(Vec<u8>, Option<Ino>)>() + 8 + name.len() + ENTRY_OVERHEAD
}

/// Bytes one listing entry takes, besides its name.
const LISTING_ENTRY: usize = std::mem::size_of::<DirEntry>();

/// Bytes a cached listing takes.
fn listing_weight(l: &Listing) -> usize {
    let entries = match l {
        Listing::Entries(e) => {
            e.capacity() * LISTING_ENTRY + e.iter().map(|e| e.name.capacity()).sum::<usize>()
        }
        Listing::TooBig => 0,
    };
    std::mem::size_of::<(Ino, Arc<Listing>)>() + entries + ENTRY_OVERHEAD
}

/// Locks per map for attributes and lookups (listings use one, so one big directory can use
/// the whole capacity).
const SHARDS: usize = 16;

/// The generations of every map, taken together before a database read.
#[derive(Clone, Copy, Debug)]
pub struct Tickets {
    attr: Option<Ticket>,
    lookup: Option<Ticket>,
    dirs: Option<Ticket>,
}

/// A name the caches held, with the inode it resolved to (None: known absent).
pub type CachedName = (Ino, Vec<u8>, Option<Ino>);

/// The three caches.
pub struct Caches {
    attr: Option<lru::Lru<Ino, Attr>>,
    /// Inodes this server created that have had no extended attribute since (the kernel asks
    /// a new file for `security.capability` before its first write).
    bare: Option<lru::Lru<Ino, ()>>,
    /// Key: the parent's number (8 bytes, little endian) followed by the name.
    lookup: Option<lru::Lru<Vec<u8>, Option<Ino>>>,
    dirs: Option<lru::Lru<Ino, Arc<Listing>>>,
    readdir_cap: usize,
    /// Told every changed name, also with the caches off: the names a lost commit undoes.
    journal: std::sync::OnceLock<Arc<crate::store::Failure>>,
    /// Bumped by every [`Caches::clear`] before it empties the maps.
    clears: std::sync::atomic::AtomicU64,
}

fn name_key(parent: Ino, name: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + name.len());
    k.extend_from_slice(&parent.0.to_le_bytes());
    k.extend_from_slice(name);
    k
}

fn split_key(k: &[u8]) -> Option<(Ino, Vec<u8>)> {
    let (p, name) = k.split_at_checked(8)?;
    let p = u64::from_le_bytes(p.try_into().ok()?);
    Some((Ino(p), name.to_vec()))
}

impl Caches {
    pub fn new(cfg: CacheConfig) -> Caches {
        Caches {
            attr: lru::Lru::new(cfg.attr - cfg.attr / 16, SHARDS),
            bare: lru::Lru::new(cfg.attr / 16, SHARDS),
            lookup: lru::Lru::new(cfg.lookup, SHARDS),
            dirs: lru::Lru::new(cfg.readdir, 1),
            readdir_cap: cfg.readdir,
            journal: std::sync::OnceLock::new(),
            clears: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Whether a lost batch is recorded: the in-place updates and puts that follow a change
    /// then take back what they did (the loss clears the caches before or after them).
    fn batch_lost(&self) -> bool {
        self.journal.get().is_some_and(|j| j.errno().is_some())
    }

    /// Report every changed name to `j` from now on (once; later calls are ignored).
    pub fn set_journal(&self, j: Arc<crate::store::Failure>) {
        let _ = self.journal.set(j);
    }

    /// Take before reading the database; pass to the `put_*` calls afterwards.
    pub fn ticket(&self) -> Tickets {
        Tickets {
            attr: self.attr.as_ref().map(|m| m.ticket()),
            lookup: self.lookup.as_ref().map(|m| m.ticket()),
            dirs: self.dirs.as_ref().map(|m| m.ticket()),
        }
    }

    // ---- reads ----

    pub fn attr(&self, ino: Ino) -> Option<Attr> {
        self.attr.as_ref()?.get(&ino)
    }

    pub fn put_attr(&self, t: &Tickets, a: Attr) {
        if let (Some(m), Some(t)) = (&self.attr, t.attr) {
            m.insert(t, a.ino, a, attr_weight());
        }
    }

    /// Whether `ino` is known to have no extended attribute.
    pub fn bare(&self, ino: Ino) -> bool {
        self.bare.as_ref().is_some_and(|m| m.get(&ino).is_some())
    }

    /// How many times the caches were cleared; take before a create, for [`Caches::put_bare`].
    pub fn clears(&self) -> u64 {
        self.clears.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// `ino` was just created (`clears` was read before its transaction) and has no extended
    /// attribute. Only its creator knows the number yet, so no reader races this, and a later
    /// change of its extended attributes, or its end, drops the mark
    /// ([`Caches::xattrs_changed`]). What can race it is a clear (the create's batch lost,
    /// another process's change): a clear bumps the count before it empties the maps, so the
    /// mark is taken back if the count moved, and a clear that bumps after that check empties
    /// the map after the mark went in.
    pub fn put_bare(&self, ino: Ino, clears: u64) {
        if let Some(m) = &self.bare {
            m.insert(m.ticket(), ino, (), bare_weight());
            if self.clears() != clears {
                m.remove(&ino);
            }
        }
    }

    /// Some(Some(child)), Some(None) for a name known to be absent, None when not cached.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Option<Option<Ino>> {
        self.lookup.as_ref()?.get(name_key(parent, name).as_slice())
    }

    pub fn put_lookup(&self, t: &Tickets, parent: Ino, name: &[u8], child: Option<Ino>) {
        if let (Some(m), Some(t)) = (&self.lookup, t.lookup) {
            m.insert(t, name_key(parent, name), child, lookup_weight(name));
        }
    }

    /// Most entries a cached listing may have (counting short names); None when listings are
    /// not cached. A listing whose long names make it heavier than the cache is not kept.
    pub fn listing_limit(&self) -> Option<usize> {
        self.dirs
            .as_ref()
            .map(|_| self.readdir_cap / (LISTING_ENTRY + 16))
    }

    pub fn listing(&self, dir: Ino) -> Option<Arc<Listing>> {
        self.dirs.as_ref()?.get(&dir)
    }

    pub fn put_listing(&self, t: &Tickets, dir: Ino, l: Arc<Listing>) {
        if let (Some(m), Some(t)) = (&self.dirs, t.dirs) {
            let weight = listing_weight(&l);
            m.insert(t, dir, l, weight);
        }
    }

    // ---- invalidation: call after the change committed, before the operation returns ----

    /// `parent`/`name` was just created as `child` (call after [`Caches::entry_changed`] or
    /// [`Caches::entry_changed_at`] for it): both are known, so an unlink of the name can be
    /// answered without the database. A lost batch may undo the create; its clears come
    /// before or after these inserts, and the loss is recorded before the second, so after
    /// them a recorded loss takes them back.
    /// A new directory's listing ("." and "..") goes in too, so the unlinks and the RMDIR of
    /// a tree unpacked and removed again are answered without reading it.
    pub fn put_created(&self, parent: Ino, name: &[u8], child: &Attr) {
        let t = self.ticket();
        self.put_lookup(&t, parent, name, Some(child.ino));
        self.put_attr(&t, *child);
        if child.mode & libc::S_IFMT == libc::S_IFDIR {
            let dot = |ino, name: &[u8], offset| DirEntry {
                ino,
                name: name.to_vec(),
                kind: libc::S_IFDIR,
                offset,
            };
            let dots = vec![
                dot(child.ino, b".", crate::store::COOKIE_DOT),
                dot(parent, b"..", crate::store::COOKIE_DOTDOT),
            ];
            self.put_listing(&t, child.ino, Arc::new(Listing::Entries(dots)));
        }
        if self.batch_lost() {
            self.name_changed(parent, name, &ListingEdit::Unknown);
            self.inode_changed(child.ino);
            self.dir_changed(child.ino);
        }
    }

    /// `a` was read by the transaction that last changed `a.ino`, after its changes, and the
    /// writer is still held (so nothing changed it since), after [`Caches::inode_changed`]
    /// refused the readers in flight: it goes in. After a lost batch nothing does.
    pub fn put_committed(&self, a: Attr) {
        self.put_attr(&self.ticket(), a);
        if self.batch_lost() {
            self.inode_changed(a.ino);
        }
    }

    /// `ino`'s stored attributes changed (size, times, mode, owner, link count, blocks). Its
    /// extended attributes did not, so a mark that it has none stays: nothing but a setxattr
    /// gives an existing inode one (see [`Caches::xattrs_changed`]).
    pub fn inode_changed(&self, ino: Ino) {
        if let Some(m) = &self.attr {
            m.remove(&ino);
        }
    }

    /// `ino`'s extended attributes changed (and its ctime with them), or it may be gone: its
    /// attributes and its mark go.
    pub fn xattrs_changed(&self, ino: Ino) {
        self.inode_changed(ino);
        if let Some(m) = &self.bare {
            m.remove(&ino);
        }
    }

    /// The name `name` in `parent` appeared, vanished or now names another inode; the
    /// directory's listing and attributes (times, link count) changed with it.
    pub fn entry_changed(&self, parent: Ino, name: &[u8]) {
        self.name_changed(parent, name, &ListingEdit::Unknown);
        self.inode_changed(parent);
    }

    /// [`Caches::entry_changed`] for a change that set `parent`'s mtime and ctime to `t`,
    /// moved its link count by `links` (a subdirectory came or went) and left the rest of its
    /// attributes alone, and did `edit` to its listing: cached copies are brought up to date
    /// instead of dropped, so the GETATTR the kernel sends for the directory next, and its
    /// next listing, are answered from memory. Setting both times is the same whether or not
    /// the copy already saw the change; moving the link count is not, so a copy whose times
    /// are already `t` is kept only when the count did not move. A copy that may hold a later
    /// change is dropped: a later mtime, or a ctime as late as `t` without both times being
    /// `t` (a change at the same instant, a utimes that set an older mtime). After a lost
    /// batch nothing is updated: the loss is recorded before the caches are cleared the
    /// second time (see `Writer::lose_batch`), so either this sees it or that clear comes
    /// after.
    pub fn entry_changed_at(
        &self,
        parent: Ino,
        name: &[u8],
        t: Timespec,
        links: i32,
        edit: ListingEdit,
    ) {
        self.name_changed(parent, name, &edit);
        if let Some(m) = &self.attr {
            m.update(&parent, |a| {
                if a.mtime == t && a.ctime == t {
                    return (links == 0).then(attr_weight);
                }
                let later = a.mtime > t || a.ctime >= t;
                a.mtime = t;
                a.ctime = t;
                a.nlink = a.nlink.checked_add_signed(links)?;
                (!later).then(attr_weight)
            });
        }
        if self.batch_lost() {
            self.inode_changed(parent);
            self.dir_changed(parent);
        }
    }

    /// `name` in `parent` changed as `edit` says: the name's lookup goes, the listing follows
    /// the edit or goes.
    fn name_changed(&self, parent: Ino, name: &[u8], edit: &ListingEdit) {
        if let Some(j) = self.journal.get() {
            j.touched(parent, name);
        }
        if let Some(m) = &self.lookup {
            m.remove(name_key(parent, name).as_slice());
        }
        let (Some(m), Some(limit)) = (&self.dirs, self.listing_limit()) else {
            return;
        };
        m.update(&parent, |l| {
            let l = Arc::make_mut(l);
            edit.apply(name, l, limit).then(|| listing_weight(l))
        });
    }

    /// Whether `dir`'s cached listing has no entry but "." and "..".
    pub fn empty_dir(&self, dir: Ino) -> bool {
        self.listing(dir).is_some_and(|l| match &*l {
            Listing::Entries(es) => es.iter().all(|e| e.name == b"." || e.name == b".."),
            Listing::TooBig => false,
        })
    }

    /// `dir`'s listing changed without a name inside it changing (its ".." moved), or the
    /// directory is gone.
    pub fn dir_changed(&self, dir: Ino) {
        if let Some(m) = &self.dirs {
            m.remove(&dir);
        }
    }

    /// Drop everything (another process changed the database, or a rollback undid changes
    /// the caches may have seen).
    pub fn clear(&self) {
        self.clears
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Some(m) = &self.attr {
            m.clear();
        }
        if let Some(m) = &self.bare {
            m.clear();
        }
        if let Some(m) = &self.lookup {
            m.clear();
        }
        if let Some(m) = &self.dirs {
            m.clear();
        }
    }

    /// Bytes held by each cache: (attributes, lookups, listings).
    pub fn weights(&self) -> (usize, usize, usize) {
        (
            self.attr.as_ref().map_or(0, |m| m.weight())
                + self.bare.as_ref().map_or(0, |m| m.weight()),
            self.lookup.as_ref().map_or(0, |m| m.weight()),
            self.dirs.as_ref().map_or(0, |m| m.weight()),
        )
    }

    /// Evict least recently used entries until each cache holds at most `1/divisor` of its
    /// capacity (an idle server's floor).
    pub fn shrink(&self, divisor: usize) {
        if let Some(m) = &self.attr {
            m.shrink(divisor);
        }
        if let Some(m) = &self.bare {
            m.shrink(divisor);
        }
        if let Some(m) = &self.lookup {
            m.shrink(divisor);
        }
        if let Some(m) = &self.dirs {
            m.shrink(divisor);
        }
    }

    /// Every name the lookup and listing caches hold ("." and ".." excepted), with what it
    /// resolved to; used to tell the kernel which names another process changed.
    pub fn cached_names(&self) -> Vec<CachedName> {
        let mut out = Vec::new();
        if let Some(m) = &self.lookup {
            for (k, child) in m.entries() {
                if let Some((p, name)) = split_key(&k) {
                    out.push((p, name, child));
                }
            }
        }
        if let Some(m) = &self.dirs {
            for (dir, l) in m.entries() {
                if let Listing::Entries(es) = &*l {
                    for e in es.iter().filter(|e| e.name != b"." && e.name != b"..") {
                        out.push((dir, e.name.clone(), Some(e.ino)));
                    }
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// The entries of `l` after cookie `offset`, at most `max`.
pub fn page(entries: &[DirEntry], offset: u64, max: usize) -> Vec<DirEntry> {
    let start = entries.partition_point(|e| e.offset <= offset);
    entries[start..].iter().take(max).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(ino: u64, size: u64) -> Attr {
        Attr {
            ino: Ino(ino),
            mode: libc::S_IFREG | 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size,
            blocks: 0,
            atime: Default::default(),
            mtime: Default::default(),
            ctime: Default::default(),
            rdev: 0,
        }
    }

    /// An edit follows the change or says the listing must go: a name added twice or under
    /// an older cookie, a removed name that now leads elsewhere, a listing too long to search.
    #[test]
    fn a_listing_follows_an_edit_or_goes() {
        let entry = |name: &str, ino: u64, offset: u64| DirEntry {
            ino: Ino(ino),
            name: name.as_bytes().to_vec(),
            kind: libc::S_IFREG,
            offset,
        };
        let mut l = Listing::Entries(vec![entry(".", 1, 1), entry("..", 1, 2), entry("a", 5, 7)]);
        let add = |e: DirEntry| ListingEdit::Added(e);
        assert!(add(entry("b", 6, 9)).apply(b"b", &mut l, 100));
        assert!(
            add(entry("b", 6, 9)).apply(b"b", &mut l, 100),
            "seen already"
        );
        assert!(
            !add(entry("c", 8, 8)).apply(b"c", &mut l, 100),
            "an older cookie"
        );
        assert!(
            !add(entry("d", 9, 10)).apply(b"d", &mut l, 4),
            "over the limit"
        );
        assert!(ListingEdit::Removed(Ino(5)).apply(b"a", &mut l, 100));
        assert!(
            ListingEdit::Removed(Ino(5)).apply(b"a", &mut l, 100),
            "gone already"
        );
        assert!(
            !ListingEdit::Removed(Ino(7)).apply(b"b", &mut l, 100),
            "another inode"
        );
        let Listing::Entries(es) = &l else {
            unreachable!()
        };
        let names: Vec<&[u8]> = es.iter().map(|e| e.name.as_slice()).collect();
        assert_eq!(names, [&b"."[..], b"..", b"b"]);
        let many = (0..=FOLLOW_MAX as u64).map(|i| entry(&format!("f{i}"), 10 + i, 3 + i));
        let mut big = Listing::Entries(many.collect());
        let last = entry("new", 1, 10 + FOLLOW_MAX as u64);
        assert!(
            !add(last).apply(b"new", &mut big, usize::MAX),
            "too long to follow"
        );
        assert!(ListingEdit::Removed(Ino(1)).apply(b"x", &mut Listing::TooBig, 1));
        assert!(!ListingEdit::Unknown.apply(b"x", &mut Listing::TooBig, 1));
    }

    #[test]
    fn entry_change_drops_name_listing_and_parent_attrs() {
        // 64 lookups over 16 shards: 4 per shard, so the two names cannot evict each other
        // whichever shards they hash to.
        let c = Caches::new(CacheConfig {
            attr: 8 * attr_weight(),
            lookup: 64 * lookup_weight(b"a"),
            readdir: 8 * listing_weight(&Listing::TooBig),
        });
        let t = c.ticket();
        c.put_attr(&t, attr(1, 0));
        c.put_lookup(&t, Ino(1), b"a", Some(Ino(2)));
        c.put_lookup(&t, Ino(1), b"b", None);
        c.put_listing(&t, Ino(1), Arc::new(Listing::Entries(Vec::new())));
        assert_eq!(c.lookup(Ino(1), b"a"), Some(Some(Ino(2))));
        assert_eq!(c.lookup(Ino(1), b"b"), Some(None));
        c.entry_changed(Ino(1), b"a");
        assert_eq!(c.lookup(Ino(1), b"a"), None);
        assert_eq!(c.lookup(Ino(1), b"b"), Some(None));
        assert!(c.listing(Ino(1)).is_none());
        assert!(c.attr(Ino(1)).is_none());
        assert_eq!(
            c.cached_names(),
            vec![(Ino(1), b"b".to_vec(), None)],
            "names are reported with what they resolved to"
        );
    }

    #[test]
    fn off_caches_nothing() {
        let c = Caches::new(CacheConfig::OFF);
        let t = c.ticket();
        c.put_attr(&t, attr(3, 1));
        assert!(c.attr(Ino(3)).is_none());
        assert!(c.listing_limit().is_none());
    }

    #[test]
    fn caches_are_bounded_in_bytes_and_shrink_to_a_floor() {
        let c = Caches::new(CacheConfig {
            attr: 64 * 1024,
            lookup: 64 * 1024,
            readdir: 64 * 1024,
        });
        let long = vec![b'x'; 200];
        for i in 0..10_000u64 {
            let t = c.ticket();
            c.put_attr(&t, attr(i, 0));
            c.put_lookup(
                &t,
                Ino(1),
                &[long.as_slice(), &i.to_le_bytes()].concat(),
                None,
            );
        }
        let (a, l, _) = c.weights();
        assert!(a <= 64 * 1024 && a > 48 * 1024, "attributes weigh {a}");
        assert!(l <= 64 * 1024 && l > 48 * 1024, "lookups weigh {l}");
        // Long names cost more: fewer lookups than attributes fit in the same bytes.
        assert!(l / lookup_weight(&long) < a / attr_weight());
        c.shrink(8);
        let (a, l, _) = c.weights();
        assert!(a <= 8 * 1024 && l <= 8 * 1024, "after shrink: {a} {l}");
        assert!(c.attr(Ino(9_999)).is_some(), "the most recent entries stay");
    }

    #[test]
    fn page_resumes_after_cookie() {
        let es: Vec<DirEntry> = (1..=5)
            .map(|i| DirEntry {
                ino: Ino(i),
                name: vec![b'a' + i as u8],
                kind: libc::S_IFREG,
                offset: i * 10,
            })
            .collect();
        let p = page(&es, 20, 2);
        assert_eq!(p.iter().map(|e| e.offset).collect::<Vec<_>>(), vec![30, 40]);
        assert!(page(&es, 50, 8).is_empty());
        assert_eq!(page(&es, 0, 8).len(), 5);
    }
}
