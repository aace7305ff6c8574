//! Reply encoding: `fuse_out_header` and the bodies that follow it.
//!
//! A transport writes `out_header(unique, error, body.len()) ++ body` in one `writev` (classic)
//! or puts the header in the ring entry's `in_out` area and the body in its payload buffer.
//! Notifications (server → kernel, unique 0) are whole messages and go to /dev/fuse only.

use crate::abi::{
    self, FUSE_NOTIFY_DELETE, FUSE_NOTIFY_INC_EPOCH, FUSE_NOTIFY_INVAL_ENTRY,
    FUSE_NOTIFY_INVAL_INODE, FUSE_NOTIFY_PRUNE,
};
use crate::errno::Errno;
use core::mem::size_of;
use zerocopy::IntoBytes;

/// Size of `fuse_out_header`.
pub const OUT_HEADER_SIZE: usize = size_of::<abi::OutHeader>();

/// The kernel rejects reply errors `<= -ERESTARTSYS` (512) with EINVAL.
const MAX_REPLY_ERRNO: i32 = 511;

/// The 16-byte `fuse_out_header` for a reply (or, with `unique` 0 and a notify code in `error`,
/// a notification) whose body is `body_len` bytes. `error` is 0 or a negative errno.
/// A length beyond u32 saturates (the kernel then refuses the reply; no caller should get there:
/// replies are bounded by max_write / the read size).
pub fn out_header(unique: u64, error: i32, body_len: usize) -> [u8; OUT_HEADER_SIZE] {
    let len = OUT_HEADER_SIZE
        .checked_add(body_len)
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(u32::MAX);
    let h = abi::OutHeader { len, error, unique };
    zerocopy::transmute!(h)
}

/// What to send back for a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Send nothing: FORGET, BATCH_FORGET, INTERRUPT.
    None,
    /// A header-only reply with `error = -errno`.
    Error(Errno),
    /// Success: the body after the header (may be empty, e.g. UNLINK, RELEASE, FLUSH).
    Data(Vec<u8>),
}

impl Reply {
    /// Hand the body to the buffer pool once a transport has copied it out (a large READ's
    /// buffer is then reused instead of mapped afresh).
    pub fn recycle(self) {
        if let Reply::Data(d) = self {
            crate::memory::pool::buffers().give(d);
        }
    }

    /// Success with an empty body.
    pub fn empty() -> Reply {
        Reply::Data(Vec::new())
    }

    /// The `error` field: 0, or `-errno`. An errno outside 1..=511 (which the kernel would
    /// refuse, leaving the caller hanging) is sent as EIO.
    pub fn error_code(&self) -> i32 {
        match self {
            Reply::None | Reply::Data(_) => 0,
            Reply::Error(e) if (1..=MAX_REPLY_ERRNO).contains(&e.0) => -e.0,
            Reply::Error(_) => -libc::EIO,
        }
    }

    /// The body (empty for `None` and `Error`).
    pub fn body(&self) -> &[u8] {
        match self {
            Reply::Data(d) => d,
            Reply::None | Reply::Error(_) => &[],
        }
    }

    /// The out header to send before [`Reply::body`]; `None` means send nothing at all.
    pub fn header(&self, unique: u64) -> Option<[u8; OUT_HEADER_SIZE]> {
        match self {
            Reply::None => None,
            _ => Some(out_header(unique, self.error_code(), self.body().len())),
        }
    }

    /// Header and body in one buffer (tests, simple transports).
    pub fn to_message(&self, unique: u64) -> Option<Vec<u8>> {
        let h = self.header(unique)?;
        let mut m = Vec::with_capacity(h.len() + self.body().len());
        m.extend_from_slice(&h);
        m.extend_from_slice(self.body());
        Some(m)
    }
}

impl From<Errno> for Reply {
    fn from(e: Errno) -> Self {
        Reply::Error(e)
    }
}

// ------------------------------------------------------------------------------------------
// Bodies
// ------------------------------------------------------------------------------------------

/// LOOKUP, MKNOD, MKDIR, SYMLINK, LINK.
pub fn entry(e: &abi::EntryOut) -> Vec<u8> {
    e.as_bytes().to_vec()
}

/// GETATTR, SETATTR.
pub fn attr(a: &abi::AttrOut) -> Vec<u8> {
    a.as_bytes().to_vec()
}

/// STATX.
pub fn statx(s: &abi::StatxOut) -> Vec<u8> {
    s.as_bytes().to_vec()
}

/// INIT.
pub fn init(i: &abi::InitOut) -> Vec<u8> {
    i.as_bytes().to_vec()
}

/// OPEN, OPENDIR.
pub fn open(o: &abi::OpenOut) -> Vec<u8> {
    o.as_bytes().to_vec()
}

/// CREATE: `fuse_entry_out` then `fuse_open_out`.
pub fn create(e: &abi::EntryOut, o: &abi::OpenOut) -> Vec<u8> {
    let mut v = Vec::with_capacity(size_of::<abi::EntryOut>() + size_of::<abi::OpenOut>());
    v.extend_from_slice(e.as_bytes());
    v.extend_from_slice(o.as_bytes());
    v
}

/// WRITE, and COPY_FILE_RANGE (the 32-bit form): bytes written.
pub fn write(size: u32) -> Vec<u8> {
    abi::WriteOut { size, padding: 0 }.as_bytes().to_vec()
}

/// COPY_FILE_RANGE_64: bytes copied.
pub fn copy_file_range_64(bytes_copied: u64) -> Vec<u8> {
    abi::CopyFileRangeOut { bytes_copied }.as_bytes().to_vec()
}

/// STATFS.
pub fn statfs(st: &abi::Kstatfs) -> Vec<u8> {
    abi::StatfsOut { st: *st }.as_bytes().to_vec()
}

/// GETXATTR / LISTXATTR size probe (request size 0): the size the value / list needs.
pub fn xattr_size(size: u32) -> Vec<u8> {
    abi::GetxattrOut { size, padding: 0 }.as_bytes().to_vec()
}

/// LSEEK: the resulting offset.
pub fn lseek(offset: u64) -> Vec<u8> {
    abi::LseekOut { offset }.as_bytes().to_vec()
}

// ------------------------------------------------------------------------------------------
// Directory buffers
// ------------------------------------------------------------------------------------------

fn push_record(buf: &mut Vec<u8>, max: usize, head: &[u8], name: &[u8]) -> bool {
    let unpadded = head.len() + name.len();
    let rec = abi::rec_align(unpadded);
    match buf.len().checked_add(rec) {
        Some(end) if end <= max => {
            buf.extend_from_slice(head);
            buf.extend_from_slice(name);
            buf.resize(end, 0);
            true
        }
        _ => false,
    }
}

/// READDIR reply body: `fuse_dirent` records (24-byte head, name without NUL, zero padding to
/// 8 bytes), at most `max` bytes (the request's `size`).
///
/// `off` of each entry is the offset of the *next* entry (what a later READDIR passes to
/// resume). Stop at the first `push` that returns false: that entry must come first in the
/// next READDIR.
#[derive(Clone, Debug, Default)]
pub struct DirBuf {
    buf: Vec<u8>,
    max: usize,
}

impl DirBuf {
    pub fn new(max: usize) -> Self {
        DirBuf {
            buf: Vec::with_capacity(max.min(64 * 1024)),
            max,
        }
    }

    /// Append one entry; false (and nothing added) if it does not fit or the name is longer
    /// than u32. `typ` is a DT_* value ([`abi::dt_type`]); `name` must be non-empty without NUL
    /// or '/' (the kernel rejects the whole buffer with EIO otherwise).
    pub fn push(&mut self, ino: u64, off: u64, typ: u32, name: &[u8]) -> bool {
        let Ok(namelen) = u32::try_from(name.len()) else {
            return false;
        };
        let head = abi::Dirent {
            ino,
            off,
            namelen,
            typ,
        };
        push_record(&mut self.buf, self.max, head.as_bytes(), name)
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// READDIRPLUS reply body: `fuse_direntplus` records (128-byte entry_out, 24-byte dirent head,
/// name, zero padding to 8 bytes), at most `max` bytes.
///
/// Each record with a non-zero `entry.nodeid` counts as a LOOKUP for the kernel (it will FORGET
/// it later). The dirent's `ino` is `entry.attr.ino`. Same stopping rule as [`DirBuf`].
#[derive(Clone, Debug, Default)]
pub struct DirPlusBuf {
    buf: Vec<u8>,
    max: usize,
}

impl DirPlusBuf {
    pub fn new(max: usize) -> Self {
        DirPlusBuf {
            buf: Vec::with_capacity(max.min(64 * 1024)),
            max,
        }
    }

    /// Append one entry; false (and nothing added) if it does not fit.
    pub fn push(&mut self, entry: &abi::EntryOut, off: u64, typ: u32, name: &[u8]) -> bool {
        let Ok(namelen) = u32::try_from(name.len()) else {
            return false;
        };
        let head = abi::DirentPlus {
            entry_out: *entry,
            dirent: abi::Dirent {
                ino: entry.attr.ino,
                off,
                namelen,
                typ,
            },
        };
        push_record(&mut self.buf, self.max, head.as_bytes(), name)
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

// ------------------------------------------------------------------------------------------
// Notifications (complete messages: unique 0, error = notify code)
// ------------------------------------------------------------------------------------------

fn notification(code: i32, parts: &[&[u8]]) -> Vec<u8> {
    let body_len: usize = parts.iter().map(|p| p.len()).sum();
    let mut m = Vec::with_capacity(OUT_HEADER_SIZE + body_len);
    m.extend_from_slice(&out_header(0, code, body_len));
    for p in parts {
        m.extend_from_slice(p);
    }
    m
}

fn namelen(name: &[u8]) -> u32 {
    u32::try_from(name.len()).unwrap_or(u32::MAX)
}

/// FUSE_NOTIFY_INVAL_INODE: drop cached attributes of `ino` and its page cache in
/// `off..off+len` (`len` 0 = to the end; `off` negative = attributes only).
pub fn notify_inval_inode(ino: u64, off: i64, len: i64) -> Vec<u8> {
    let body = abi::NotifyInvalInodeOut { ino, off, len };
    notification(FUSE_NOTIFY_INVAL_INODE, &[body.as_bytes()])
}

/// FUSE_NOTIFY_INVAL_ENTRY: drop the dentry `name` under `parent` (`flags`:
/// [`abi::FUSE_EXPIRE_ONLY`] to only expire it).
pub fn notify_inval_entry(parent: u64, name: &[u8], flags: u32) -> Vec<u8> {
    let body = abi::NotifyInvalEntryOut {
        parent,
        namelen: namelen(name),
        flags,
    };
    notification(FUSE_NOTIFY_INVAL_ENTRY, &[body.as_bytes(), name, b"\0"])
}

/// FUSE_NOTIFY_INC_EPOCH (protocol 7.44): every dentry the kernel looked up before this is
/// revalidated (sent to LOOKUP again) at its next use.
pub fn notify_inc_epoch() -> Vec<u8> {
    notification(FUSE_NOTIFY_INC_EPOCH, &[])
}

/// FUSE_NOTIFY_PRUNE (protocol 7.45): drop the unused dentries of `nodes` and evict the
/// inodes nothing else holds, so their next lookup starts from the server's attributes.
pub fn notify_prune(nodes: &[u64]) -> Vec<u8> {
    let head = abi::NotifyPruneOut {
        count: u32::try_from(nodes.len()).unwrap_or(u32::MAX),
        padding: 0,
        spare: 0,
    };
    let ids: Vec<u8> = nodes.iter().flat_map(|n| n.to_ne_bytes()).collect();
    notification(FUSE_NOTIFY_PRUNE, &[head.as_bytes(), &ids])
}

/// FUSE_NOTIFY_DELETE: `name` under `parent` (which was `child`) is gone.
pub fn notify_delete(parent: u64, child: u64, name: &[u8]) -> Vec<u8> {
    let body = abi::NotifyDeleteOut {
        parent,
        child,
        namelen: namelen(name),
        padding: 0,
    };
    notification(FUSE_NOTIFY_DELETE, &[body.as_bytes(), name, b"\0"])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::*;
    use zerocopy::FromBytes;

    #[test]
    fn header_layout() {
        let h = out_header(0xabcd, -libc::ENOENT, 104);
        let o = OutHeader::read_from_bytes(&h).unwrap();
        assert_eq!(
            o,
            OutHeader {
                len: 120,
                error: -libc::ENOENT,
                unique: 0xabcd
            }
        );
        assert_eq!(&h[..4], &120u32.to_ne_bytes());
        assert_eq!(&h[8..], &0xabcdu64.to_ne_bytes());
        assert_eq!(
            OutHeader::read_from_bytes(&out_header(1, 0, usize::MAX))
                .unwrap()
                .len,
            u32::MAX
        );
    }

    #[test]
    fn replies() {
        assert_eq!(Reply::None.header(5), None);
        assert_eq!(Reply::None.to_message(5), None);
        let e = Reply::from(Errno::ENOENT).to_message(5).unwrap();
        assert_eq!(e, out_header(5, -libc::ENOENT, 0).to_vec());
        assert_eq!(Reply::Error(Errno(0)).error_code(), -libc::EIO);
        assert_eq!(Reply::Error(Errno(512)).error_code(), -libc::EIO);
        assert_eq!(Reply::Error(Errno(-2)).error_code(), -libc::EIO);
        let d = Reply::Data(write(7)).to_message(9).unwrap();
        assert_eq!(d.len(), 24);
        assert_eq!(&d[..16], &out_header(9, 0, 8));
        assert_eq!(&d[16..20], &7u32.to_ne_bytes());
        assert_eq!(Reply::empty().to_message(1).unwrap().len(), 16);
    }

    #[test]
    fn body_sizes() {
        assert_eq!(entry(&EntryOut::default()).len(), 128);
        assert_eq!(attr(&AttrOut::default()).len(), 104);
        assert_eq!(statx(&StatxOut::default()).len(), 288);
        assert_eq!(init(&InitOut::default()).len(), 64);
        assert_eq!(open(&OpenOut::default()).len(), 16);
        assert_eq!(create(&EntryOut::default(), &OpenOut::default()).len(), 144);
        assert_eq!(statfs(&Kstatfs::default()).len(), 80);
        assert_eq!(xattr_size(3), [3, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(lseek(1 << 40), (1u64 << 40).to_ne_bytes());
        assert_eq!(copy_file_range_64(5), 5u64.to_ne_bytes());
        let e = EntryOut {
            nodeid: 2,
            generation: 3,
            ..Default::default()
        };
        let o = OpenOut {
            fh: 77,
            open_flags: FOPEN_KEEP_CACHE,
            backing_id: 0,
        };
        let c = create(&e, &o);
        assert_eq!(EntryOut::read_from_bytes(&c[..128]).unwrap(), e);
        assert_eq!(OpenOut::read_from_bytes(&c[128..]).unwrap(), o);
    }

    /// Independent parser of a READDIR body: (ino, off, namelen, typ, name) per record.
    fn parse_dirents(mut b: &[u8]) -> Vec<(u64, u64, u32, u32, Vec<u8>)> {
        let mut out = Vec::new();
        while !b.is_empty() {
            let ino = u64::from_ne_bytes(b[0..8].try_into().unwrap());
            let off = u64::from_ne_bytes(b[8..16].try_into().unwrap());
            let namelen = u32::from_ne_bytes(b[16..20].try_into().unwrap());
            let typ = u32::from_ne_bytes(b[20..24].try_into().unwrap());
            let n = namelen as usize;
            let name = b[24..24 + n].to_vec();
            let rec = (24 + n).div_ceil(8) * 8;
            assert!(b[24 + n..rec].iter().all(|&x| x == 0), "padding is zero");
            out.push((ino, off, namelen, typ, name));
            b = &b[rec..];
        }
        out
    }

    #[test]
    fn dirbuf_layout_and_full() {
        // "." = 25 -> 32, "hello.txt" = 33 -> 40, "12345678" = 32 -> 32.
        let mut d = DirBuf::new(32 + 40 + 32);
        assert!(d.is_empty());
        assert!(d.push(1, 1, libc::DT_DIR as u32, b"."));
        assert!(d.push(5, 2, libc::DT_REG as u32, b"hello.txt"));
        assert_eq!(d.len(), 72);
        assert!(
            !d.push(6, 3, libc::DT_REG as u32, b"123456789"),
            "41 -> 48 does not fit"
        );
        assert_eq!(d.len(), 72, "nothing added");
        assert!(
            d.push(6, 3, libc::DT_LNK as u32, b"12345678"),
            "exactly fills"
        );
        assert!(!d.push(7, 4, libc::DT_REG as u32, b"x"));
        let b = d.into_bytes();
        assert_eq!(b.len(), 104);
        assert_eq!(b.len() % 8, 0);
        assert_eq!(
            parse_dirents(&b),
            vec![
                (1, 1, 1, libc::DT_DIR as u32, b".".to_vec()),
                (5, 2, 9, libc::DT_REG as u32, b"hello.txt".to_vec()),
                (6, 3, 8, libc::DT_LNK as u32, b"12345678".to_vec()),
            ]
        );
        let mut tiny = DirBuf::new(31);
        assert!(!tiny.push(1, 1, 4, b"."));
        assert!(tiny.into_bytes().is_empty());
    }

    #[test]
    fn dirplusbuf_layout_and_full() {
        let e = |ino: u64| EntryOut {
            nodeid: ino,
            generation: 1,
            entry_valid: 1,
            attr_valid: 1,
            attr: Attr {
                ino,
                mode: libc::S_IFREG | 0o644,
                nlink: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        // 152 + 3 = 155 -> 160; 152 + 9 = 161 -> 168.
        let mut d = DirPlusBuf::new(160 + 168);
        assert!(d.push(&e(10), 1, dt_type(libc::S_IFREG), b"abc"));
        assert!(d.push(&e(11), 2, dt_type(libc::S_IFREG), b"123456789"));
        assert!(!d.push(&e(12), 3, dt_type(libc::S_IFREG), b"z"));
        assert_eq!(d.len(), 328);
        assert!(!d.is_empty());
        let b = d.into_bytes();
        assert_eq!(EntryOut::read_from_bytes(&b[..128]).unwrap(), e(10));
        assert_eq!(
            parse_dirents(&b[128..160]),
            vec![(10, 1, 3, libc::DT_REG as u32, b"abc".to_vec())]
        );
        assert_eq!(EntryOut::read_from_bytes(&b[160..288]).unwrap(), e(11));
        assert_eq!(
            parse_dirents(&b[288..]),
            vec![(11, 2, 9, libc::DT_REG as u32, b"123456789".to_vec())]
        );
    }

    #[test]
    fn notifications() {
        let m = notify_inval_inode(5, 0, -1);
        assert_eq!(m.len(), 16 + 24);
        let h = OutHeader::read_from_bytes(&m[..16]).unwrap();
        assert_eq!(
            h,
            OutHeader {
                len: 40,
                error: FUSE_NOTIFY_INVAL_INODE,
                unique: 0
            }
        );
        assert_eq!(
            NotifyInvalInodeOut::read_from_bytes(&m[16..]).unwrap(),
            NotifyInvalInodeOut {
                ino: 5,
                off: 0,
                len: -1
            }
        );

        let m = notify_inval_entry(1, b"name", FUSE_EXPIRE_ONLY);
        let h = OutHeader::read_from_bytes(&m[..16]).unwrap();
        assert_eq!(
            h,
            OutHeader {
                len: 16 + 16 + 5,
                error: FUSE_NOTIFY_INVAL_ENTRY,
                unique: 0
            }
        );
        assert_eq!(
            NotifyInvalEntryOut::read_from_bytes(&m[16..32]).unwrap(),
            NotifyInvalEntryOut {
                parent: 1,
                namelen: 4,
                flags: FUSE_EXPIRE_ONLY
            }
        );
        assert_eq!(&m[32..], b"name\0");

        let m = notify_delete(1, 9, b"gone");
        let h = OutHeader::read_from_bytes(&m[..16]).unwrap();
        assert_eq!(
            h,
            OutHeader {
                len: 16 + 24 + 5,
                error: FUSE_NOTIFY_DELETE,
                unique: 0
            }
        );
        assert_eq!(&m[40..], b"gone\0");
    }
}
