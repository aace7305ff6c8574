//! Kernel lookup references, counted per inode.
//!
//! The kernel holds one reference per positive LOOKUP, CREATE, MKNOD, MKDIR, SYMLINK and LINK
//! reply and per entry of a READDIRPLUS reply (other than "." and ".."); FORGET and BATCH_FORGET
//! return them. An inode that lost its last name while referenced (an unlinked but open file,
//! a removed working directory) is an orphan: its rows stay until its count reaches zero.
//!
//! Lock order: the store's writer lock may be held while `counts` is taken (through
//! [`Liveness::retain_orphan`]); never call into the store while holding `counts`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::store::{Ino, Liveness};

#[derive(Default)]
struct Table {
    /// Outstanding kernel references per inode; absent means zero.
    counts: HashMap<Ino, u64>,
    /// Inodes with nlink = 0 kept alive by references; reaped at their last FORGET.
    orphans: HashSet<Ino>,
}

/// What a FORGET ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Forgotten {
    /// The kernel holds no reference any more.
    pub last: bool,
    /// ... and the inode is an orphan: the caller must reap it.
    pub orphan_released: bool,
}

/// The reference table shared by every transport thread (a clone is another handle on it).
#[derive(Clone, Default)]
pub struct LookupRefs {
    table: Arc<Mutex<Table>>,
}

impl LookupRefs {
    /// Record `n` new kernel references to `ino`.
    pub fn add(&self, ino: Ino, n: u64) {
        if ino == Ino::ROOT {
            return;
        }
        *self.table.lock().counts.entry(ino).or_insert(0) += n;
    }

    /// Drop `n` references and say what that ended.
    pub fn forget(&self, ino: Ino, n: u64) -> Forgotten {
        let mut t = self.table.lock();
        let left = match t.counts.get_mut(&ino) {
            Some(c) => {
                *c = c.saturating_sub(n);
                *c
            }
            None => 0,
        };
        if left > 0 {
            return Forgotten::default();
        }
        t.counts.remove(&ino);
        Forgotten {
            last: true,
            orphan_released: t.orphans.remove(&ino),
        }
    }

    /// References currently held by the kernel on `ino`.
    pub fn count(&self, ino: Ino) -> u64 {
        self.table.lock().counts.get(&ino).copied().unwrap_or(0)
    }

    /// Every inode the kernel holds a reference to (the root excepted: it is never counted).
    pub fn referenced(&self) -> Vec<Ino> {
        self.table.lock().counts.keys().copied().collect()
    }

    /// Orphans still waiting for their last FORGET.
    pub fn orphan_count(&self) -> usize {
        self.table.lock().orphans.len()
    }
}

impl Liveness for LookupRefs {
    fn retain_orphan(&self, ino: Ino) -> bool {
        let mut t = self.table.lock();
        if t.counts.get(&ino).copied().unwrap_or(0) > 0 {
            t.orphans.insert(ino);
            true
        } else {
            false
        }
    }

    fn shared(&self) -> Option<Arc<dyn Liveness + Send>> {
        Some(Arc::new(self.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphan_is_reaped_at_last_forget_only() {
        let r = LookupRefs::default();
        let ino = Ino(7);
        r.add(ino, 2);
        assert!(r.retain_orphan(ino));
        assert_eq!(r.forget(ino, 1), Forgotten::default());
        assert!(r.forget(ino, 1).orphan_released);
        assert_eq!(r.orphan_count(), 0);
        assert!(
            !r.retain_orphan(ino),
            "unreferenced inodes are deleted at once"
        );
    }

    #[test]
    fn root_is_never_counted() {
        let r = LookupRefs::default();
        r.add(Ino::ROOT, 5);
        assert_eq!(r.count(Ino::ROOT), 0);
    }
}
