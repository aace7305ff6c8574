//! Transport-independent request parsing: bytes → [`Request`].
//!
//! Two entry points feed one parser:
//! * [`decode`] — the classic `/dev/fuse` transport reads one contiguous message
//!   (`fuse_in_header ++ in_args[0] ++ rest`); it is split at `40 + op_in_size(opcode)`.
//! * [`decode_parts`] — the io_uring transport already receives the three pieces separately
//!   (the `in_out` header area, the `op_in` area, the payload buffer).
//!
//! Rules: short or malformed input is a [`DecodeError`] (EINVAL; a `len` field that disagrees
//! with the message is EIO), never a panic. Names are the bytes before their NUL; a missing NUL
//! or an empty name is EINVAL. Bytes left over after the last expected argument are EINVAL too
//! (they mean a mis-split or a protocol we do not speak), except for opcodes we do not decode.
//! Request extensions (`total_extlen`, only sent when FUSE_SECURITY_CTX or
//! FUSE_CREATE_SUPP_GROUP is negotiated, which we never do) are cut off the end of the payload
//! and ignored.
//!
//! Struct sizes assume protocol >= 7.31 (older kernels are refused at INIT); INIT itself is
//! accepted in both its 16-byte (< 7.36) and 64-byte forms so that it can be answered.

use crate::abi::{self, Opcode};
use crate::errno::Errno;
use core::fmt;
use core::mem::size_of;
use zerocopy::FromBytes;

/// Size of `fuse_in_header`.
pub const IN_HEADER_SIZE: usize = size_of::<abi::InHeader>();

/// The fields of `fuse_in_header` a handler needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Total request length as the kernel declared it.
    pub len: u32,
    pub opcode: u32,
    /// Echo in the reply. Bit 63 ([`abi::FUSE_UNIQUE_RESEND`]) marks a re-sent request.
    pub unique: u64,
    /// The inode the operation is on (the parent directory for name operations).
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl From<&abi::InHeader> for Header {
    fn from(h: &abi::InHeader) -> Self {
        Header {
            len: h.len,
            opcode: h.opcode,
            unique: h.unique,
            nodeid: h.nodeid,
            uid: h.uid,
            gid: h.gid,
            pid: h.pid,
        }
    }
}

/// A decoded request: the header and the typed operation borrowing from the input buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub header: Header,
    pub op: Operation<'a>,
}

/// Why a message could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// The request to answer with `errno`. `None`: do not answer — either the header itself was
    /// unreadable, or the opcode is one the kernel expects no reply to (FORGET, BATCH_FORGET,
    /// INTERRUPT).
    pub unique: Option<u64>,
    pub errno: Errno,
    pub why: &'static str,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.unique {
            Some(u) => write!(
                f,
                "malformed FUSE request {u}: {} ({})",
                self.why, self.errno
            ),
            None => write!(f, "malformed FUSE message: {} ({})", self.why, self.errno),
        }
    }
}

impl std::error::Error for DecodeError {}

/// The entries of a BATCH_FORGET, borrowed from the message: iterate to get
/// `(nodeid, nlookup)` pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForgetList<'a> {
    /// A whole number of 16-byte `fuse_forget_one` records.
    bytes: &'a [u8],
}

impl<'a> ForgetList<'a> {
    pub fn len(&self) -> usize {
        self.bytes.len() / size_of::<abi::ForgetOne>()
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    pub fn iter(&self) -> ForgetIter<'a> {
        ForgetIter {
            chunks: self.bytes.chunks_exact(size_of::<abi::ForgetOne>()),
        }
    }
}

/// Iterator over `(nodeid, nlookup)` of a [`ForgetList`].
#[derive(Clone, Debug)]
pub struct ForgetIter<'a> {
    chunks: core::slice::ChunksExact<'a, u8>,
}

impl Iterator for ForgetIter<'_> {
    type Item = (u64, u64);
    fn next(&mut self) -> Option<(u64, u64)> {
        let chunk = self.chunks.next()?;
        let one = abi::ForgetOne::read_from_bytes(chunk).ok()?;
        Some((one.nodeid, one.nlookup))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.chunks.size_hint()
    }
}

impl<'a> IntoIterator for ForgetList<'a> {
    type Item = (u64, u64);
    type IntoIter = ForgetIter<'a>;
    fn into_iter(self) -> ForgetIter<'a> {
        self.iter()
    }
}

impl<'a> IntoIterator for &ForgetList<'a> {
    type Item = (u64, u64);
    type IntoIter = ForgetIter<'a>;
    fn into_iter(self) -> ForgetIter<'a> {
        self.iter()
    }
}

/// One variant per opcode we serve; `Unknown` for every other (answer ENOSYS).
///
/// The target inode is `header.nodeid` (for name operations: the parent directory). Names and
/// data borrow from the message. Numeric fields are the wire values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation<'a> {
    /// `flags` = `init_in.flags | init_in.flags2 << 32` (flags2 only if FUSE_INIT_EXT is set).
    Init {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u64,
    },
    Destroy,
    Lookup {
        name: &'a [u8],
    },
    /// No reply.
    Forget {
        nlookup: u64,
    },
    /// No reply.
    BatchForget {
        nodes: ForgetList<'a>,
    },
    /// `fh` is set when the kernel asks about an open file (FUSE_GETATTR_FH).
    Getattr {
        fh: Option<u64>,
    },
    /// Use the accessor methods of [`abi::SetattrIn`] (`mode()`, `size()`, `atime()`, ...):
    /// they apply the `valid` bits.
    Setattr(abi::SetattrIn),
    Readlink,
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Mknod {
        name: &'a [u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    },
    Mkdir {
        name: &'a [u8],
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    /// RENAME (flags 0) and RENAME2 (`RENAME_NOREPLACE` / `RENAME_EXCHANGE` / `RENAME_WHITEOUT`).
    Rename {
        newdir: u64,
        name: &'a [u8],
        newname: &'a [u8],
        flags: u32,
    },
    /// `header.nodeid` is the new parent; `oldnodeid` the inode to link.
    Link {
        oldnodeid: u64,
        newname: &'a [u8],
    },
    Open {
        flags: u32,
    },
    /// `flags` are the file's open flags.
    Read {
        fh: u64,
        offset: u64,
        size: u32,
        flags: u32,
    },
    /// `data.len() == size` is guaranteed.
    Write {
        fh: u64,
        offset: u64,
        data: &'a [u8],
        write_flags: u32,
        flags: u32,
    },
    Statfs,
    Release {
        fh: u64,
        flags: u32,
        release_flags: u32,
    },
    Fsync {
        fh: u64,
        datasync: bool,
    },
    /// `value.len()` equals the size the kernel declared.
    Setxattr {
        name: &'a [u8],
        value: &'a [u8],
        flags: u32,
    },
    /// `size` 0 asks for the value's size only.
    Getxattr {
        name: &'a [u8],
        size: u32,
    },
    /// `size` 0 asks for the list's size only.
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a [u8],
    },
    Flush {
        fh: u64,
    },
    Opendir {
        flags: u32,
    },
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Releasedir {
        fh: u64,
    },
    Fsyncdir {
        fh: u64,
        datasync: bool,
    },
    Access {
        mask: u32,
    },
    Create {
        name: &'a [u8],
        flags: u32,
        mode: u32,
        umask: u32,
    },
    /// O_TMPFILE: a new unnamed regular file in directory `nodeid` (the kernel sends the
    /// create arguments and a placeholder name, which is ignored).
    Tmpfile {
        flags: u32,
        mode: u32,
        umask: u32,
    },
    /// No reply (normally); `unique` is the request to interrupt.
    Interrupt {
        unique: u64,
    },
    Fallocate {
        fh: u64,
        offset: u64,
        length: u64,
        mode: u32,
    },
    Readdirplus {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Lseek {
        fh: u64,
        offset: u64,
        whence: u32,
    },
    /// `wide` = COPY_FILE_RANGE_64 (reply `fuse_copy_file_range_out`, u64); otherwise the reply
    /// is a `fuse_write_out` (u32).
    CopyFileRange {
        fh_in: u64,
        off_in: u64,
        nodeid_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u64,
        wide: bool,
    },
    /// `fh` as for Getattr; `sx_flags` are `AT_STATX_*`, `sx_mask` the `STATX_*` wanted.
    Statx {
        fh: Option<u64>,
        sx_flags: u32,
        sx_mask: u32,
    },
    /// Anything else (GETLK, IOCTL, POLL, BMAP, SYNCFS, SETUPMAPPING, ... and numbers
    /// the kernel does not define): answer ENOSYS.
    Unknown {
        opcode: u32,
    },
}

/// Size of `in_args[0]` for `opcode`: where the classic transport splits a message and what
/// the io_uring transport finds in `fuse_uring_req_header.op_in`. Zero for opcodes whose
/// arguments are only names (the kernel sends a zero-size arg0 for them since 6.14) and for
/// unknown opcodes. For INIT this is the 7.36+ size (64); older kernels send 16.
pub fn op_in_size(opcode: u32) -> usize {
    use Opcode as O;
    let Some(op) = Opcode::from_u32(opcode) else {
        return 0;
    };
    match op {
        O::Lookup | O::Readlink | O::Symlink | O::Unlink | O::Rmdir | O::Statfs => 0,
        O::Removexattr | O::Destroy => 0,
        O::Forget => size_of::<abi::ForgetIn>(),
        O::Getattr => size_of::<abi::GetattrIn>(),
        O::Setattr => size_of::<abi::SetattrIn>(),
        O::Mknod => size_of::<abi::MknodIn>(),
        O::Mkdir => size_of::<abi::MkdirIn>(),
        O::Rename => size_of::<abi::RenameIn>(),
        O::Rename2 => size_of::<abi::Rename2In>(),
        O::Link => size_of::<abi::LinkIn>(),
        O::Open | O::Opendir => size_of::<abi::OpenIn>(),
        O::Read | O::Readdir | O::Readdirplus => size_of::<abi::ReadIn>(),
        O::Write => size_of::<abi::WriteIn>(),
        O::Release | O::Releasedir => size_of::<abi::ReleaseIn>(),
        O::Fsync | O::Fsyncdir => size_of::<abi::FsyncIn>(),
        O::Setxattr => size_of::<abi::SetxattrIn>(),
        O::Getxattr | O::Listxattr => size_of::<abi::GetxattrIn>(),
        O::Flush => size_of::<abi::FlushIn>(),
        O::Init => size_of::<abi::InitIn>(),
        O::Getlk | O::Setlk | O::Setlkw => size_of::<abi::LkIn>(),
        O::Access => size_of::<abi::AccessIn>(),
        O::Create | O::Tmpfile => size_of::<abi::CreateIn>(),
        O::Interrupt => size_of::<abi::InterruptIn>(),
        O::Bmap => size_of::<abi::BmapIn>(),
        O::Ioctl => size_of::<abi::IoctlIn>(),
        O::Poll => size_of::<abi::PollIn>(),
        O::NotifyReply => size_of::<abi::NotifyRetrieveIn>(),
        O::BatchForget => size_of::<abi::BatchForgetIn>(),
        O::Fallocate => size_of::<abi::FallocateIn>(),
        O::Lseek => size_of::<abi::LseekIn>(),
        O::CopyFileRange | O::CopyFileRange64 => size_of::<abi::CopyFileRangeIn>(),
        // struct fuse_setupmapping_in: fh, foffset, len, flags, moffset.
        O::Setupmapping => 40,
        // struct fuse_removemapping_in: u32 count.
        O::Removemapping => 4,
        O::Syncfs => size_of::<abi::SyncfsIn>(),
        O::Statx => size_of::<abi::StatxIn>(),
        // struct cuse_init_in.
        O::CuseInit => 16,
    }
}

/// False for FORGET, BATCH_FORGET and INTERRUPT: never send a reply for those.
pub fn expects_reply(opcode: u32) -> bool {
    Opcode::from_u32(opcode).is_none_or(Opcode::expects_reply)
}

/// Decode one contiguous message as read from /dev/fuse. `header.len` must equal `msg.len()`.
///
/// # Errors
/// EIO if the header is short or its `len` disagrees with `msg.len()`; EINVAL for malformed
/// arguments. See [`DecodeError::unique`] for whether to answer.
pub fn decode(msg: &[u8]) -> Result<Request<'_>, DecodeError> {
    let h = read_header(msg)?;
    if usize::try_from(h.len).ok() != Some(msg.len()) {
        return Err(fail(
            &h,
            Errno::EIO,
            "header.len differs from the message length",
        ));
    }
    let rest = msg.get(IN_HEADER_SIZE..).unwrap_or_default();
    let want = if h.opcode == Opcode::Init as u32 {
        // 64 bytes since 7.36, 16 before: take what is there, parse_init checks it.
        op_in_size(h.opcode).min(rest.len())
    } else {
        op_in_size(h.opcode)
    };
    let Some((op_in, payload)) = rest.split_at_checked(want) else {
        return Err(fail(
            &h,
            Errno::EINVAL,
            "message shorter than the opcode's argument struct",
        ));
    };
    parse(&h, op_in, payload)
}

/// Decode a request delivered in three pieces (io_uring): `header` holds the `fuse_in_header`
/// (the 128-byte `in_out` area may be passed whole), `op_in` holds `in_args[0]` (at least
/// [`op_in_size`] bytes; extra bytes, e.g. the rest of the 128-byte area, are ignored), and
/// `payload` holds exactly the remaining arguments (`payload_sz` bytes).
///
/// `header.len` is not checked here: on the ring the buffer sizes are authoritative.
///
/// # Errors
/// EIO if `header` is shorter than `fuse_in_header`; EINVAL for a short `op_in` or malformed
/// arguments.
pub fn decode_parts<'a>(
    header: &'a [u8],
    op_in: &'a [u8],
    payload: &'a [u8],
) -> Result<Request<'a>, DecodeError> {
    let h = read_header(header)?;
    let want = if h.opcode == Opcode::Init as u32 {
        op_in_size(h.opcode).min(op_in.len())
    } else {
        op_in_size(h.opcode)
    };
    let Some(op_in) = op_in.get(..want) else {
        return Err(fail(
            &h,
            Errno::EINVAL,
            "op_in shorter than the opcode's argument struct",
        ));
    };
    parse(&h, op_in, payload)
}

fn read_header(bytes: &[u8]) -> Result<abi::InHeader, DecodeError> {
    match abi::InHeader::read_from_prefix(bytes) {
        Ok((h, _)) => Ok(h),
        Err(_) => Err(DecodeError {
            unique: None,
            errno: Errno::EIO,
            why: "message shorter than fuse_in_header",
        }),
    }
}

fn fail(h: &abi::InHeader, errno: Errno, why: &'static str) -> DecodeError {
    DecodeError {
        unique: expects_reply(h.opcode).then_some(h.unique),
        errno,
        why,
    }
}

/// Reads a fixed struct from `op_in` (exactly `op_in_size` bytes after the split).
fn arg<T: FromBytes>(op_in: &[u8]) -> Result<T, &'static str> {
    T::read_from_bytes(op_in).map_err(|_| "argument struct has the wrong size")
}

/// A cursor over the variable-length arguments after `in_args[0]`.
struct Rest<'a> {
    bytes: &'a [u8],
}

impl<'a> Rest<'a> {
    /// A NUL-terminated, non-empty name; returns the bytes before the NUL.
    fn name(&mut self) -> Result<&'a [u8], &'static str> {
        let Some(nul) = self.bytes.iter().position(|&b| b == 0) else {
            return Err("name without NUL terminator");
        };
        let (name, after) = self.bytes.split_at(nul);
        self.bytes = after.get(1..).unwrap_or_default();
        if name.is_empty() {
            return Err("empty name");
        }
        Ok(name)
    }

    /// Exactly `n` bytes.
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        let Some((data, after)) = self.bytes.split_at_checked(n) else {
            return Err("payload shorter than the declared size");
        };
        self.bytes = after;
        Ok(data)
    }

    /// Everything must have been consumed.
    fn end(&self) -> Result<(), &'static str> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err("trailing bytes after the last argument")
        }
    }
}

fn parse<'a>(
    h: &abi::InHeader,
    op_in: &'a [u8],
    payload: &'a [u8],
) -> Result<Request<'a>, DecodeError> {
    let ext = usize::from(h.total_extlen) * 8;
    let Some(args) = payload
        .len()
        .checked_sub(ext)
        .and_then(|n| payload.get(..n))
    else {
        return Err(fail(
            h,
            Errno::EINVAL,
            "request extensions longer than the payload",
        ));
    };
    let op = parse_op(h.opcode, op_in, args).map_err(|why| fail(h, Errno::EINVAL, why))?;
    Ok(Request {
        header: Header::from(h),
        op,
    })
}

fn parse_op<'a>(
    opcode: u32,
    op_in: &'a [u8],
    payload: &'a [u8],
) -> Result<Operation<'a>, &'static str> {
    use Operation as Op;
    let Some(code) = Opcode::from_u32(opcode) else {
        return Ok(Op::Unknown { opcode });
    };
    let mut rest = Rest { bytes: payload };
    let op = match code {
        Opcode::Init => parse_init(op_in)?,
        Opcode::Destroy => Op::Destroy,
        Opcode::Lookup => Op::Lookup { name: rest.name()? },
        Opcode::Forget => {
            let a: abi::ForgetIn = arg(op_in)?;
            Op::Forget { nlookup: a.nlookup }
        }
        Opcode::BatchForget => {
            let a: abi::BatchForgetIn = arg(op_in)?;
            let n = usize::try_from(a.count)
                .ok()
                .and_then(|c| c.checked_mul(size_of::<abi::ForgetOne>()))
                .ok_or("forget count overflows")?;
            Op::BatchForget {
                nodes: ForgetList {
                    bytes: rest.take(n)?,
                },
            }
        }
        Opcode::Getattr => {
            let a: abi::GetattrIn = arg(op_in)?;
            Op::Getattr {
                fh: (a.getattr_flags & abi::FUSE_GETATTR_FH != 0).then_some(a.fh),
            }
        }
        Opcode::Setattr => Op::Setattr(arg(op_in)?),
        Opcode::Readlink => Op::Readlink,
        Opcode::Symlink => {
            let name = rest.name()?;
            let target = rest.name()?;
            Op::Symlink { name, target }
        }
        Opcode::Mknod => {
            let a: abi::MknodIn = arg(op_in)?;
            Op::Mknod {
                name: rest.name()?,
                mode: a.mode,
                rdev: a.rdev,
                umask: a.umask,
            }
        }
        Opcode::Mkdir => {
            let a: abi::MkdirIn = arg(op_in)?;
            Op::Mkdir {
                name: rest.name()?,
                mode: a.mode,
                umask: a.umask,
            }
        }
        Opcode::Unlink => Op::Unlink { name: rest.name()? },
        Opcode::Rmdir => Op::Rmdir { name: rest.name()? },
        Opcode::Rename => {
            let a: abi::RenameIn = arg(op_in)?;
            let name = rest.name()?;
            let newname = rest.name()?;
            Op::Rename {
                newdir: a.newdir,
                name,
                newname,
                flags: 0,
            }
        }
        Opcode::Rename2 => {
            let a: abi::Rename2In = arg(op_in)?;
            let name = rest.name()?;
            let newname = rest.name()?;
            Op::Rename {
                newdir: a.newdir,
                name,
                newname,
                flags: a.flags,
            }
        }
        Opcode::Link => {
            let a: abi::LinkIn = arg(op_in)?;
            Op::Link {
                oldnodeid: a.oldnodeid,
                newname: rest.name()?,
            }
        }
        Opcode::Open => {
            let a: abi::OpenIn = arg(op_in)?;
            Op::Open { flags: a.flags }
        }
        Opcode::Opendir => {
            let a: abi::OpenIn = arg(op_in)?;
            Op::Opendir { flags: a.flags }
        }
        Opcode::Read => {
            let a: abi::ReadIn = arg(op_in)?;
            Op::Read {
                fh: a.fh,
                offset: a.offset,
                size: a.size,
                flags: a.flags,
            }
        }
        Opcode::Readdir => {
            let a: abi::ReadIn = arg(op_in)?;
            Op::Readdir {
                fh: a.fh,
                offset: a.offset,
                size: a.size,
            }
        }
        Opcode::Readdirplus => {
            let a: abi::ReadIn = arg(op_in)?;
            Op::Readdirplus {
                fh: a.fh,
                offset: a.offset,
                size: a.size,
            }
        }
        Opcode::Write => {
            let a: abi::WriteIn = arg(op_in)?;
            if usize::try_from(a.size).ok() != Some(payload.len()) {
                return Err("write data length differs from write_in.size");
            }
            let data = rest.take(payload.len())?;
            Op::Write {
                fh: a.fh,
                offset: a.offset,
                data,
                write_flags: a.write_flags,
                flags: a.flags,
            }
        }
        Opcode::Statfs => Op::Statfs,
        Opcode::Release => {
            let a: abi::ReleaseIn = arg(op_in)?;
            Op::Release {
                fh: a.fh,
                flags: a.flags,
                release_flags: a.release_flags,
            }
        }
        Opcode::Releasedir => {
            let a: abi::ReleaseIn = arg(op_in)?;
            Op::Releasedir { fh: a.fh }
        }
        Opcode::Fsync => {
            let a: abi::FsyncIn = arg(op_in)?;
            Op::Fsync {
                fh: a.fh,
                datasync: a.fsync_flags & abi::FUSE_FSYNC_FDATASYNC != 0,
            }
        }
        Opcode::Fsyncdir => {
            let a: abi::FsyncIn = arg(op_in)?;
            Op::Fsyncdir {
                fh: a.fh,
                datasync: a.fsync_flags & abi::FUSE_FSYNC_FDATASYNC != 0,
            }
        }
        Opcode::Setxattr => {
            let a: abi::SetxattrIn = arg(op_in)?;
            let name = rest.name()?;
            let size = usize::try_from(a.size).map_err(|_| "xattr size overflows")?;
            let value = rest.take(size)?;
            Op::Setxattr {
                name,
                value,
                flags: a.flags,
            }
        }
        Opcode::Getxattr => {
            let a: abi::GetxattrIn = arg(op_in)?;
            Op::Getxattr {
                name: rest.name()?,
                size: a.size,
            }
        }
        Opcode::Listxattr => {
            let a: abi::GetxattrIn = arg(op_in)?;
            Op::Listxattr { size: a.size }
        }
        Opcode::Removexattr => Op::Removexattr { name: rest.name()? },
        Opcode::Flush => {
            let a: abi::FlushIn = arg(op_in)?;
            Op::Flush { fh: a.fh }
        }
        Opcode::Access => {
            let a: abi::AccessIn = arg(op_in)?;
            Op::Access { mask: a.mask }
        }
        Opcode::Create => {
            let a: abi::CreateIn = arg(op_in)?;
            Op::Create {
                name: rest.name()?,
                flags: a.flags,
                mode: a.mode,
                umask: a.umask,
            }
        }
        Opcode::Tmpfile => {
            let a: abi::CreateIn = arg(op_in)?;
            rest.name()?;
            Op::Tmpfile {
                flags: a.flags,
                mode: a.mode,
                umask: a.umask,
            }
        }
        Opcode::Interrupt => {
            let a: abi::InterruptIn = arg(op_in)?;
            Op::Interrupt { unique: a.unique }
        }
        Opcode::Fallocate => {
            let a: abi::FallocateIn = arg(op_in)?;
            Op::Fallocate {
                fh: a.fh,
                offset: a.offset,
                length: a.length,
                mode: a.mode,
            }
        }
        Opcode::Lseek => {
            let a: abi::LseekIn = arg(op_in)?;
            Op::Lseek {
                fh: a.fh,
                offset: a.offset,
                whence: a.whence,
            }
        }
        Opcode::CopyFileRange | Opcode::CopyFileRange64 => {
            let a: abi::CopyFileRangeIn = arg(op_in)?;
            Op::CopyFileRange {
                fh_in: a.fh_in,
                off_in: a.off_in,
                nodeid_out: a.nodeid_out,
                fh_out: a.fh_out,
                off_out: a.off_out,
                len: a.len,
                flags: a.flags,
                wide: code == Opcode::CopyFileRange64,
            }
        }
        Opcode::Statx => {
            let a: abi::StatxIn = arg(op_in)?;
            Op::Statx {
                fh: (a.getattr_flags & abi::FUSE_GETATTR_FH != 0).then_some(a.fh),
                sx_flags: a.sx_flags,
                sx_mask: a.sx_mask,
            }
        }
        Opcode::Getlk
        | Opcode::Setlk
        | Opcode::Setlkw
        | Opcode::Bmap
        | Opcode::Ioctl
        | Opcode::Poll
        | Opcode::NotifyReply
        | Opcode::Setupmapping
        | Opcode::Removemapping
        | Opcode::Syncfs
        | Opcode::CuseInit => return Ok(Op::Unknown { opcode }),
    };
    rest.end()?;
    Ok(op)
}

fn parse_init(op_in: &[u8]) -> Result<Operation<'static>, &'static str> {
    let a = if op_in.len() >= size_of::<abi::InitIn>() {
        arg::<abi::InitIn>(op_in.get(..size_of::<abi::InitIn>()).unwrap_or_default())?
    } else if op_in.len() == abi::FUSE_COMPAT_INIT_IN_SIZE {
        // Pre-7.36 kernels: major, minor, max_readahead, flags; the rest reads as zero.
        let mut full = [0u8; size_of::<abi::InitIn>()];
        for (d, s) in full.iter_mut().zip(op_in) {
            *d = *s;
        }
        arg::<abi::InitIn>(&full)?
    } else {
        return Err("fuse_init_in is neither 16 nor 64 bytes");
    };
    let mut flags = u64::from(a.flags);
    if flags & abi::FUSE_INIT_EXT != 0 {
        flags |= u64::from(a.flags2) << 32;
    }
    Ok(Operation::Init {
        major: a.major,
        minor: a.minor,
        max_readahead: a.max_readahead,
        flags,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::*;
    use proptest::prelude::*;
    use zerocopy::IntoBytes;

    const UNIQUE: u64 = 0x1122_3344_5566;
    const NODE: u64 = 77;

    fn header(opcode: u32, len: usize, extlen: u16) -> InHeader {
        InHeader {
            len: u32::try_from(len).unwrap(),
            opcode,
            unique: UNIQUE,
            nodeid: NODE,
            uid: 1000,
            gid: 100,
            pid: 4242,
            total_extlen: extlen,
            padding: 0,
        }
    }

    fn msg(opcode: u32, op_in: &[u8], payload: &[u8]) -> Vec<u8> {
        let len = IN_HEADER_SIZE + op_in.len() + payload.len();
        let mut m = header(opcode, len, 0).as_bytes().to_vec();
        m.extend_from_slice(op_in);
        m.extend_from_slice(payload);
        m
    }

    fn set_len(m: &mut [u8]) {
        let len = u32::try_from(m.len()).unwrap().to_ne_bytes();
        m[..4].copy_from_slice(&len);
    }

    /// One well-formed message per decoded opcode, with the operation it must decode to.
    fn cases() -> Vec<(u32, Vec<u8>, Vec<u8>, Operation<'static>)> {
        use Operation as Op;
        let init_in = InitIn {
            major: 7,
            minor: 45,
            max_readahead: 131072,
            flags: (FUSE_ASYNC_READ | FUSE_INIT_EXT) as u32,
            flags2: (FUSE_OVER_IO_URING >> 32) as u32,
            unused: [0; 11],
        };
        let setattr = SetattrIn {
            valid: FATTR_MODE | FATTR_SIZE | FATTR_MTIME_NOW | FATTR_MTIME | FATTR_FH,
            fh: 9,
            size: 4096,
            mode: 0o100600,
            uid: 5,
            gid: 6,
            atime: 1,
            mtime: 2,
            ctime: 3,
            ..Default::default()
        };
        let read_in = ReadIn {
            fh: 3,
            offset: 4096,
            size: 8192,
            read_flags: 0,
            lock_owner: 0,
            flags: 2,
            padding: 0,
        };
        let write_in = WriteIn {
            fh: 3,
            offset: 10,
            size: 5,
            write_flags: FUSE_WRITE_CACHE,
            lock_owner: 0,
            flags: 0o2,
            padding: 0,
        };
        let cfr = CopyFileRangeIn {
            fh_in: 1,
            off_in: 2,
            nodeid_out: 3,
            fh_out: 4,
            off_out: 5,
            len: 1 << 33,
            flags: 0,
        };
        let mut forgets = Vec::new();
        for (n, l) in [(10u64, 1u64), (11, 2), (12, 300)] {
            forgets.extend_from_slice(
                ForgetOne {
                    nodeid: n,
                    nlookup: l,
                }
                .as_bytes(),
            );
        }
        let forgets: &'static [u8] = Box::leak(forgets.into_boxed_slice());

        let o = |op: Opcode| op as u32;
        vec![
            (
                o(Opcode::Init),
                init_in.as_bytes().to_vec(),
                vec![],
                Op::Init {
                    major: 7,
                    minor: 45,
                    max_readahead: 131072,
                    flags: FUSE_ASYNC_READ | FUSE_INIT_EXT | FUSE_OVER_IO_URING,
                },
            ),
            (o(Opcode::Destroy), vec![], vec![], Op::Destroy),
            (
                o(Opcode::Lookup),
                vec![],
                b"hello\0".to_vec(),
                Op::Lookup { name: b"hello" },
            ),
            (
                o(Opcode::Forget),
                ForgetIn { nlookup: 3 }.as_bytes().to_vec(),
                vec![],
                Op::Forget { nlookup: 3 },
            ),
            (
                o(Opcode::BatchForget),
                BatchForgetIn { count: 3, dummy: 0 }.as_bytes().to_vec(),
                forgets.to_vec(),
                Op::BatchForget {
                    nodes: ForgetList { bytes: forgets },
                },
            ),
            (
                o(Opcode::Getattr),
                GetattrIn {
                    getattr_flags: FUSE_GETATTR_FH,
                    dummy: 0,
                    fh: 42,
                }
                .as_bytes()
                .to_vec(),
                vec![],
                Op::Getattr { fh: Some(42) },
            ),
            (
                o(Opcode::Setattr),
                setattr.as_bytes().to_vec(),
                vec![],
                Op::Setattr(setattr),
            ),
            (o(Opcode::Readlink), vec![], vec![], Op::Readlink),
            (
                o(Opcode::Symlink),
                vec![],
                b"link\0/some/target\0".to_vec(),
                Op::Symlink {
                    name: b"link",
                    target: b"/some/target",
                },
            ),
            (
                o(Opcode::Mknod),
                MknodIn {
                    mode: 0o10644,
                    rdev: 0x0801,
                    umask: 0o22,
                    padding: 0,
                }
                .as_bytes()
                .to_vec(),
                b"fifo\0".to_vec(),
                Op::Mknod {
                    name: b"fifo",
                    mode: 0o10644,
                    rdev: 0x0801,
                    umask: 0o22,
                },
            ),
            (
                o(Opcode::Mkdir),
                MkdirIn {
                    mode: 0o755,
                    umask: 0o22,
                }
                .as_bytes()
                .to_vec(),
                b"dir\0".to_vec(),
                Op::Mkdir {
                    name: b"dir",
                    mode: 0o755,
                    umask: 0o22,
                },
            ),
            (
                o(Opcode::Unlink),
                vec![],
                b"f\0".to_vec(),
                Op::Unlink { name: b"f" },
            ),
            (
                o(Opcode::Rmdir),
                vec![],
                b"d\0".to_vec(),
                Op::Rmdir { name: b"d" },
            ),
            (
                o(Opcode::Rename),
                RenameIn { newdir: 5 }.as_bytes().to_vec(),
                b"a\0bb\0".to_vec(),
                Op::Rename {
                    newdir: 5,
                    name: b"a",
                    newname: b"bb",
                    flags: 0,
                },
            ),
            (
                o(Opcode::Rename2),
                Rename2In {
                    newdir: 6,
                    flags: RENAME_EXCHANGE,
                    padding: 0,
                }
                .as_bytes()
                .to_vec(),
                b"x\0y\0".to_vec(),
                Op::Rename {
                    newdir: 6,
                    name: b"x",
                    newname: b"y",
                    flags: RENAME_EXCHANGE,
                },
            ),
            (
                o(Opcode::Link),
                LinkIn { oldnodeid: 99 }.as_bytes().to_vec(),
                b"hard\0".to_vec(),
                Op::Link {
                    oldnodeid: 99,
                    newname: b"hard",
                },
            ),
            (
                o(Opcode::Open),
                OpenIn {
                    flags: 0o100002,
                    open_flags: 0,
                }
                .as_bytes()
                .to_vec(),
                vec![],
                Op::Open { flags: 0o100002 },
            ),
            (
                o(Opcode::Read),
                read_in.as_bytes().to_vec(),
                vec![],
                Op::Read {
                    fh: 3,
                    offset: 4096,
                    size: 8192,
                    flags: 2,
                },
            ),
            (
                o(Opcode::Write),
                write_in.as_bytes().to_vec(),
                b"abcde".to_vec(),
                Op::Write {
                    fh: 3,
                    offset: 10,
                    data: b"abcde",
                    write_flags: FUSE_WRITE_CACHE,
                    flags: 0o2,
                },
            ),
            (o(Opcode::Statfs), vec![], vec![], Op::Statfs),
            (
                o(Opcode::Release),
                ReleaseIn {
                    fh: 8,
                    flags: 1,
                    release_flags: FUSE_RELEASE_FLUSH,
                    lock_owner: 1,
                }
                .as_bytes()
                .to_vec(),
                vec![],
                Op::Release {
                    fh: 8,
                    flags: 1,
                    release_flags: FUSE_RELEASE_FLUSH,
                },
            ),
            (
                o(Opcode::Fsync),
                FsyncIn {
                    fh: 8,
                    fsync_flags: FUSE_FSYNC_FDATASYNC,
                    padding: 0,
                }
                .as_bytes()
                .to_vec(),
                vec![],
                Op::Fsync {
                    fh: 8,
                    datasync: true,
                },
            ),
            (
                o(Opcode::Setxattr),
                SetxattrIn { size: 3, flags: 1 }.as_bytes().to_vec(),
                b"user.k\0v\0w".to_vec(),
                Op::Setxattr {
                    name: b"user.k",
                    value: b"v\0w",
                    flags: 1,
                },
            ),
            (
                o(Opcode::Getxattr),
                GetxattrIn {
                    size: 64,
                    padding: 0,
                }
                .as_bytes()
                .to_vec(),
                b"user.k\0".to_vec(),
                Op::Getxattr {
                    name: b"user.k",
                    size: 64,
                },
            ),
            (
                o(Opcode::Listxattr),
                GetxattrIn {
                    size: 0,
                    padding: 0,
                }
                .as_bytes()
                .to_vec(),
                vec![],
                Op::Listxattr { size: 0 },
            ),
            (
                o(Opcode::Removexattr),
                vec![],
                b"user.k\0".to_vec(),
                Op::Removexattr { name: b"user.k" },
            ),
            (
                o(Opcode::Flush),
                FlushIn {
                    fh: 12,
                    unused: 0,
                    padding: 0,
                    lock_owner: 5,
                }
                .as_bytes()
                .to_vec(),
                vec![],
                Op::Flush { fh: 12 },
            ),
            (
                o(Opcode::Opendir),
                OpenIn {
                    flags: 0o200000,
                    open_flags: 0,
                }
                .as_bytes()
                .to_vec(),
                vec![],
                Op::Opendir { flags: 0o200000 },
            ),
            (
                o(Opcode::Readdir),
                read_in.as_bytes().to_vec(),
                vec![],
                Op::Readdir {
                    fh: 3,
                    offset: 4096,
                    size: 8192,
                },
            ),
            (
                o(Opcode::Releasedir),
                ReleaseIn {
                    fh: 13,
                    ..Default::default()
                }
                .as_bytes()
                .to_vec(),
                vec![],
                Op::Releasedir { fh: 13 },
            ),
            (
                o(Opcode::Fsyncdir),
                FsyncIn {
                    fh: 14,
                    fsync_flags: 0,
                    padding: 0,
                }
                .as_bytes()
                .to_vec(),
                vec![],
                Op::Fsyncdir {
                    fh: 14,
                    datasync: false,
                },
            ),
            (
                o(Opcode::Access),
                AccessIn {
                    mask: 4,
                    padding: 0,
                }
                .as_bytes()
                .to_vec(),
                vec![],
                Op::Access { mask: 4 },
            ),
            (
                o(Opcode::Create),
                CreateIn {
                    flags: 0o101,
                    mode: 0o100644,
                    umask: 0o22,
                    open_flags: 0,
                }
                .as_bytes()
                .to_vec(),
                b"new\0".to_vec(),
                Op::Create {
                    name: b"new",
                    flags: 0o101,
                    mode: 0o100644,
                    umask: 0o22,
                },
            ),
            (
                o(Opcode::Interrupt),
                InterruptIn { unique: 17 }.as_bytes().to_vec(),
                vec![],
                Op::Interrupt { unique: 17 },
            ),
            (
                o(Opcode::Fallocate),
                FallocateIn {
                    fh: 1,
                    offset: 2,
                    length: 3,
                    mode: 1,
                    padding: 0,
                }
                .as_bytes()
                .to_vec(),
                vec![],
                Op::Fallocate {
                    fh: 1,
                    offset: 2,
                    length: 3,
                    mode: 1,
                },
            ),
            (
                o(Opcode::Readdirplus),
                read_in.as_bytes().to_vec(),
                vec![],
                Op::Readdirplus {
                    fh: 3,
                    offset: 4096,
                    size: 8192,
                },
            ),
            (
                o(Opcode::Lseek),
                LseekIn {
                    fh: 2,
                    offset: 100,
                    whence: 3,
                    padding: 0,
                }
                .as_bytes()
                .to_vec(),
                vec![],
                Op::Lseek {
                    fh: 2,
                    offset: 100,
                    whence: 3,
                },
            ),
            (
                o(Opcode::CopyFileRange),
                cfr.as_bytes().to_vec(),
                vec![],
                Op::CopyFileRange {
                    fh_in: 1,
                    off_in: 2,
                    nodeid_out: 3,
                    fh_out: 4,
                    off_out: 5,
                    len: 1 << 33,
                    flags: 0,
                    wide: false,
                },
            ),
            (
                o(Opcode::CopyFileRange64),
                cfr.as_bytes().to_vec(),
                vec![],
                Op::CopyFileRange {
                    fh_in: 1,
                    off_in: 2,
                    nodeid_out: 3,
                    fh_out: 4,
                    off_out: 5,
                    len: 1 << 33,
                    flags: 0,
                    wide: true,
                },
            ),
            (
                o(Opcode::Statx),
                StatxIn {
                    getattr_flags: 0,
                    reserved: 0,
                    fh: 5,
                    sx_flags: 0x800,
                    sx_mask: 0x7ff,
                }
                .as_bytes()
                .to_vec(),
                vec![],
                Op::Statx {
                    fh: None,
                    sx_flags: 0x800,
                    sx_mask: 0x7ff,
                },
            ),
            (
                o(Opcode::Getlk),
                LkIn::default().as_bytes().to_vec(),
                vec![],
                Op::Unknown {
                    opcode: o(Opcode::Getlk),
                },
            ),
            (
                o(Opcode::Tmpfile),
                CreateIn {
                    flags: 0o100002,
                    mode: 0o100600,
                    umask: 0o22,
                    open_flags: 0,
                }
                .as_bytes()
                .to_vec(),
                b"/\0".to_vec(),
                Op::Tmpfile {
                    flags: 0o100002,
                    mode: 0o100600,
                    umask: 0o22,
                },
            ),
            (
                1000,
                vec![],
                b"whatever".to_vec(),
                Op::Unknown { opcode: 1000 },
            ),
        ]
    }

    #[test]
    fn every_opcode_decodes_to_its_fields() {
        for (opcode, op_in, payload, want) in cases() {
            assert_eq!(
                op_in.len(),
                op_in_size(opcode),
                "op_in size for {}",
                opcode_name(opcode)
            );
            let m = msg(opcode, &op_in, &payload);
            let req = decode(&m).unwrap_or_else(|e| panic!("{}: {e}", opcode_name(opcode)));
            assert_eq!(req.op, want, "{}", opcode_name(opcode));
            assert_eq!(
                req.header,
                Header {
                    len: m.len() as u32,
                    opcode,
                    unique: UNIQUE,
                    nodeid: NODE,
                    uid: 1000,
                    gid: 100,
                    pid: 4242
                }
            );
        }
    }

    #[test]
    fn batch_forget_iterates_pairs() {
        let (_, op_in, payload, _) = cases()
            .into_iter()
            .find(|c| c.0 == Opcode::BatchForget as u32)
            .unwrap();
        let m = msg(Opcode::BatchForget as u32, &op_in, &payload);
        let Operation::BatchForget { nodes } = decode(&m).unwrap().op else {
            panic!()
        };
        assert_eq!(nodes.len(), 3);
        assert!(!nodes.is_empty());
        let v: Vec<(u64, u64)> = nodes.into_iter().collect();
        assert_eq!(v, vec![(10, 1), (11, 2), (12, 300)]);
    }

    #[test]
    fn every_truncation_is_an_error() {
        for (opcode, op_in, payload, _) in cases() {
            if matches!(
                Opcode::from_u32(opcode),
                None | Some(Opcode::Getlk | Opcode::Tmpfile)
            ) {
                continue; // not parsed: anything after the header is accepted
            }
            let m = msg(opcode, &op_in, &payload);
            for cut in 0..m.len() {
                // As read: header.len no longer matches.
                let e = decode(&m[..cut]).unwrap_err();
                assert_eq!(e.errno, Errno::EIO);
                if cut < IN_HEADER_SIZE {
                    assert_eq!(e.unique, None);
                    continue;
                }
                // Consistent header.len: the argument parser itself must refuse.
                let mut t = m[..cut].to_vec();
                set_len(&mut t);
                if opcode == Opcode::Init as u32 && cut == IN_HEADER_SIZE + FUSE_COMPAT_INIT_IN_SIZE
                {
                    // The pre-7.36 16-byte INIT is a legal message.
                    let Operation::Init { minor, flags, .. } = decode(&t).unwrap().op else {
                        panic!()
                    };
                    assert_eq!((minor, flags), (45, FUSE_ASYNC_READ | FUSE_INIT_EXT));
                    continue;
                }
                let e = decode(&t).unwrap_err();
                assert_eq!(
                    e.errno,
                    Errno::EINVAL,
                    "{} cut at {cut}",
                    opcode_name(opcode)
                );
                assert_eq!(e.unique, expects_reply(opcode).then_some(UNIQUE));
            }
        }
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        for (opcode, op_in, payload, _) in cases() {
            if matches!(
                Opcode::from_u32(opcode),
                None | Some(Opcode::Getlk | Opcode::Tmpfile)
            ) {
                continue;
            }
            let mut p = payload.clone();
            p.push(b'z');
            let m = msg(opcode, &op_in, &p);
            assert!(decode(&m).is_err(), "{}", opcode_name(opcode));
        }
    }

    #[test]
    fn split_equals_contiguous() {
        for (opcode, op_in, payload, _) in cases() {
            let m = msg(opcode, &op_in, &payload);
            let whole = decode(&m).unwrap();
            let (hdr, rest) = m.split_at(IN_HEADER_SIZE);
            let (oi, pl) = rest.split_at(op_in_size(opcode));
            assert_eq!(
                decode_parts(hdr, oi, pl).unwrap(),
                whole,
                "{}",
                opcode_name(opcode)
            );
            // Ring areas passed whole: 128-byte in_out, 128-byte op_in.
            let mut in_out = [0u8; FUSE_URING_IN_OUT_HEADER_SZ];
            in_out[..IN_HEADER_SIZE].copy_from_slice(hdr);
            let mut op_area = [0xaau8; FUSE_URING_OP_IN_OUT_SZ];
            op_area[..oi.len()].copy_from_slice(oi);
            if opcode != Opcode::Init as u32 {
                assert_eq!(decode_parts(&in_out, &op_area, pl).unwrap(), whole);
            }
            // A short op_in is refused.
            if !oi.is_empty() {
                assert!(decode_parts(hdr, &oi[..oi.len() - 1], pl).is_err());
            }
        }
    }

    #[test]
    fn header_errors() {
        assert_eq!(decode(&[]).unwrap_err().unique, None);
        let mut m = msg(Opcode::Getattr as u32, &[0; 16], &[]);
        m.push(0);
        let e = decode(&m).unwrap_err();
        assert_eq!((e.unique, e.errno), (Some(UNIQUE), Errno::EIO));
        // No-reply opcodes never produce an answerable error.
        let m = msg(Opcode::Forget as u32, &[0; 4], &[]);
        assert_eq!(decode(&m).unwrap_err().unique, None);
        assert!(decode_parts(&[0; 39], &[], &[]).is_err());
        assert!(!DecodeError {
            unique: None,
            errno: Errno::EIO,
            why: "x"
        }
        .to_string()
        .is_empty());
    }

    #[test]
    fn names_need_nul_and_content() {
        for payload in [&b"\0"[..], b"abc", b"", b"\0abc\0"] {
            let m = msg(Opcode::Lookup as u32, &[], payload);
            assert_eq!(decode(&m).unwrap_err().errno, Errno::EINVAL);
        }
        let m = msg(Opcode::Symlink as u32, &[], b"a\0\0");
        assert!(decode(&m).is_err(), "empty symlink target");
    }

    #[test]
    fn extensions_are_stripped() {
        let payload = b"name\0\x08\0\0\0\x20\0\0\0";
        let mut m = msg(Opcode::Lookup as u32, &[], payload);
        assert!(decode(&m).is_err());
        m[36..38].copy_from_slice(&1u16.to_ne_bytes());
        assert_eq!(decode(&m).unwrap().op, Operation::Lookup { name: b"name" });
        m[36..38].copy_from_slice(&9u16.to_ne_bytes());
        assert_eq!(decode(&m).unwrap_err().errno, Errno::EINVAL);
    }

    #[test]
    fn write_size_must_match() {
        let w = WriteIn {
            size: 4,
            ..Default::default()
        };
        let m = msg(Opcode::Write as u32, w.as_bytes(), b"abc");
        assert_eq!(decode(&m).unwrap_err().errno, Errno::EINVAL);
        let m = msg(Opcode::Write as u32, w.as_bytes(), b"abcde");
        assert_eq!(decode(&m).unwrap_err().errno, Errno::EINVAL);
    }

    #[test]
    fn init_without_ext_ignores_flags2() {
        let i = InitIn {
            major: 7,
            minor: 45,
            flags: 1,
            flags2: 0xffff,
            ..Default::default()
        };
        let m = msg(Opcode::Init as u32, i.as_bytes(), &[]);
        let Operation::Init { flags, .. } = decode(&m).unwrap().op else {
            panic!()
        };
        assert_eq!(flags, 1);
    }

    #[test]
    fn op_in_sizes_of_the_ring_examples() {
        // kernel-notes §3: GETATTR op_in is 16 bytes, LOOKUP's is empty.
        assert_eq!(op_in_size(Opcode::Getattr as u32), 16);
        assert_eq!(op_in_size(Opcode::Lookup as u32), 0);
        assert_eq!(op_in_size(Opcode::Setxattr as u32), 8);
        assert_eq!(op_in_size(12345), 0);
        for op in Opcode::ALL {
            assert!(op_in_size(op as u32) <= FUSE_URING_OP_IN_OUT_SZ);
        }
    }

    /// Messages with a valid header for a random (mostly known) opcode and random body.
    fn arb_message() -> impl Strategy<Value = Vec<u8>> {
        (
            0u32..60,
            prop::collection::vec(any::<u8>(), 0..200),
            0u16..4,
            any::<bool>(),
        )
            .prop_map(|(opcode, body, extlen, good_len)| {
                let len = IN_HEADER_SIZE + body.len();
                let h = header(opcode, if good_len { len } else { len ^ 1 }, extlen);
                let mut m = h.as_bytes().to_vec();
                m.extend_from_slice(&body);
                m
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes);
            let a = bytes.len() / 3;
            let _ = decode_parts(&bytes[..a], &bytes[a..2 * a], &bytes[2 * a..]);
        }

        #[test]
        fn random_bodies_never_panic(m in arb_message(), split in 0usize..300) {
            let _ = decode(&m);
            let rest = &m[IN_HEADER_SIZE..];
            let s = split.min(rest.len());
            let _ = decode_parts(&m[..IN_HEADER_SIZE], &rest[..s], &rest[s..]);
        }

        #[test]
        fn random_truncations_never_panic(case in 0usize..43, cut in 0usize..400, fix in any::<bool>()) {
            let all = cases();
            let (opcode, op_in, payload, _) = &all[case % all.len()];
            let m = msg(*opcode, op_in, payload);
            let mut t = m[..cut.min(m.len())].to_vec();
            if fix && t.len() >= 4 {
                set_len(&mut t);
            }
            let _ = decode(&t);
        }
    }
}
