//! The sticky failure of an open database: a commit that failed after the work it carried was
//! acknowledged (a namespace batch, a group commit of WRITE data) or an fdatasync of committed
//! work that failed. From then on every mutation of the store is refused with the errno, every
//! barrier reports it, and the unmount reports what was lost (SPEC.md "Durability", "A failed
//! commit"). Nothing clears it but closing the store.
//!
//! It also remembers the names changed by operations not yet known to be committed, so the
//! kernel can be told to forget them when their commit is lost.

use std::collections::HashSet;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;

use super::Ino;
use crate::errno::Errno;

/// Told when something new needs telling the kernel (a loss, or a name changed after one).
pub type Notify = Box<dyn Fn() + Send + Sync>;

/// What was lost, in numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Lost {
    errno: Option<Errno>,
    /// Acknowledged namespace and metadata operations rolled back with their batch.
    ops: u64,
    /// Acknowledged WRITE bytes dropped with their group commit, and of how many files.
    bytes: u64,
    files: u64,
    /// An fdatasync of committed work failed (it may be gone after a power cut).
    unsynced: bool,
}

#[derive(Default)]
struct State {
    lost: Lost,
    /// (directory, name) changed by operations since the last successful commit.
    names: HashSet<(Ino, Vec<u8>)>,
    /// A loss (or a name changed after it) the kernel has not been told about.
    untold: bool,
}

/// See the module documentation.
#[derive(Default)]
pub struct Failure {
    state: Mutex<State>,
    /// The sticky errno (0 while nothing was lost), readable without the lock: every WRITE
    /// checks it.
    sticky: AtomicI32,
    notify: OnceLock<Notify>,
}

impl Failure {
    /// Ok while nothing was lost; the sticky errno afterwards.
    pub fn check(&self) -> Result<(), Errno> {
        self.errno().map_or(Ok(()), Err)
    }

    /// The sticky errno, if any.
    pub fn errno(&self) -> Option<Errno> {
        match self.sticky.load(Ordering::Acquire) {
            0 => None,
            e => Some(Errno(e)),
        }
    }

    /// Install the hook told about losses (once; later calls are ignored).
    pub fn set_notify(&self, n: Notify) {
        let _ = self.notify.set(n);
    }

    fn record(&self, e: Errno, add: impl FnOnce(&mut Lost)) {
        let summary = {
            let mut st = self.state.lock();
            let first = *st.lost.errno.get_or_insert(e);
            self.sticky.store(first.0, Ordering::Release);
            add(&mut st.lost);
            st.untold = true;
            describe(&st.lost)
        };
        if let Some(s) = summary {
            tracing::error!("{s}");
        }
        if let Some(n) = self.notify.get() {
            n();
        }
    }

    /// A batch transaction of `ops` acknowledged operations was rolled back.
    pub fn lost_ops(&self, e: Errno, ops: u64) {
        self.record(e, |l| l.ops += ops);
    }

    /// A group commit of `bytes` acknowledged bytes of one file failed; they were dropped.
    pub fn lost_bytes(&self, e: Errno, bytes: u64) {
        self.record(e, |l| {
            l.bytes += bytes;
            l.files += 1;
        });
    }

    /// An fdatasync of committed transactions failed.
    pub fn lost_sync(&self, e: Errno) {
        self.record(e, |l| l.unsynced = true);
    }

    /// A transaction committed: the names changed before it are in the database.
    pub fn committed(&self) {
        let mut st = self.state.lock();
        if st.lost.errno.is_none() {
            st.names.clear();
        }
    }

    /// An operation changed `name` in `parent` (call after it, before it is answered).
    pub fn touched(&self, parent: Ino, name: &[u8]) {
        let late = {
            let mut st = self.state.lock();
            st.names.insert((parent, name.to_vec()));
            st.lost.errno.is_some() && !std::mem::replace(&mut st.untold, true)
        };
        // An operation of a lost batch that finished after the loss was reported.
        if late {
            if let Some(n) = self.notify.get() {
                n();
            }
        }
    }

    /// After a loss: the names the kernel must forget, once (None when there is nothing new).
    pub fn take_untold(&self) -> Option<Vec<(Ino, Vec<u8>)>> {
        let mut st = self.state.lock();
        if st.lost.errno.is_none() || !std::mem::replace(&mut st.untold, false) {
            return None;
        }
        Some(st.names.drain().collect())
    }

    /// One line saying what was lost, or None when nothing was.
    pub fn summary(&self) -> Option<String> {
        describe(&self.state.lock().lost)
    }
}

fn describe(l: &Lost) -> Option<String> {
    let e = l.errno?;
    let mut parts = Vec::new();
    if l.ops > 0 {
        parts.push(format!("{} acknowledged operations", l.ops));
    }
    if l.bytes > 0 {
        parts.push(format!(
            "{} acknowledged bytes written to {} files",
            l.bytes, l.files
        ));
    }
    let lost = if parts.is_empty() {
        String::new()
    } else {
        format!("; lost: {}", parts.join(" and "))
    };
    let unsynced = if l.unsynced {
        "; committed work may not be on disk"
    } else {
        ""
    };
    Some(format!(
        "a commit to the database failed ({e}){lost}{unsynced}; the database holds what was \
         committed before; every change is refused until unmount"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_is_sticky_and_tells_its_names_once() {
        let f = Failure::default();
        f.touched(Ino(1), b"a");
        f.committed();
        f.touched(Ino(1), b"b");
        assert_eq!(f.check(), Ok(()));
        assert_eq!(f.take_untold(), None, "nothing lost");
        f.lost_ops(Errno::EIO, 3);
        f.lost_ops(Errno::ENOSPC, 1);
        assert_eq!(f.check(), Err(Errno::EIO), "the first errno stays");
        assert_eq!(f.take_untold(), Some(vec![(Ino(1), b"b".to_vec())]));
        assert_eq!(f.take_untold(), None);
        f.committed();
        f.touched(Ino(2), b"late");
        assert_eq!(f.take_untold(), Some(vec![(Ino(2), b"late".to_vec())]));
        let s = f.summary().unwrap();
        assert!(s.contains("4 acknowledged operations"), "{s}");
        assert_eq!(f.check(), Err(Errno::EIO));
    }
}
