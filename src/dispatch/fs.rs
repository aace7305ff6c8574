//! The filesystem layer the dispatcher serves: the plain store, or an overlay of a read-only
//! base directory under the store (see `crate::overlay`).
//!
//! Node ids: the kernel names an inode by the node id of the entry reply that introduced it.
//! In a plain mount the node id is the store's inode number. An overlay also hands out node
//! ids for base objects that have no inode in the store; [`Entry::node`] carries the node id
//! and `attr.ino` the st_ino shown to programs, which may differ.

use crate::errno::Errno;
use crate::store::{
    Attr, Caller, DirEntry, Ino, Liveness as _, RenameFlags, SetAttr, StatFs, Store,
};

use super::LookupRefs;

/// An entry reply: the node id the kernel keeps, and the attributes.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub node: Ino,
    pub attr: Attr,
}

impl Entry {
    /// A store inode that is its own node id.
    pub fn plain(attr: Attr) -> Entry {
        Entry {
            node: attr.ino,
            attr,
        }
    }
}

/// Every operation the dispatcher needs. `node` arguments are kernel node ids; the kernel
/// reference table is passed where an operation may drop an inode's last name or a reference.
pub trait Filesystem: Send + Sync {
    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Entry, Errno>;
    /// The entry a rename is about to replace, without creating any state (for the
    /// recent-victims bookkeeping).
    fn peek(&self, parent: Ino, name: &[u8]) -> Option<Entry>;
    fn getattr(&self, node: Ino) -> Result<Attr, Errno>;
    fn setattr(&self, node: Ino, set: &SetAttr) -> Result<Attr, Errno>;
    fn readlink(&self, node: Ino) -> Result<Vec<u8>, Errno>;
    fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> Result<Entry, Errno>;
    fn mkdir(&self, parent: Ino, name: &[u8], mode: u32, caller: Caller) -> Result<Entry, Errno>;
    /// An unnamed regular file (O_TMPFILE) with permission bits `perm`, nlink 0.
    fn tmpfile(&self, parent: Ino, perm: u32, caller: Caller) -> Result<Entry, Errno>;
    fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        caller: Caller,
    ) -> Result<Entry, Errno>;
    fn link(&self, node: Ino, newparent: Ino, newname: &[u8]) -> Result<Entry, Errno>;
    /// Returns the node when it keeps other names (for the recent-victims bookkeeping).
    fn unlink(&self, parent: Ino, name: &[u8], refs: &LookupRefs) -> Result<Option<Ino>, Errno>;
    fn rmdir(&self, parent: Ino, name: &[u8], refs: &LookupRefs) -> Result<(), Errno>;
    #[allow(clippy::too_many_arguments)]
    fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: RenameFlags,
        refs: &LookupRefs,
    ) -> Result<(), Errno>;
    /// The kernel returned `n` references to each `node` (one FORGET, or a BATCH_FORGET's
    /// list). The orphans it released are reaped together, in one transaction.
    fn forget(&self, nodes: &[(Ino, u64)], refs: &LookupRefs);
    /// Another process removed names (`agentfs fs rm` leaves the inodes as orphans): keep the
    /// orphans the kernel references until their last FORGET, reap the others now.
    fn adopt_orphans(&self, refs: &LookupRefs) -> Result<(), Errno>;
    /// An entry this layer produced for `node` was not sent to the kernel after all.
    fn unused(&self, _node: Ino) {}
    /// Whether names and attributes also come from a base directory, whose changes nobody
    /// notifies (the kernel's cache timeouts are then capped by `AGENTFS_FUSE_BASE_TTL_MS`).
    fn has_base(&self) -> bool {
        false
    }
    fn read(&self, node: Ino, offset: u64, size: u32) -> Result<Vec<u8>, Errno>;
    fn write(&self, node: Ino, offset: u64, data: &[u8]) -> Result<u32, Errno>;
    fn fallocate(&self, node: Ino, offset: u64, length: u64, mode: u32) -> Result<(), Errno>;
    fn lseek(&self, node: Ino, offset: u64, whence: u32) -> Result<u64, Errno>;
    fn copy_file_range(
        &self,
        node_in: Ino,
        off_in: u64,
        node_out: Ino,
        off_out: u64,
        len: u64,
    ) -> Result<u64, Errno>;
    fn fsync(&self, node: Ino) -> Result<(), Errno>;
    fn sync(&self) -> Result<(), Errno>;
    /// Up to `max` entries after cookie `offset`; `DirEntry::ino` is the st_ino to show.
    fn readdir(&self, node: Ino, offset: u64, max: usize) -> Result<Vec<DirEntry>, Errno>;
    /// readdir with an entry (node id and attributes) per name, "." and ".." included.
    fn readdirplus(
        &self,
        node: Ino,
        offset: u64,
        max: usize,
    ) -> Result<Vec<(DirEntry, Entry)>, Errno>;
    fn statfs(&self) -> Result<StatFs, Errno>;
    fn setxattr(&self, node: Ino, name: &[u8], value: &[u8], flags: u32) -> Result<(), Errno>;
    fn getxattr(&self, node: Ino, name: &[u8]) -> Result<Vec<u8>, Errno>;
    fn listxattr(&self, node: Ino) -> Result<Vec<u8>, Errno>;
    fn removexattr(&self, node: Ino, name: &[u8]) -> Result<(), Errno>;
    /// One path of `node` in the mount ("/a/b"); None when it has no name left.
    fn node_path(&self, node: Ino) -> Result<Option<Vec<u8>>, Errno>;
    /// The store underneath (INIT settings, shutdown).
    fn store(&self) -> &Store;
}

/// A plain mount: node ids are inode numbers and every call goes straight to the store.
impl Filesystem for Store {
    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Entry, Errno> {
        Store::lookup(self, parent, name).map(Entry::plain)
    }
    fn peek(&self, parent: Ino, name: &[u8]) -> Option<Entry> {
        Store::lookup(self, parent, name).ok().map(Entry::plain)
    }
    fn getattr(&self, node: Ino) -> Result<Attr, Errno> {
        Store::getattr(self, node)
    }
    fn setattr(&self, node: Ino, set: &SetAttr) -> Result<Attr, Errno> {
        Store::setattr(self, node, set)
    }
    fn readlink(&self, node: Ino) -> Result<Vec<u8>, Errno> {
        Store::readlink(self, node)
    }
    fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> Result<Entry, Errno> {
        Store::mknod(self, parent, name, mode, rdev, caller).map(Entry::plain)
    }
    fn mkdir(&self, parent: Ino, name: &[u8], mode: u32, caller: Caller) -> Result<Entry, Errno> {
        Store::mkdir(self, parent, name, mode, caller).map(Entry::plain)
    }
    fn tmpfile(&self, parent: Ino, perm: u32, caller: Caller) -> Result<Entry, Errno> {
        Store::tmpfile(self, parent, perm, caller).map(Entry::plain)
    }
    fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        caller: Caller,
    ) -> Result<Entry, Errno> {
        Store::symlink(self, parent, name, target, caller).map(Entry::plain)
    }
    fn link(&self, node: Ino, newparent: Ino, newname: &[u8]) -> Result<Entry, Errno> {
        Store::link(self, node, newparent, newname).map(Entry::plain)
    }
    fn unlink(&self, parent: Ino, name: &[u8], refs: &LookupRefs) -> Result<Option<Ino>, Errno> {
        Store::unlink(self, parent, name, refs)
    }
    fn rmdir(&self, parent: Ino, name: &[u8], refs: &LookupRefs) -> Result<(), Errno> {
        Store::rmdir(self, parent, name, refs)
    }
    fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: RenameFlags,
        refs: &LookupRefs,
    ) -> Result<(), Errno> {
        Store::rename(self, parent, name, newparent, newname, flags, refs)
    }
    fn forget(&self, nodes: &[(Ino, u64)], refs: &LookupRefs) {
        let released: Vec<Ino> = nodes
            .iter()
            .filter(|&&(node, n)| refs.forget(node, n).orphan_released)
            .map(|&(node, _)| node)
            .collect();
        if let Err(e) = Store::reap(self, &released) {
            tracing::error!("reaping {} orphan inodes failed: {e}", released.len());
        }
    }
    fn adopt_orphans(&self, refs: &LookupRefs) -> Result<(), Errno> {
        let mut unreferenced = Store::orphans(self)?;
        unreferenced.retain(|&ino| !refs.retain_orphan(ino));
        Store::reap(self, &unreferenced)
    }
    fn read(&self, node: Ino, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        Store::read(self, node, offset, size)
    }
    fn write(&self, node: Ino, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        Store::write(self, node, offset, data)
    }
    fn fallocate(&self, node: Ino, offset: u64, length: u64, mode: u32) -> Result<(), Errno> {
        Store::fallocate(self, node, offset, length, mode)
    }
    fn lseek(&self, node: Ino, offset: u64, whence: u32) -> Result<u64, Errno> {
        Store::lseek(self, node, offset, whence)
    }
    fn copy_file_range(
        &self,
        node_in: Ino,
        off_in: u64,
        node_out: Ino,
        off_out: u64,
        len: u64,
    ) -> Result<u64, Errno> {
        Store::copy_file_range(self, node_in, off_in, node_out, off_out, len)
    }
    fn fsync(&self, node: Ino) -> Result<(), Errno> {
        Store::fsync(self, node)
    }
    fn sync(&self) -> Result<(), Errno> {
        Store::sync(self)
    }
    fn readdir(&self, node: Ino, offset: u64, max: usize) -> Result<Vec<DirEntry>, Errno> {
        Store::readdir(self, node, offset, max)
    }
    fn readdirplus(
        &self,
        node: Ino,
        offset: u64,
        max: usize,
    ) -> Result<Vec<(DirEntry, Entry)>, Errno> {
        Ok(Store::readdirplus(self, node, offset, max)?
            .into_iter()
            .map(|(e, a)| (e, Entry::plain(a)))
            .collect())
    }
    fn statfs(&self) -> Result<StatFs, Errno> {
        Store::statfs(self)
    }
    fn setxattr(&self, node: Ino, name: &[u8], value: &[u8], flags: u32) -> Result<(), Errno> {
        Store::setxattr(self, node, name, value, flags)
    }
    fn getxattr(&self, node: Ino, name: &[u8]) -> Result<Vec<u8>, Errno> {
        Store::getxattr(self, node, name)
    }
    fn listxattr(&self, node: Ino) -> Result<Vec<u8>, Errno> {
        Store::listxattr(self, node)
    }
    fn removexattr(&self, node: Ino, name: &[u8]) -> Result<(), Errno> {
        Store::removexattr(self, node, name)
    }
    fn node_path(&self, node: Ino) -> Result<Option<Vec<u8>>, Errno> {
        match self.dir_path(node) {
            Ok(p) => Ok(Some(p)),
            Err(e) if e == Errno::ENOENT => Ok(None),
            Err(e) => Err(e),
        }
    }
    fn store(&self) -> &Store {
        self
    }
}
