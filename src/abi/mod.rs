//! The FUSE kernel ABI, protocol 7.45 (Linux 6.18), transcribed from the uapi header
//! `include/uapi/linux/fuse.h` (dual GPL-2.0-with-syscall-note / BSD-2-Clause).
//!
//! Only what this server speaks is here: plain `#[repr(C)]` structs with `zerocopy` derives (so
//! reading and writing them needs no `unsafe`), a compile-time size assertion for every struct,
//! the opcode and notify-code numbers, and the flag bits with their real values.
//!
//! Byte order is native: the kernel and the server share a machine.
//!
//! Layout of a request on the wire: [`InHeader`] (40 B), then `in_args[0]` (the per-opcode
//! struct, e.g. [`GetattrIn`]; zero bytes for name-only opcodes since Linux 6.14), then the rest
//! (names with their NUL, write data, ...), then request extensions (`total_extlen` × 8 bytes).
//! A reply is [`OutHeader`] (16 B) followed by the reply body.

use core::mem::size_of;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Major protocol version we speak.
pub const FUSE_KERNEL_VERSION: u32 = 7;
/// Highest minor protocol version we know.
pub const FUSE_KERNEL_MINOR_VERSION: u32 = 45;
/// Lowest minor version we accept: every struct size below assumes >= 7.31.
pub const FUSE_MIN_MINOR_VERSION: u32 = 31;
/// The node id of the root inode.
pub const FUSE_ROOT_ID: u64 = 1;
/// The kernel's minimum size for a /dev/fuse read buffer.
pub const FUSE_MIN_READ_BUFFER: usize = 8192;

// ------------------------------------------------------------------------------------------
// Newtypes
// ------------------------------------------------------------------------------------------

/// The request id the kernel assigns (`fuse_in_header.unique`); a reply echoes it. Zero is
/// reserved for notifications (server → kernel messages nobody asked for).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Unique(pub u64);

impl Unique {
    /// Bit 63 marks a request the kernel re-sent (after `FUSE_NOTIFY_RESEND`).
    pub fn is_resend(self) -> bool {
        self.0 & FUSE_UNIQUE_RESEND != 0
    }
}

/// A node id as the kernel knows it (`fuse_in_header.nodeid`, `fuse_entry_out.nodeid`).
///
/// Lifecycle: every successful LOOKUP / MKNOD / MKDIR / SYMLINK / LINK / CREATE reply (and every
/// READDIRPLUS entry with a non-zero nodeid) adds one to the kernel's lookup count for that node;
/// FORGET / BATCH_FORGET subtract `nlookup`. The server may drop the node only when the count is
/// zero. [`FUSE_ROOT_ID`] is never forgotten.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u64);

impl NodeId {
    pub const ROOT: NodeId = NodeId(FUSE_ROOT_ID);
}

impl From<u64> for Unique {
    fn from(v: u64) -> Self {
        Unique(v)
    }
}

impl From<u64> for NodeId {
    fn from(v: u64) -> Self {
        NodeId(v)
    }
}

// ------------------------------------------------------------------------------------------
// Opcodes
// ------------------------------------------------------------------------------------------

/// `enum fuse_opcode`. Every number the 7.45 kernel knows, so that even opcodes we answer with
/// ENOSYS can be named in logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Opcode {
    Lookup = 1,
    Forget = 2,
    Getattr = 3,
    Setattr = 4,
    Readlink = 5,
    Symlink = 6,
    Mknod = 8,
    Mkdir = 9,
    Unlink = 10,
    Rmdir = 11,
    Rename = 12,
    Link = 13,
    Open = 14,
    Read = 15,
    Write = 16,
    Statfs = 17,
    Release = 18,
    Fsync = 20,
    Setxattr = 21,
    Getxattr = 22,
    Listxattr = 23,
    Removexattr = 24,
    Flush = 25,
    Init = 26,
    Opendir = 27,
    Readdir = 28,
    Releasedir = 29,
    Fsyncdir = 30,
    Getlk = 31,
    Setlk = 32,
    Setlkw = 33,
    Access = 34,
    Create = 35,
    Interrupt = 36,
    Bmap = 37,
    Destroy = 38,
    Ioctl = 39,
    Poll = 40,
    NotifyReply = 41,
    BatchForget = 42,
    Fallocate = 43,
    Readdirplus = 44,
    Rename2 = 45,
    Lseek = 46,
    CopyFileRange = 47,
    Setupmapping = 48,
    Removemapping = 49,
    Syncfs = 50,
    Tmpfile = 51,
    Statx = 52,
    CopyFileRange64 = 53,
    CuseInit = 4096,
}

impl Opcode {
    /// Every opcode, for tables and tests.
    pub const ALL: [Opcode; 52] = [
        Opcode::Lookup,
        Opcode::Forget,
        Opcode::Getattr,
        Opcode::Setattr,
        Opcode::Readlink,
        Opcode::Symlink,
        Opcode::Mknod,
        Opcode::Mkdir,
        Opcode::Unlink,
        Opcode::Rmdir,
        Opcode::Rename,
        Opcode::Link,
        Opcode::Open,
        Opcode::Read,
        Opcode::Write,
        Opcode::Statfs,
        Opcode::Release,
        Opcode::Fsync,
        Opcode::Setxattr,
        Opcode::Getxattr,
        Opcode::Listxattr,
        Opcode::Removexattr,
        Opcode::Flush,
        Opcode::Init,
        Opcode::Opendir,
        Opcode::Readdir,
        Opcode::Releasedir,
        Opcode::Fsyncdir,
        Opcode::Getlk,
        Opcode::Setlk,
        Opcode::Setlkw,
        Opcode::Access,
        Opcode::Create,
        Opcode::Interrupt,
        Opcode::Bmap,
        Opcode::Destroy,
        Opcode::Ioctl,
        Opcode::Poll,
        Opcode::NotifyReply,
        Opcode::BatchForget,
        Opcode::Fallocate,
        Opcode::Readdirplus,
        Opcode::Rename2,
        Opcode::Lseek,
        Opcode::CopyFileRange,
        Opcode::Setupmapping,
        Opcode::Removemapping,
        Opcode::Syncfs,
        Opcode::Tmpfile,
        Opcode::Statx,
        Opcode::CopyFileRange64,
        Opcode::CuseInit,
    ];

    /// The opcode with this number, if the 7.45 kernel defines one.
    pub fn from_u32(n: u32) -> Option<Opcode> {
        if n == Opcode::CuseInit as u32 {
            return Some(Opcode::CuseInit);
        }
        BY_NUMBER.get(usize::try_from(n).ok()?).copied().flatten()
    }

    /// The kernel's name, e.g. `"FUSE_LOOKUP"`.
    pub fn name(self) -> &'static str {
        match self {
            Opcode::Lookup => "FUSE_LOOKUP",
            Opcode::Forget => "FUSE_FORGET",
            Opcode::Getattr => "FUSE_GETATTR",
            Opcode::Setattr => "FUSE_SETATTR",
            Opcode::Readlink => "FUSE_READLINK",
            Opcode::Symlink => "FUSE_SYMLINK",
            Opcode::Mknod => "FUSE_MKNOD",
            Opcode::Mkdir => "FUSE_MKDIR",
            Opcode::Unlink => "FUSE_UNLINK",
            Opcode::Rmdir => "FUSE_RMDIR",
            Opcode::Rename => "FUSE_RENAME",
            Opcode::Link => "FUSE_LINK",
            Opcode::Open => "FUSE_OPEN",
            Opcode::Read => "FUSE_READ",
            Opcode::Write => "FUSE_WRITE",
            Opcode::Statfs => "FUSE_STATFS",
            Opcode::Release => "FUSE_RELEASE",
            Opcode::Fsync => "FUSE_FSYNC",
            Opcode::Setxattr => "FUSE_SETXATTR",
            Opcode::Getxattr => "FUSE_GETXATTR",
            Opcode::Listxattr => "FUSE_LISTXATTR",
            Opcode::Removexattr => "FUSE_REMOVEXATTR",
            Opcode::Flush => "FUSE_FLUSH",
            Opcode::Init => "FUSE_INIT",
            Opcode::Opendir => "FUSE_OPENDIR",
            Opcode::Readdir => "FUSE_READDIR",
            Opcode::Releasedir => "FUSE_RELEASEDIR",
            Opcode::Fsyncdir => "FUSE_FSYNCDIR",
            Opcode::Getlk => "FUSE_GETLK",
            Opcode::Setlk => "FUSE_SETLK",
            Opcode::Setlkw => "FUSE_SETLKW",
            Opcode::Access => "FUSE_ACCESS",
            Opcode::Create => "FUSE_CREATE",
            Opcode::Interrupt => "FUSE_INTERRUPT",
            Opcode::Bmap => "FUSE_BMAP",
            Opcode::Destroy => "FUSE_DESTROY",
            Opcode::Ioctl => "FUSE_IOCTL",
            Opcode::Poll => "FUSE_POLL",
            Opcode::NotifyReply => "FUSE_NOTIFY_REPLY",
            Opcode::BatchForget => "FUSE_BATCH_FORGET",
            Opcode::Fallocate => "FUSE_FALLOCATE",
            Opcode::Readdirplus => "FUSE_READDIRPLUS",
            Opcode::Rename2 => "FUSE_RENAME2",
            Opcode::Lseek => "FUSE_LSEEK",
            Opcode::CopyFileRange => "FUSE_COPY_FILE_RANGE",
            Opcode::Setupmapping => "FUSE_SETUPMAPPING",
            Opcode::Removemapping => "FUSE_REMOVEMAPPING",
            Opcode::Syncfs => "FUSE_SYNCFS",
            Opcode::Tmpfile => "FUSE_TMPFILE",
            Opcode::Statx => "FUSE_STATX",
            Opcode::CopyFileRange64 => "FUSE_COPY_FILE_RANGE_64",
            Opcode::CuseInit => "CUSE_INIT",
        }
    }

    /// False for the opcodes the kernel never waits an answer for: FORGET, BATCH_FORGET and
    /// INTERRUPT (an INTERRUPT may be answered with EAGAIN/ENOSYS, but need not be).
    pub fn expects_reply(self) -> bool {
        !matches!(
            self,
            Opcode::Forget | Opcode::BatchForget | Opcode::Interrupt
        )
    }
}

/// FUSE opcodes by number (all below 54 except CUSE_INIT), built from [`Opcode::ALL`].
const BY_NUMBER: [Option<Opcode>; 54] = {
    let mut table = [None; 54];
    let mut i = 0;
    while i < Opcode::ALL.len() {
        let op = Opcode::ALL[i];
        if (op as usize) < table.len() {
            table[op as usize] = Some(op);
        }
        i += 1;
    }
    table
};

/// Name of a raw opcode number for logs; `"UNKNOWN"` if the kernel defines none.
pub fn opcode_name(n: u32) -> &'static str {
    Opcode::from_u32(n).map_or("UNKNOWN", Opcode::name)
}

/// Byte-swapped INIT: a kernel of the other endianness (never answered).
pub const FUSE_INIT_BSWAP_RESERVED: u32 = 436_207_616;
pub const CUSE_INIT_BSWAP_RESERVED: u32 = 1_048_576;

// ------------------------------------------------------------------------------------------
// Notification codes (server → kernel, sent with unique 0 and error = code)
// ------------------------------------------------------------------------------------------

pub const FUSE_NOTIFY_POLL: i32 = 1;
pub const FUSE_NOTIFY_INVAL_INODE: i32 = 2;
pub const FUSE_NOTIFY_INVAL_ENTRY: i32 = 3;
pub const FUSE_NOTIFY_STORE: i32 = 4;
pub const FUSE_NOTIFY_RETRIEVE: i32 = 5;
pub const FUSE_NOTIFY_DELETE: i32 = 6;
pub const FUSE_NOTIFY_RESEND: i32 = 7;
pub const FUSE_NOTIFY_INC_EPOCH: i32 = 8;
pub const FUSE_NOTIFY_PRUNE: i32 = 9;

// ------------------------------------------------------------------------------------------
// Flag bits
// ------------------------------------------------------------------------------------------

/// `fuse_setattr_in.valid` bits.
pub const FATTR_MODE: u32 = 1 << 0;
pub const FATTR_UID: u32 = 1 << 1;
pub const FATTR_GID: u32 = 1 << 2;
pub const FATTR_SIZE: u32 = 1 << 3;
pub const FATTR_ATIME: u32 = 1 << 4;
pub const FATTR_MTIME: u32 = 1 << 5;
pub const FATTR_FH: u32 = 1 << 6;
pub const FATTR_ATIME_NOW: u32 = 1 << 7;
pub const FATTR_MTIME_NOW: u32 = 1 << 8;
pub const FATTR_LOCKOWNER: u32 = 1 << 9;
pub const FATTR_CTIME: u32 = 1 << 10;
pub const FATTR_KILL_SUIDGID: u32 = 1 << 11;

/// `fuse_open_out.open_flags` bits.
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
pub const FOPEN_NONSEEKABLE: u32 = 1 << 2;
pub const FOPEN_CACHE_DIR: u32 = 1 << 3;
pub const FOPEN_STREAM: u32 = 1 << 4;
pub const FOPEN_NOFLUSH: u32 = 1 << 5;
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
pub const FOPEN_PASSTHROUGH: u32 = 1 << 7;

/// INIT flags, as one u64: bits 0..31 travel in `flags`, bits 32..63 in `flags2`
/// (only when [`FUSE_INIT_EXT`] is set in `flags`).
pub const FUSE_ASYNC_READ: u64 = 1 << 0;
pub const FUSE_POSIX_LOCKS: u64 = 1 << 1;
pub const FUSE_FILE_OPS: u64 = 1 << 2;
pub const FUSE_ATOMIC_O_TRUNC: u64 = 1 << 3;
pub const FUSE_EXPORT_SUPPORT: u64 = 1 << 4;
pub const FUSE_BIG_WRITES: u64 = 1 << 5;
pub const FUSE_DONT_MASK: u64 = 1 << 6;
pub const FUSE_SPLICE_WRITE: u64 = 1 << 7;
pub const FUSE_SPLICE_MOVE: u64 = 1 << 8;
pub const FUSE_SPLICE_READ: u64 = 1 << 9;
pub const FUSE_FLOCK_LOCKS: u64 = 1 << 10;
pub const FUSE_HAS_IOCTL_DIR: u64 = 1 << 11;
pub const FUSE_AUTO_INVAL_DATA: u64 = 1 << 12;
pub const FUSE_DO_READDIRPLUS: u64 = 1 << 13;
pub const FUSE_READDIRPLUS_AUTO: u64 = 1 << 14;
pub const FUSE_ASYNC_DIO: u64 = 1 << 15;
pub const FUSE_WRITEBACK_CACHE: u64 = 1 << 16;
pub const FUSE_NO_OPEN_SUPPORT: u64 = 1 << 17;
pub const FUSE_PARALLEL_DIROPS: u64 = 1 << 18;
pub const FUSE_HANDLE_KILLPRIV: u64 = 1 << 19;
pub const FUSE_POSIX_ACL: u64 = 1 << 20;
pub const FUSE_ABORT_ERROR: u64 = 1 << 21;
pub const FUSE_MAX_PAGES: u64 = 1 << 22;
pub const FUSE_CACHE_SYMLINKS: u64 = 1 << 23;
pub const FUSE_NO_OPENDIR_SUPPORT: u64 = 1 << 24;
pub const FUSE_EXPLICIT_INVAL_DATA: u64 = 1 << 25;
pub const FUSE_MAP_ALIGNMENT: u64 = 1 << 26;
pub const FUSE_SUBMOUNTS: u64 = 1 << 27;
pub const FUSE_HANDLE_KILLPRIV_V2: u64 = 1 << 28;
pub const FUSE_SETXATTR_EXT: u64 = 1 << 29;
pub const FUSE_INIT_EXT: u64 = 1 << 30;
pub const FUSE_INIT_RESERVED: u64 = 1 << 31;
pub const FUSE_SECURITY_CTX: u64 = 1 << 32;
pub const FUSE_HAS_INODE_DAX: u64 = 1 << 33;
pub const FUSE_CREATE_SUPP_GROUP: u64 = 1 << 34;
pub const FUSE_HAS_EXPIRE_ONLY: u64 = 1 << 35;
pub const FUSE_DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
pub const FUSE_PASSTHROUGH: u64 = 1 << 37;
pub const FUSE_NO_EXPORT_SUPPORT: u64 = 1 << 38;
pub const FUSE_HAS_RESEND: u64 = 1 << 39;
pub const FUSE_ALLOW_IDMAP: u64 = 1 << 40;
pub const FUSE_OVER_IO_URING: u64 = 1 << 41;
pub const FUSE_REQUEST_TIMEOUT: u64 = 1 << 42;

/// `fuse_release_in.release_flags`.
pub const FUSE_RELEASE_FLUSH: u32 = 1 << 0;
pub const FUSE_RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;

/// `fuse_getattr_in.getattr_flags`: `fh` is valid.
pub const FUSE_GETATTR_FH: u32 = 1 << 0;

/// `fuse_lk_in.lk_flags`.
pub const FUSE_LK_FLOCK: u32 = 1 << 0;

/// `fuse_write_in.write_flags`.
pub const FUSE_WRITE_CACHE: u32 = 1 << 0;
pub const FUSE_WRITE_LOCKOWNER: u32 = 1 << 1;
pub const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;

/// `fuse_read_in.read_flags`.
pub const FUSE_READ_LOCKOWNER: u32 = 1 << 1;

/// `fuse_fsync_in.fsync_flags`.
pub const FUSE_FSYNC_FDATASYNC: u32 = 1 << 0;

/// `fuse_attr.flags`.
pub const FUSE_ATTR_SUBMOUNT: u32 = 1 << 0;
pub const FUSE_ATTR_DAX: u32 = 1 << 1;

/// `fuse_open_in.open_flags` / `fuse_create_in.open_flags` (with HANDLE_KILLPRIV_V2).
pub const FUSE_OPEN_KILL_SUIDGID: u32 = 1 << 0;

/// `fuse_setxattr_in.setxattr_flags` (extended form only).
pub const FUSE_SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;

/// `fuse_notify_inval_entry_out.flags`: only expire the dentry, do not drop it.
pub const FUSE_EXPIRE_ONLY: u32 = 1 << 0;

/// Bit 63 of `unique`: the kernel re-sent this request.
pub const FUSE_UNIQUE_RESEND: u64 = 1 << 63;

/// uid/gid in the in-header when an idmapped mount cannot map the caller.
pub const FUSE_INVALID_UIDGID: u32 = u32::MAX;

/// `renameat2(2)` flags carried by RENAME2.
pub const RENAME_NOREPLACE: u32 = 1 << 0;
pub const RENAME_EXCHANGE: u32 = 1 << 1;
pub const RENAME_WHITEOUT: u32 = 1 << 2;

/// Request extension types (`fuse_ext_header.type`).
pub const FUSE_MAX_NR_SECCTX: u32 = 31;
pub const FUSE_EXT_GROUPS: u32 = 32;

// ------------------------------------------------------------------------------------------
// Common structs
// ------------------------------------------------------------------------------------------

/// `struct fuse_attr`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

/// `struct fuse_sx_time` (statx timestamp).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SxTime {
    pub tv_sec: i64,
    pub tv_nsec: u32,
    pub reserved: i32,
}

/// `struct fuse_statx` (bit-compatible with `struct statx`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Statx {
    pub mask: u32,
    pub blksize: u32,
    pub attributes: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub mode: u16,
    pub spare0: [u16; 1],
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub attributes_mask: u64,
    pub atime: SxTime,
    pub btime: SxTime,
    pub ctime: SxTime,
    pub mtime: SxTime,
    pub rdev_major: u32,
    pub rdev_minor: u32,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub spare2: [u64; 14],
}

/// `struct fuse_kstatfs` (the whole body of a STATFS reply, `fuse_statfs_out`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Kstatfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    pub padding: u32,
    pub spare: [u32; 6],
}

/// `struct fuse_statfs_out`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct StatfsOut {
    pub st: Kstatfs,
}

/// `struct fuse_file_lock`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FileLock {
    pub start: u64,
    pub end: u64,
    pub typ: u32,
    pub pid: u32,
}

// ------------------------------------------------------------------------------------------
// Headers
// ------------------------------------------------------------------------------------------

/// `struct fuse_in_header`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct InHeader {
    /// Total length of the request, this header included.
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// Length of the request extensions at the end, in 8-byte units.
    pub total_extlen: u16,
    pub padding: u16,
}

/// `struct fuse_out_header`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct OutHeader {
    /// Total length of the reply, this header included.
    pub len: u32,
    /// 0 or a negative errno; for notifications (unique 0) the positive notify code.
    pub error: i32,
    pub unique: u64,
}

// ------------------------------------------------------------------------------------------
// Request argument structs (in_args[0]) and reply bodies
// ------------------------------------------------------------------------------------------

/// `struct fuse_entry_out`: reply to LOOKUP, MKNOD, MKDIR, SYMLINK, LINK (and first half of
/// CREATE's reply).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct EntryOut {
    pub nodeid: u64,
    /// nodeid:generation must be unique for the filesystem's lifetime.
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: Attr,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ForgetIn {
    pub nlookup: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ForgetOne {
    pub nodeid: u64,
    pub nlookup: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct BatchForgetIn {
    pub count: u32,
    pub dummy: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct GetattrIn {
    pub getattr_flags: u32,
    pub dummy: u32,
    pub fh: u64,
}

/// `struct fuse_attr_out`: reply to GETATTR and SETATTR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct AttrOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub dummy: u32,
    pub attr: Attr,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct StatxIn {
    pub getattr_flags: u32,
    pub reserved: u32,
    pub fh: u64,
    pub sx_flags: u32,
    pub sx_mask: u32,
}

/// `struct fuse_statx_out`: reply to STATX.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct StatxOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub flags: u32,
    pub spare: [u64; 2],
    pub stat: Statx,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct MknodIn {
    pub mode: u32,
    pub rdev: u32,
    pub umask: u32,
    pub padding: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct MkdirIn {
    pub mode: u32,
    pub umask: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct RenameIn {
    pub newdir: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Rename2In {
    pub newdir: u64,
    pub flags: u32,
    pub padding: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct LinkIn {
    pub oldnodeid: u64,
}

/// `struct fuse_setattr_in`. Fields are meaningful only when their `FATTR_*` bit is in `valid`;
/// the accessor methods below apply that rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SetattrIn {
    pub valid: u32,
    pub padding: u32,
    pub fh: u64,
    pub size: u64,
    pub lock_owner: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub unused4: u32,
    pub uid: u32,
    pub gid: u32,
    pub unused5: u32,
}

/// A timestamp a SETATTR asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    /// `FATTR_*TIME_NOW`: the server's current time.
    Now,
    /// An explicit time (seconds may be negative: before 1970).
    At { sec: i64, nsec: u32 },
}

impl SetattrIn {
    fn has(&self, bit: u32) -> bool {
        self.valid & bit != 0
    }
    pub fn mode(&self) -> Option<u32> {
        self.has(FATTR_MODE).then_some(self.mode)
    }
    pub fn uid(&self) -> Option<u32> {
        self.has(FATTR_UID).then_some(self.uid)
    }
    pub fn gid(&self) -> Option<u32> {
        self.has(FATTR_GID).then_some(self.gid)
    }
    pub fn size(&self) -> Option<u64> {
        self.has(FATTR_SIZE).then_some(self.size)
    }
    pub fn fh(&self) -> Option<u64> {
        self.has(FATTR_FH).then_some(self.fh)
    }
    pub fn lock_owner(&self) -> Option<u64> {
        self.has(FATTR_LOCKOWNER).then_some(self.lock_owner)
    }
    /// A time field: `now_bit` (the kernel sets it together with `set_bit`) wins over the
    /// explicit value.
    fn time(&self, now_bit: u32, set_bit: u32, sec: u64, nsec: u32) -> Option<SetTime> {
        if self.has(now_bit) {
            Some(SetTime::Now)
        } else if self.has(set_bit) {
            Some(SetTime::At {
                sec: sec as i64,
                nsec,
            })
        } else {
            None
        }
    }
    pub fn atime(&self) -> Option<SetTime> {
        self.time(FATTR_ATIME_NOW, FATTR_ATIME, self.atime, self.atimensec)
    }
    pub fn mtime(&self) -> Option<SetTime> {
        self.time(FATTR_MTIME_NOW, FATTR_MTIME, self.mtime, self.mtimensec)
    }
    pub fn ctime(&self) -> Option<SetTime> {
        self.has(FATTR_CTIME).then_some(SetTime::At {
            sec: self.ctime as i64,
            nsec: self.ctimensec,
        })
    }
    /// The kernel asks the server to clear suid/sgid (HANDLE_KILLPRIV_V2 only).
    pub fn kill_suidgid(&self) -> bool {
        self.has(FATTR_KILL_SUIDGID)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct OpenIn {
    pub flags: u32,
    pub open_flags: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct CreateIn {
    pub flags: u32,
    pub mode: u32,
    pub umask: u32,
    pub open_flags: u32,
}

/// `struct fuse_open_out`: reply to OPEN and OPENDIR (second half of CREATE's reply).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct OpenOut {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: i32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ReleaseIn {
    pub fh: u64,
    pub flags: u32,
    pub release_flags: u32,
    pub lock_owner: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FlushIn {
    pub fh: u64,
    pub unused: u32,
    pub padding: u32,
    pub lock_owner: u64,
}

/// `struct fuse_read_in`: READ, READDIR, READDIRPLUS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ReadIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub read_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct WriteIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub write_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct WriteOut {
    pub size: u32,
    pub padding: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FsyncIn {
    pub fh: u64,
    pub fsync_flags: u32,
    pub padding: u32,
}

/// `struct fuse_setxattr_in` in its 8-byte compat form (`FUSE_COMPAT_SETXATTR_IN_SIZE`): what
/// the kernel sends when FUSE_SETXATTR_EXT is not negotiated (we never negotiate it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SetxattrIn {
    pub size: u32,
    pub flags: u32,
}

/// `struct fuse_setxattr_in`, extended form (only with FUSE_SETXATTR_EXT).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SetxattrInExt {
    pub size: u32,
    pub flags: u32,
    pub setxattr_flags: u32,
    pub padding: u32,
}

/// `struct fuse_getxattr_in`: GETXATTR and LISTXATTR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct GetxattrIn {
    pub size: u32,
    pub padding: u32,
}

/// `struct fuse_getxattr_out`: reply to a size probe (GETXATTR/LISTXATTR with size 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct GetxattrOut {
    pub size: u32,
    pub padding: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct LkIn {
    pub fh: u64,
    pub owner: u64,
    pub lk: FileLock,
    pub lk_flags: u32,
    pub padding: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct LkOut {
    pub lk: FileLock,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct AccessIn {
    pub mask: u32,
    pub padding: u32,
}

/// `struct fuse_init_in` (64 bytes since 7.36; older kernels send the first 16).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub flags2: u32,
    pub unused: [u32; 11],
}

/// Size of the pre-7.36 `fuse_init_in` (major, minor, max_readahead, flags).
pub const FUSE_COMPAT_INIT_IN_SIZE: usize = 16;

/// `struct fuse_init_out`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct InitOut {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    /// Low 32 bits of the negotiated INIT flags.
    pub flags: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub time_gran: u32,
    pub max_pages: u16,
    pub map_alignment: u16,
    /// High 32 bits of the negotiated INIT flags (needs FUSE_INIT_EXT in `flags`).
    pub flags2: u32,
    pub max_stack_depth: u32,
    /// Seconds (FUSE_REQUEST_TIMEOUT).
    pub request_timeout: u16,
    pub unused: [u16; 11],
}

impl InitOut {
    /// Store a 64-bit flag set into `flags` / `flags2`.
    pub fn set_flags(&mut self, flags: u64) {
        self.flags = flags as u32;
        self.flags2 = (flags >> 32) as u32;
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct InterruptIn {
    pub unique: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct BmapIn {
    pub block: u64,
    pub blocksize: u32,
    pub padding: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct BmapOut {
    pub block: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct IoctlIn {
    pub fh: u64,
    pub flags: u32,
    pub cmd: u32,
    pub arg: u64,
    pub in_size: u32,
    pub out_size: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct PollIn {
    pub fh: u64,
    pub kh: u64,
    pub flags: u32,
    pub events: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FallocateIn {
    pub fh: u64,
    pub offset: u64,
    pub length: u64,
    pub mode: u32,
    pub padding: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct LseekIn {
    pub fh: u64,
    pub offset: u64,
    pub whence: u32,
    pub padding: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct LseekOut {
    pub offset: u64,
}

/// `struct fuse_copy_file_range_in`: COPY_FILE_RANGE and COPY_FILE_RANGE_64.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct CopyFileRangeIn {
    pub fh_in: u64,
    pub off_in: u64,
    pub nodeid_out: u64,
    pub fh_out: u64,
    pub off_out: u64,
    pub len: u64,
    pub flags: u64,
}

/// `struct fuse_copy_file_range_out`: reply to COPY_FILE_RANGE_64 (COPY_FILE_RANGE replies
/// with a [`WriteOut`], limited to u32).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct CopyFileRangeOut {
    pub bytes_copied: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SyncfsIn {
    pub padding: u64,
}

/// `struct fuse_notify_retrieve_in` (the argument of NOTIFY_REPLY; same size as WriteIn).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct NotifyRetrieveIn {
    pub dummy1: u64,
    pub offset: u64,
    pub size: u32,
    pub dummy2: u32,
    pub dummy3: u64,
    pub dummy4: u64,
}

/// `struct fuse_ext_header`: one request extension.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ExtHeader {
    pub size: u32,
    pub typ: u32,
}

// ------------------------------------------------------------------------------------------
// Directory records
// ------------------------------------------------------------------------------------------

/// `struct fuse_dirent` without its flexible `name[]`: the 24-byte record head. A record is
/// this head, `namelen` name bytes (no NUL), zero padding to a multiple of 8.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Dirent {
    pub ino: u64,
    /// Offset of the *next* entry: what READDIR's `offset` will be to resume after this one.
    pub off: u64,
    pub namelen: u32,
    /// DT_* type: `(mode & S_IFMT) >> 12`.
    pub typ: u32,
}

/// `struct fuse_direntplus` without the name: entry_out then the dirent head.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct DirentPlus {
    pub entry_out: EntryOut,
    pub dirent: Dirent,
}

/// `FUSE_NAME_OFFSET`: where the name starts in a dirent record.
pub const FUSE_NAME_OFFSET: usize = size_of::<Dirent>();
/// `FUSE_NAME_OFFSET_DIRENTPLUS`.
pub const FUSE_NAME_OFFSET_DIRENTPLUS: usize = size_of::<DirentPlus>();

/// `FUSE_REC_ALIGN` / `FUSE_DIRENT_ALIGN`: round up to a multiple of 8.
pub const fn rec_align(x: usize) -> usize {
    (x + 7) & !7
}

/// `FUSE_DIRENT_SIZE` for a name of `namelen` bytes.
pub const fn dirent_size(namelen: usize) -> usize {
    rec_align(FUSE_NAME_OFFSET + namelen)
}

/// `FUSE_DIRENTPLUS_SIZE` for a name of `namelen` bytes.
pub const fn direntplus_size(namelen: usize) -> usize {
    rec_align(FUSE_NAME_OFFSET_DIRENTPLUS + namelen)
}

/// DT_* type of a file mode.
pub const fn dt_type(mode: u32) -> u32 {
    (mode & libc::S_IFMT) >> 12
}

// ------------------------------------------------------------------------------------------
// Notifications
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct NotifyInvalInodeOut {
    pub ino: u64,
    /// Start of the byte range to drop from the page cache; negative: attributes only.
    pub off: i64,
    /// Length of that range; 0 = to the end.
    pub len: i64,
}

/// Followed by the name and a NUL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct NotifyInvalEntryOut {
    pub parent: u64,
    pub namelen: u32,
    pub flags: u32,
}

/// Followed by the name and a NUL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct NotifyDeleteOut {
    pub parent: u64,
    pub child: u64,
    pub namelen: u32,
    pub padding: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct NotifyPruneOut {
    pub count: u32,
    pub padding: u32,
    pub spare: u64,
}

// ------------------------------------------------------------------------------------------
// FUSE over io_uring
// ------------------------------------------------------------------------------------------

pub const FUSE_URING_IN_OUT_HEADER_SZ: usize = 128;
pub const FUSE_URING_OP_IN_OUT_SZ: usize = 128;

/// `sqe->cmd_op` values (`enum fuse_uring_cmd`).
pub const FUSE_IO_URING_CMD_INVALID: u32 = 0;
pub const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
pub const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_ent_in_out`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct UringEntInOut {
    pub flags: u64,
    /// Kernel → server: equals the request's unique. Echo it in COMMIT_AND_FETCH.
    pub commit_id: u64,
    /// Kernel → server: payload bytes of the request; server → kernel: reply bytes.
    pub payload_sz: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// `struct fuse_uring_req_header`: the header buffer (`iov[0]`) of a ring entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct UringReqHeader {
    /// `fuse_in_header` (request) / `fuse_out_header` (reply).
    pub in_out: [u8; FUSE_URING_IN_OUT_HEADER_SZ],
    /// `in_args[0]` of the request ([`crate::protocol::op_in_size`] bytes are meaningful).
    pub op_in: [u8; FUSE_URING_OP_IN_OUT_SZ],
    pub ring_ent_in_out: UringEntInOut,
}

impl Default for UringReqHeader {
    fn default() -> Self {
        UringReqHeader {
            in_out: [0; FUSE_URING_IN_OUT_HEADER_SZ],
            op_in: [0; FUSE_URING_OP_IN_OUT_SZ],
            ring_ent_in_out: UringEntInOut::default(),
        }
    }
}

/// `struct fuse_uring_cmd_req`: the first 24 bytes of the SQE128 command area.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct UringCmdReq {
    pub flags: u64,
    /// COMMIT_AND_FETCH only: the entry's commit_id.
    pub commit_id: u64,
    /// Queue index == CPU number.
    pub qid: u16,
    pub padding: [u8; 6],
}

// ------------------------------------------------------------------------------------------
// Size assertions: every struct, against the uapi header.
// ------------------------------------------------------------------------------------------

const _: () = assert!(size_of::<Attr>() == 88);
const _: () = assert!(size_of::<SxTime>() == 16);
const _: () = assert!(size_of::<Statx>() == 256);
const _: () = assert!(size_of::<Kstatfs>() == 80);
const _: () = assert!(size_of::<StatfsOut>() == 80);
const _: () = assert!(size_of::<FileLock>() == 24);
const _: () = assert!(size_of::<InHeader>() == 40);
const _: () = assert!(size_of::<OutHeader>() == 16);
const _: () = assert!(size_of::<EntryOut>() == 128);
const _: () = assert!(size_of::<ForgetIn>() == 8);
const _: () = assert!(size_of::<ForgetOne>() == 16);
const _: () = assert!(size_of::<BatchForgetIn>() == 8);
const _: () = assert!(size_of::<GetattrIn>() == 16);
const _: () = assert!(size_of::<AttrOut>() == 104);
const _: () = assert!(size_of::<StatxIn>() == 24);
const _: () = assert!(size_of::<StatxOut>() == 288);
const _: () = assert!(size_of::<MknodIn>() == 16);
const _: () = assert!(size_of::<MkdirIn>() == 8);
const _: () = assert!(size_of::<RenameIn>() == 8);
const _: () = assert!(size_of::<Rename2In>() == 16);
const _: () = assert!(size_of::<LinkIn>() == 8);
const _: () = assert!(size_of::<SetattrIn>() == 88);
const _: () = assert!(size_of::<OpenIn>() == 8);
const _: () = assert!(size_of::<CreateIn>() == 16);
const _: () = assert!(size_of::<OpenOut>() == 16);
const _: () = assert!(size_of::<ReleaseIn>() == 24);
const _: () = assert!(size_of::<FlushIn>() == 24);
const _: () = assert!(size_of::<ReadIn>() == 40);
const _: () = assert!(size_of::<WriteIn>() == 40);
const _: () = assert!(size_of::<WriteOut>() == 8);
const _: () = assert!(size_of::<FsyncIn>() == 16);
const _: () = assert!(size_of::<SetxattrIn>() == 8);
const _: () = assert!(size_of::<SetxattrInExt>() == 16);
const _: () = assert!(size_of::<GetxattrIn>() == 8);
const _: () = assert!(size_of::<GetxattrOut>() == 8);
const _: () = assert!(size_of::<LkIn>() == 48);
const _: () = assert!(size_of::<LkOut>() == 24);
const _: () = assert!(size_of::<AccessIn>() == 8);
const _: () = assert!(size_of::<InitIn>() == 64);
const _: () = assert!(size_of::<InitOut>() == 64);
const _: () = assert!(size_of::<InterruptIn>() == 8);
const _: () = assert!(size_of::<BmapIn>() == 16);
const _: () = assert!(size_of::<BmapOut>() == 8);
const _: () = assert!(size_of::<IoctlIn>() == 32);
const _: () = assert!(size_of::<PollIn>() == 24);
const _: () = assert!(size_of::<FallocateIn>() == 32);
const _: () = assert!(size_of::<LseekIn>() == 24);
const _: () = assert!(size_of::<LseekOut>() == 8);
const _: () = assert!(size_of::<CopyFileRangeIn>() == 56);
const _: () = assert!(size_of::<CopyFileRangeOut>() == 8);
const _: () = assert!(size_of::<SyncfsIn>() == 8);
const _: () = assert!(size_of::<NotifyRetrieveIn>() == 40);
const _: () = assert!(size_of::<ExtHeader>() == 8);
const _: () = assert!(size_of::<Dirent>() == 24);
const _: () = assert!(size_of::<DirentPlus>() == 152);
const _: () = assert!(size_of::<NotifyInvalInodeOut>() == 24);
const _: () = assert!(size_of::<NotifyInvalEntryOut>() == 16);
const _: () = assert!(size_of::<NotifyDeleteOut>() == 24);
const _: () = assert!(size_of::<NotifyPruneOut>() == 16);
const _: () = assert!(size_of::<UringEntInOut>() == 32);
const _: () = assert!(size_of::<UringReqHeader>() == 288);
const _: () = assert!(size_of::<UringCmdReq>() == 24);
// Field offsets the transports rely on.
const _: () = assert!(core::mem::offset_of!(UringReqHeader, op_in) == 128);
const _: () = assert!(core::mem::offset_of!(UringReqHeader, ring_ent_in_out) == 256);
const _: () = assert!(core::mem::offset_of!(InitOut, flags2) == 32);
const _: () = assert!(core::mem::offset_of!(InitOut, request_timeout) == 40);
const _: () = assert!(core::mem::offset_of!(InHeader, total_extlen) == 36);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_roundtrip_and_names() {
        for op in Opcode::ALL {
            assert_eq!(Opcode::from_u32(op as u32), Some(op));
            assert!(op.name().starts_with("FUSE_") || op.name().starts_with("CUSE_"));
        }
        for n in 0..5000u32 {
            let linear = Opcode::ALL.iter().copied().find(|op| *op as u32 == n);
            assert_eq!(Opcode::from_u32(n), linear, "{n}");
        }
        assert_eq!(Opcode::from_u32(u32::MAX), None);
        assert_eq!(Opcode::from_u32(7), None);
        assert_eq!(Opcode::from_u32(19), None);
        assert_eq!(Opcode::from_u32(54), None);
        assert_eq!(opcode_name(53), "FUSE_COPY_FILE_RANGE_64");
        assert_eq!(opcode_name(52), "FUSE_STATX");
        assert_eq!(opcode_name(48), "FUSE_SETUPMAPPING");
        assert_eq!(opcode_name(9999), "UNKNOWN");
        assert!(!Opcode::Forget.expects_reply());
        assert!(!Opcode::BatchForget.expects_reply());
        assert!(Opcode::Lookup.expects_reply());
    }

    #[test]
    fn flag_values_match_uapi() {
        // Spot-check values observed from this machine's kernel (see kernel-notes §6):
        // the INIT reply there had flags=0x40400021, flags2=0x200.
        assert_eq!(
            FUSE_INIT_EXT | FUSE_MAX_PAGES | FUSE_BIG_WRITES | FUSE_ASYNC_READ,
            0x4040_0021
        );
        assert_eq!(FUSE_OVER_IO_URING >> 32, 0x200);
        assert_eq!(FUSE_REQUEST_TIMEOUT, 1 << 42);
        assert_eq!(FATTR_KILL_SUIDGID, 0x800);
        assert_eq!(dt_type(libc::S_IFDIR | 0o755), libc::DT_DIR as u32);
        assert_eq!(dt_type(libc::S_IFREG | 0o644), libc::DT_REG as u32);
        assert_eq!(dt_type(libc::S_IFLNK | 0o777), libc::DT_LNK as u32);
    }

    #[test]
    fn init_out_flag_split() {
        let mut o = InitOut::default();
        o.set_flags(FUSE_INIT_EXT | FUSE_OVER_IO_URING | FUSE_ASYNC_READ);
        assert_eq!(o.flags, (FUSE_INIT_EXT | FUSE_ASYNC_READ) as u32);
        assert_eq!(o.flags2, 1 << 9);
    }

    #[test]
    fn setattr_accessors() {
        let s = SetattrIn {
            valid: FATTR_MODE | FATTR_ATIME | FATTR_ATIME_NOW | FATTR_MTIME | FATTR_SIZE,
            mode: 0o600,
            size: 42,
            mtime: (-5i64) as u64,
            mtimensec: 7,
            uid: 99,
            ..Default::default()
        };
        assert_eq!(s.mode(), Some(0o600));
        assert_eq!(s.uid(), None);
        assert_eq!(s.size(), Some(42));
        assert_eq!(s.atime(), Some(SetTime::Now));
        assert_eq!(s.mtime(), Some(SetTime::At { sec: -5, nsec: 7 }));
        assert_eq!(s.ctime(), None);
        assert_eq!(s.fh(), None);
        assert!(!s.kill_suidgid());
    }

    #[test]
    fn record_sizes() {
        assert_eq!(dirent_size(1), 32);
        assert_eq!(dirent_size(8), 32);
        assert_eq!(dirent_size(9), 40);
        assert_eq!(direntplus_size(1), 160);
        assert_eq!(direntplus_size(8), 160);
        assert_eq!(direntplus_size(9), 168);
    }
}
