//! Node ids for base objects.
//!
//! A delta inode is its own node id. A base object the kernel looks up gets a virtual node id
//! (bit 62 set, never a store inode number) that names it until the kernel forgets it. When
//! the object is copied up, its node id keeps naming it and now resolves to the delta inode;
//! later lookups of that inode hand out the same node id, so the kernel never sees one inode
//! under two ids. The table is rebuilt from nothing at each mount: it only maps ids the
//! kernel holds right now.
//!
//! Lock order: the store's writer lock may be held while this table's lock is taken (through
//! the liveness check of an unlink); never call into the store while holding it.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::store::Ino;

/// The bit that marks a virtual node id.
pub const VIRTUAL: u64 = 1 << 62;

/// What identifies one version of a base regular file: if any of these change, the file
/// changed under the mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    pub ino: u64,
    pub size: i64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl Fingerprint {
    pub fn of(st: &libc::stat) -> Fingerprint {
        Fingerprint {
            ino: st.st_ino,
            size: st.st_size,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }
}

/// What a node id stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A base object, by absolute path; `fp` is the version the kernel was shown (regular
    /// files only); `unlinked` once its name was removed through the mount.
    Base {
        path: Vec<u8>,
        fp: Option<Fingerprint>,
        unlinked: bool,
    },
    /// A delta inode.
    Delta(Ino),
}

#[derive(Default)]
struct Table {
    next: u64,
    nodes: HashMap<u64, Target>,
    /// Live base nodes by path (a newer version of a file replaces the entry).
    by_path: HashMap<Vec<u8>, u64>,
    /// Copied-up nodes by their delta inode.
    by_delta: HashMap<Ino, u64>,
    /// Copies published but not yet settled, for paths no node names yet: a lookup that
    /// still finds the base object there gets a node for the copy.
    pending: HashMap<Vec<u8>, Ino>,
    /// Bumped by every copy-up: a lookup that saw the base before a copy-up must retry.
    generation: u64,
    /// Kernel references per virtual node, taken under this table's lock in the same step that
    /// finds or makes the node, so a FORGET racing a lookup can never drop a node the lookup is
    /// about to hand out.
    pins: HashMap<u64, u64>,
}

/// The node table shared by every thread.
#[derive(Default)]
pub struct Nodes {
    table: Mutex<Table>,
}

impl Nodes {
    /// What `node` stands for; ESTALE-like None for an id the kernel should not hold.
    pub fn resolve(&self, node: Ino) -> Option<Target> {
        if node.0 & VIRTUAL == 0 {
            return Some(Target::Delta(node));
        }
        self.table.lock().nodes.get(&node.0).cloned()
    }

    /// The node id for delta inode `ino`.
    pub fn for_delta(&self, ino: Ino) -> Ino {
        match self.table.lock().by_delta.get(&ino) {
            Some(n) => Ino(*n),
            None => ino,
        }
    }

    /// [`Nodes::for_delta`] for an entry reply: a virtual node gains a reference.
    pub fn entry_for_delta(&self, ino: Ino) -> Ino {
        let mut t = self.table.lock();
        match t.by_delta.get(&ino).copied() {
            Some(n) => {
                *t.pins.entry(n).or_insert(0) += 1;
                Ino(n)
            }
            None => ino,
        }
    }

    pub fn generation(&self) -> u64 {
        self.table.lock().generation
    }

    /// The node id for the base object at `path` as of `fp`, for an entry reply (it gains a
    /// reference); None if a copy-up happened since generation `seen` (look again).
    pub fn for_base(&self, path: &[u8], fp: Option<Fingerprint>, seen: u64) -> Option<Ino> {
        let mut t = self.table.lock();
        let n = Self::base_node(&mut t, path, fp, seen)?;
        *t.pins.entry(n.0).or_insert(0) += 1;
        Some(n)
    }

    fn base_node(t: &mut Table, path: &[u8], fp: Option<Fingerprint>, seen: u64) -> Option<Ino> {
        if let Some(&x) = t.pending.get(path) {
            if let Some(&n) = t.by_delta.get(&x) {
                return Some(Ino(n));
            }
            t.next += 1;
            let n = VIRTUAL | t.next;
            t.nodes.insert(n, Target::Delta(x));
            t.by_delta.insert(x, n);
            return Some(Ino(n));
        }
        if t.generation != seen {
            return None;
        }
        if let Some(&n) = t.by_path.get(path) {
            match t.nodes.get(&n) {
                Some(Target::Base { fp: old, .. }) if *old == fp => return Some(Ino(n)),
                Some(Target::Delta(_)) => return Some(Ino(n)),
                _ => {}
            }
        }
        t.next += 1;
        let n = VIRTUAL | t.next;
        t.nodes.insert(
            n,
            Target::Base {
                path: path.to_vec(),
                fp,
                unlinked: false,
            },
        );
        t.by_path.insert(path.to_vec(), n);
        Some(Ino(n))
    }

    /// The base object at `path` is being copied up as `ino` (called inside the copy's
    /// transaction, so no reader of the store sees the copy before this): its node, if any,
    /// now names `ino`, and a lookup that still finds the base object gets a node for `ino`.
    pub fn publish(&self, path: &[u8], ino: Ino) {
        let mut t = self.table.lock();
        t.generation += 1;
        match t.by_path.get(path).copied() {
            Some(n) => {
                t.nodes.insert(n, Target::Delta(ino));
                t.by_delta.insert(ino, n);
            }
            None => {
                t.pending.insert(path.to_vec(), ino);
            }
        }
    }

    /// The copy of `path` as `ino` committed: lookups find it in the delta from now on.
    pub fn settle(&self, path: &[u8], ino: Ino) {
        let mut t = self.table.lock();
        t.generation += 1;
        t.pending.remove(path);
        if let Some(&n) = t.by_path.get(path) {
            if t.nodes.get(&n) == Some(&Target::Delta(ino)) {
                t.by_path.remove(path);
            }
        }
    }

    /// The copy of `path` as `ino` was rolled back: nodes that named it name the base object
    /// again (as version `fp`).
    pub fn revert(&self, path: &[u8], ino: Ino, fp: Option<Fingerprint>) {
        let mut t = self.table.lock();
        t.generation += 1;
        t.pending.remove(path);
        if let Some(n) = t.by_delta.remove(&ino) {
            t.nodes.insert(
                n,
                Target::Base {
                    path: path.to_vec(),
                    fp,
                    unlinked: false,
                },
            );
            t.by_path.insert(path.to_vec(), n);
        }
    }

    /// An unlinked base file behind `node` was copied into the orphan `ino`.
    pub fn orphan_copied(&self, node: Ino, ino: Ino) {
        let mut t = self.table.lock();
        t.nodes.insert(node.0, Target::Delta(ino));
        t.by_delta.insert(ino, node.0);
    }

    /// The name `path` was removed (or replaced): its base node, if any, is unlinked and no
    /// longer found by path.
    pub fn unlinked(&self, path: &[u8]) {
        let mut t = self.table.lock();
        t.generation += 1;
        if let Some(n) = t.by_path.remove(path) {
            if let Some(Target::Base { unlinked, .. }) = t.nodes.get_mut(&n) {
                *unlinked = true;
            }
        }
    }

    /// The kernel returned `n` references to virtual node `node` (or an entry reply carrying
    /// it was never sent). Returns what the node named when that was its last reference: the
    /// node is gone then.
    pub fn release(&self, node: Ino, n: u64) -> Option<Target> {
        let mut t = self.table.lock();
        let left = match t.pins.get_mut(&node.0) {
            Some(c) => {
                *c = c.saturating_sub(n);
                *c
            }
            None => 0,
        };
        if left > 0 {
            return None;
        }
        t.pins.remove(&node.0);
        let target = t.nodes.remove(&node.0);
        match &target {
            Some(Target::Base { path, .. }) if t.by_path.get(path) == Some(&node.0) => {
                t.by_path.remove(path);
            }
            Some(Target::Delta(ino)) if t.by_delta.get(ino) == Some(&node.0) => {
                t.by_delta.remove(ino);
            }
            _ => {}
        }
        target
    }

    /// Virtual nodes alive.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.lock().nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_keeps_its_id_across_copy_up() {
        let n = Nodes::default();
        let g = n.generation();
        let v = n.for_base(b"/a", None, g).unwrap();
        assert_eq!(n.for_base(b"/a", None, g), Some(v));
        n.publish(b"/a", Ino(9));
        assert_eq!(n.resolve(v), Some(Target::Delta(Ino(9))));
        assert_eq!(n.for_delta(Ino(9)), v);
        let g = n.generation();
        assert_eq!(n.for_base(b"/a", None, g), Some(v), "still the same node");
        n.settle(b"/a", Ino(9));
        assert_eq!(n.for_base(b"/a", None, g), None, "stale generation");
        assert_eq!(n.release(v, 2), None, "two of three references returned");
        assert_eq!(n.release(v, 1), Some(Target::Delta(Ino(9))));
        assert_eq!(n.for_delta(Ino(9)), Ino(9));
        assert_eq!(n.len(), 0);
    }

    #[test]
    fn a_lookup_racing_a_copy_up_gets_the_copy() {
        let n = Nodes::default();
        n.publish(b"/b", Ino(5));
        let g = n.generation();
        let v = n.for_base(b"/b", None, g).unwrap();
        assert_eq!(n.resolve(v), Some(Target::Delta(Ino(5))));
        assert_eq!(n.for_delta(Ino(5)), v);
        n.settle(b"/b", Ino(5));
        assert_eq!(n.for_delta(Ino(5)), v);
        n.revert(b"/b", Ino(5), None);
        assert!(matches!(n.resolve(v), Some(Target::Base { .. })));
    }

    #[test]
    fn a_changed_file_gets_a_new_id() {
        let n = Nodes::default();
        let g = n.generation();
        let fp = |size| Fingerprint {
            ino: 1,
            size,
            mtime: (0, 0),
            ctime: (0, 0),
        };
        let v1 = n.for_base(b"/f", Some(fp(1)), g).unwrap();
        let v2 = n.for_base(b"/f", Some(fp(2)), g).unwrap();
        assert_ne!(v1, v2);
        assert!(matches!(n.resolve(v1), Some(Target::Base { .. })));
    }
}
