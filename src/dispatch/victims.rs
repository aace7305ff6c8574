//! Inodes that just lost one of several names, and how replies about them avoid a kernel race.
//!
//! After an UNLINK, or a RENAME over an existing name, succeeds the kernel lowers its cached
//! `i_nlink` of the victim by one itself (`fuse_entry_unlinked`). With the writeback cache the
//! rename path first sends a SETATTR (ctime flush), and any LOOKUP, GETATTR or READDIRPLUS
//! reply for the victim that lands meanwhile already carries the new, lower count — the kernel
//! then lowers it twice and a file that still has a name shows `nlink 0` (and `link()` on it
//! fails with ENOENT). See kernel-notes/fuse-server-facts.md.
//!
//! For a short while after such an operation the dispatcher therefore sends READDIRPLUS
//! records for the victim with node id 0 (the kernel skips them; the name is still listed) and
//! answers LOOKUP/GETATTR for it with an attribute timeout of 0, so a doubly lowered count is
//! re-read at the next stat instead of being cached.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::store::Ino;

/// How long an inode counts as a recent victim: far longer than a FUSE round trip.
const WINDOW: Duration = Duration::from_secs(2);

/// Bound on remembered victims; older entries are pruned first.
const CAP: usize = 4096;

#[derive(Default)]
pub struct RecentVictims {
    /// Inode → when it lost a name while keeping others.
    at: Mutex<HashMap<Ino, Instant>>,
}

impl RecentVictims {
    /// Remember that `ino` just lost a name but keeps at least one other.
    pub fn record(&self, ino: Ino) {
        let now = Instant::now();
        let mut at = self.at.lock();
        if at.len() >= CAP {
            at.retain(|_, t| now.duration_since(*t) < WINDOW);
        }
        at.insert(ino, now);
    }

    /// Whether replies about `ino` must not let the kernel cache its attributes.
    pub fn is_recent(&self, ino: Ino) -> bool {
        let mut at = self.at.lock();
        match at.get(&ino) {
            Some(t) if t.elapsed() < WINDOW => true,
            Some(_) => {
                at.remove(&ino);
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn victims_are_recent_only_after_recording() {
        let v = RecentVictims::default();
        assert!(!v.is_recent(Ino(5)));
        v.record(Ino(5));
        assert!(v.is_recent(Ino(5)));
        assert!(!v.is_recent(Ino(6)));
    }
}
