//! Conversions from store attributes to the kernel's structures.

use std::time::Duration;

use super::Entry;
use crate::abi;
use crate::store::{Attr, Caller, StatFs};

/// st_blksize we report: the preferred I/O size.
const BLKSIZE: u32 = 4096;

/// `a` as the kernel is told it; `owner` (see [`crate::dispatch::Dispatcher::set_owner`])
/// replaces every inode's uid and gid.
pub fn fuse_attr(a: &Attr, owner: Option<Caller>) -> abi::Attr {
    let (uid, gid) = owner.map_or((a.uid, a.gid), |o| (o.uid, o.gid));
    abi::Attr {
        ino: a.ino.0,
        size: a.size,
        blocks: a.blocks,
        atime: a.atime.sec as u64,
        mtime: a.mtime.sec as u64,
        ctime: a.ctime.sec as u64,
        atimensec: a.atime.nsec,
        mtimensec: a.mtime.nsec,
        ctimensec: a.ctime.nsec,
        mode: a.mode,
        nlink: a.nlink,
        uid,
        gid,
        rdev: a.rdev,
        blksize: BLKSIZE,
        flags: 0,
    }
}

pub fn entry_out(
    e: &Entry,
    entry_ttl: Duration,
    attr_ttl: Duration,
    owner: Option<Caller>,
) -> abi::EntryOut {
    abi::EntryOut {
        nodeid: e.node.0,
        generation: 0,
        entry_valid: entry_ttl.as_secs(),
        attr_valid: attr_ttl.as_secs(),
        entry_valid_nsec: entry_ttl.subsec_nanos(),
        attr_valid_nsec: attr_ttl.subsec_nanos(),
        attr: fuse_attr(&e.attr, owner),
    }
}

/// A READDIRPLUS record the kernel lists but does not link (node id 0, no reference): "." and
/// "..", and recent victims (see `victims`).
pub fn unlinked_entry(a: &Attr, owner: Option<Caller>) -> abi::EntryOut {
    abi::EntryOut {
        nodeid: 0,
        attr: fuse_attr(a, owner),
        ..Default::default()
    }
}

/// A cacheable "no such entry" answer.
pub fn negative_entry(ttl: Duration) -> abi::EntryOut {
    abi::EntryOut {
        nodeid: 0,
        entry_valid: ttl.as_secs(),
        entry_valid_nsec: ttl.subsec_nanos(),
        ..Default::default()
    }
}

pub fn attr_out(a: &Attr, ttl: Duration, owner: Option<Caller>) -> abi::AttrOut {
    abi::AttrOut {
        attr_valid: ttl.as_secs(),
        attr_valid_nsec: ttl.subsec_nanos(),
        dummy: 0,
        attr: fuse_attr(a, owner),
    }
}

pub fn kstatfs(s: &StatFs) -> abi::Kstatfs {
    abi::Kstatfs {
        blocks: s.blocks,
        bfree: s.bfree,
        bavail: s.bavail,
        files: s.files,
        ffree: s.ffree,
        bsize: s.bsize,
        namelen: s.namelen,
        frsize: s.frsize,
        ..Default::default()
    }
}

/// The DT_* type of a directory entry from its S_IFMT bits.
pub fn dirent_type(kind: u32) -> u32 {
    (kind & libc::S_IFMT) >> 12
}
