//! Operating-system plumbing: mounting and unmounting FUSE filesystems, the mount table, locks,
//! starting a file's writeback, the SQLite VFS that gathers WAL writes.
//! With `transport/`, this is the only home of `unsafe`.

pub mod beneath;
pub mod cgroup;
pub mod ids;
pub mod lock;
pub mod memory;
pub mod mount;
pub mod mounts;
pub mod ns;
pub mod priority;
pub mod registry;
pub mod signals;
pub mod space;
pub mod stdio;
pub mod walvfs;
pub mod writeback;
