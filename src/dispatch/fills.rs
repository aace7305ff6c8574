//! Guard for the kernel's directory listing cache (FOPEN_CACHE_DIR, which the kernel gives every
//! directory opened without OPENDIR).
//!
//! The kernel stamps the cache (i_version, mtime) when a reader finds it empty at offset 0, and
//! appends whatever READDIR replies continue it, so a fill whose first reply was read before a
//! change can complete after another reader restamped the cache past that change; every later
//! listing then trusts the stale contents (kernel-notes/fuse-server-facts.md). The server sees
//! both ends of every fill: the request at offset 0 and the empty reply that ends it. A change
//! in a directory while one of its fills is open marks the directory; each fill that ends while
//! the mark stands makes the server evict the directory's pages (FUSE_NOTIFY_INVAL_INODE)
//! before the end reply, and a cache with a missing page is reset by the next reader.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::store::Ino;

/// Directories tracked at most; past it (fills abandoned before their end) the map starts over.
const CAP: usize = 65_536;

#[derive(Default)]
struct Dir {
    /// Fills begun (a request at offset 0) and not ended (an empty reply).
    open: u32,
    /// A change happened while a fill was open.
    changed: bool,
}

/// Open listing fills per directory.
#[derive(Default)]
pub struct Fills {
    dirs: Mutex<HashMap<Ino, Dir>>,
}

impl Fills {
    /// A listing of `dir` starts at offset 0; call before reading the directory.
    pub fn begin(&self, dir: Ino) {
        let mut dirs = self.dirs.lock();
        if dirs.len() >= CAP && !dirs.contains_key(&dir) {
            dirs.clear();
        }
        dirs.entry(dir).or_default().open += 1;
    }

    /// `dir`'s entries changed; call after the change is visible, before it is answered.
    pub fn changed(&self, dir: Ino) {
        if let Some(d) = self.dirs.lock().get_mut(&dir) {
            d.changed = true;
        }
    }

    /// A listing of `dir` reached its end (an empty reply). True when a change happened while
    /// a fill was open: the kernel's cache of `dir` may hold entries read before it.
    pub fn end(&self, dir: Ino) -> bool {
        let mut dirs = self.dirs.lock();
        let Some(d) = dirs.get_mut(&dir) else {
            return false;
        };
        d.open = d.open.saturating_sub(1);
        let stale = d.changed;
        if d.open == 0 {
            dirs.remove(&dir);
        }
        stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_during_a_fill_marks_every_fill_open_at_the_time() {
        let f = Fills::default();
        let d = Ino(5);
        f.changed(d);
        f.begin(d);
        assert!(
            !f.end(d),
            "a change before the fill began is in its replies"
        );
        f.begin(d);
        f.begin(d);
        f.changed(d);
        assert!(f.end(d), "the first fill open across the change");
        assert!(f.end(d), "and the second");
        assert!(!f.end(d), "nothing open, nothing stale");
        f.begin(d);
        f.changed(Ino(6));
        assert!(!f.end(d), "a change elsewhere");
    }
}
