//! The dispatcher: one exhaustive match from a decoded request to the store, and the reply.
//!
//! Every transport thread calls [`Dispatcher::handle`] concurrently; the store serialises
//! mutations on its writer connection and serves reads from per-thread read connections.

mod acl;
mod attr;
mod fills;
pub mod fs;
pub mod guard;
mod privs;
mod refs;
pub mod shards;
mod victims;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::abi;
use crate::errno::Errno;
use crate::knobs::Knobs;
use crate::protocol::{reply, DirBuf, DirPlusBuf, Operation, Reply, Request};
use crate::store::{Caller, Ino, RenameFlags, SetAttr, TimeSet, Timespec};

pub use fs::{Entry, Filesystem};
pub use refs::{Forgotten, LookupRefs};

/// What INIT settled with the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub minor: u32,
    pub max_write: u32,
    pub flags: u64,
}

/// Cache lifetimes the kernel is told.
#[derive(Clone, Copy, Debug)]
struct Ttls {
    entry: Duration,
    attr: Duration,
    negative: Duration,
    /// Kernels before protocol 7.44 cannot be told to revalidate every cached name after an
    /// external change (FUSE_NOTIFY_INC_EPOCH, `transport::watch`): their entries are capped
    /// at this once the handshake says so.
    entry_without_epoch: Duration,
}

impl Ttls {
    /// The database has one server, and the watcher tells the kernel about every change made
    /// behind the mount, so the kernel may trust its caches for long. A base directory's
    /// changes are not watched: over one, every timeout is capped by the base timeout.
    fn from_knobs(knobs: &Knobs, based: bool) -> Ttls {
        let base = Duration::from_millis(knobs.fuse_base_ttl_ms);
        let cap = |d: Duration| if based { d.min(base) } else { d };
        let entry = cap(Duration::from_millis(knobs.fuse_entry_ttl_ms));
        Ttls {
            entry,
            attr: cap(Duration::from_millis(knobs.fuse_attr_ttl_ms)),
            negative: cap(Duration::from_millis(knobs.fuse_negative_ttl_ms)),
            entry_without_epoch: entry.min(base),
        }
    }
}

/// Routes requests to the filesystem layer and keeps the kernel's lookup references.
pub struct Dispatcher {
    fs: Arc<dyn Filesystem>,
    refs: LookupRefs,
    /// Inodes that just lost one of several names (see `victims`).
    victims: victims::RecentVictims,
    ttl: Ttls,
    knobs: Knobs,
    /// Set once by INIT, before any other request is served.
    negotiated: OnceLock<Negotiated>,
    /// Open fills of the kernel's listing cache (zero-message opendir only).
    fills: Option<fills::Fills>,
    /// Sends a notification to the kernel; set by the session once the channel exists.
    notifier: OnceLock<Notifier>,
    /// The test-only fault hook (see [`Dispatcher::fault`]); None when the knob is empty.
    fault_panic: Option<String>,
    /// The owner every inode is shown with and every new inode gets (see
    /// [`Dispatcher::set_owner`]); None: the stored owners and the caller's ids.
    owner: OnceLock<Caller>,
    /// The sandbox's fence inside the project (see `guard`); None: nothing refused by path.
    guard: OnceLock<Arc<guard::Guard>>,
    /// Set once a request was answered with ENOSPC and the database marked full (see
    /// [`crate::store::space::mark_full`]).
    full: std::sync::atomic::AtomicBool,
}

/// Writes one complete notification message to the kernel.
pub type Notifier = Box<dyn Fn(&[u8]) + Send + Sync>;

fn name_ok(name: &[u8]) -> Result<&[u8], Errno> {
    if name.len() > 255 {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(name)
}

impl Dispatcher {
    pub fn new(fs: Arc<dyn Filesystem>, knobs: &Knobs) -> Self {
        let ttl = Ttls::from_knobs(knobs, fs.has_base());
        Self {
            fs,
            refs: LookupRefs::default(),
            victims: victims::RecentVictims::default(),
            ttl,
            knobs: knobs.clone(),
            negotiated: OnceLock::new(),
            fills: knobs.fuse_noopendir.then(fills::Fills::default),
            notifier: OnceLock::new(),
            fault_panic: Some(knobs.fault_panic.clone()).filter(|f| !f.is_empty()),
            owner: OnceLock::new(),
            guard: OnceLock::new(),
            full: Default::default(),
        }
    }

    /// Show every inode as owned by `owner` and give it every new inode, whoever asks (a
    /// sandbox: the command's ids as its mount's user namespace maps them, see
    /// docs/sandbox.md). Set once, before the connection is served.
    pub fn set_owner(&self, owner: Caller) {
        let _ = self.owner.set(owner);
    }

    /// Refuse, by path, what `g` refuses (a sandbox whose writable set does not cover the
    /// project, or its symlink rule). Set once, before the connection is served.
    pub fn set_guard(&self, g: Arc<guard::Guard>) {
        let _ = self.guard.set(g);
    }

    fn owner(&self) -> Option<Caller> {
        self.owner.get().copied()
    }

    /// Install the sender of notifications (once; later calls are ignored).
    pub fn set_notifier(&self, n: Notifier) {
        let _ = self.notifier.set(n);
    }

    /// The entries of these directories changed (see [`fills`]).
    fn listed_changed(&self, dirs: &[Ino]) {
        if let Some(f) = &self.fills {
            for d in dirs {
                f.changed(*d);
            }
        }
    }

    /// A READDIR(PLUS) of `dir` at `offset`, answered by `read`, as a step of a fill of the
    /// kernel's listing cache: offset 0 begins one, an empty reply ends it (see [`fills`]).
    fn listing(
        &self,
        dir: Ino,
        offset: u64,
        read: impl FnOnce() -> Result<Reply, Errno>,
    ) -> Result<Reply, Errno> {
        let Some(f) = &self.fills else {
            return read();
        };
        if offset == 0 {
            f.begin(dir);
        }
        let out = read();
        if matches!(&out, Ok(Reply::Data(d)) if d.is_empty()) && f.end(dir) {
            if let Some(n) = self.notifier.get() {
                n(&reply::notify_inval_inode(dir.0, 0, 0));
            }
        }
        out
    }

    /// The inodes the kernel may cache (the root and every referenced inode): the ones to
    /// invalidate after another process changed the database.
    pub fn kernel_inodes(&self) -> Vec<Ino> {
        let mut v = self.refs.referenced();
        v.push(Ino::ROOT);
        v
    }

    /// Another process changed the database: take over the orphans it left (see
    /// [`Filesystem::adopt_orphans`]).
    pub fn adopt_orphans(&self) -> Result<(), Errno> {
        self.fs.adopt_orphans(&self.refs)
    }

    /// Whether the kernel caches writes (then it, not the store, knows the latest file bytes
    /// until it writes them back).
    fn writeback_cache(&self) -> bool {
        self.negotiated
            .get()
            .is_some_and(|n| n.flags & abi::FUSE_WRITEBACK_CACHE != 0)
    }

    /// Whether the server clears set-id bits (see `privs`).
    fn killpriv(&self) -> bool {
        self.negotiated
            .get()
            .is_some_and(|n| n.flags & abi::FUSE_HANDLE_KILLPRIV_V2 != 0)
    }

    /// Answer INIT: take the intersection of what the kernel offers and what we want.
    /// `ring`: the io_uring queues are ready, so FUSE_OVER_IO_URING may be requested.
    pub fn init(
        &self,
        major: u32,
        minor: u32,
        max_readahead: u32,
        offered: u64,
        ring: bool,
    ) -> (Reply, Option<Negotiated>) {
        if major != 7 {
            // A newer major: answer with ours so the kernel can retry or give up.
            let out = abi::InitOut {
                major: 7,
                minor: abi::FUSE_KERNEL_MINOR_VERSION,
                ..Default::default()
            };
            return (Reply::Data(reply::init(&out)), None);
        }
        if minor < abi::FUSE_MIN_MINOR_VERSION {
            tracing::error!(
                "kernel FUSE protocol 7.{minor} is too old (need 7.{})",
                abi::FUSE_MIN_MINOR_VERSION
            );
            return (Reply::Error(Errno(libc::EPROTO)), None);
        }
        let k = &self.knobs;
        let mut want = abi::FUSE_ASYNC_READ
            | abi::FUSE_BIG_WRITES
            | abi::FUSE_MAX_PAGES
            | abi::FUSE_PARALLEL_DIROPS
            | abi::FUSE_CACHE_SYMLINKS
            | abi::FUSE_ASYNC_DIO
            | abi::FUSE_DO_READDIRPLUS
            | abi::FUSE_READDIRPLUS_AUTO
            | abi::FUSE_WRITEBACK_CACHE;
        if !k.fuse_readdirplus {
            want &= !(abi::FUSE_DO_READDIRPLUS | abi::FUSE_READDIRPLUS_AUTO);
        }
        if !k.fuse_writeback_cache {
            want &= !abi::FUSE_WRITEBACK_CACHE;
        }
        if k.fuse_killpriv_v2 {
            want |= abi::FUSE_HANDLE_KILLPRIV_V2;
        }
        if ring {
            want |= abi::FUSE_OVER_IO_URING;
        }
        if !k.fuse_parallel_dirops {
            want &= !abi::FUSE_PARALLEL_DIROPS;
        }
        let flags = offered & want;
        let max_write = k.fuse_max_write as u32;
        let max_pages = if flags & abi::FUSE_MAX_PAGES != 0 {
            (max_write / 4096).max(1) as u16
        } else {
            0
        };
        let max_write = if max_pages == 0 {
            max_write.min(128 * 1024)
        } else {
            max_write
        };
        let max_background = crate::memory::Shares::from_knobs(k).max_background(max_write);
        let mut out = abi::InitOut {
            major: 7,
            minor: abi::FUSE_KERNEL_MINOR_VERSION.min(minor),
            max_readahead,
            max_background,
            congestion_threshold: max_background / 4 * 3,
            max_write,
            time_gran: 1,
            max_pages,
            ..Default::default()
        };
        // Bits above 31 travel in flags2, which the kernel reads only with FUSE_INIT_EXT.
        out.set_flags(if flags >> 32 != 0 {
            flags | abi::FUSE_INIT_EXT
        } else {
            flags
        });
        let negotiated = Negotiated {
            minor: out.minor,
            max_write,
            flags,
        };
        let _ = self.negotiated.set(negotiated);
        self.fs
            .store()
            .set_kernel_owns_write_times(flags & abi::FUSE_WRITEBACK_CACHE != 0);
        (Reply::Data(reply::init(&out)), Some(negotiated))
    }

    /// Handle one request. Never panics on bad input: every failure is an errno reply. A panic
    /// while handling it (a bug) is contained here, for every transport and worker: it is
    /// logged with the opcode, the request is answered with EIO, and serving goes on.
    pub fn handle(&self, req: &Request<'_>) -> Reply {
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.fault(req);
            self.serve(req)
        }));
        if matches!(&run, Ok(Reply::Error(e)) if *e == Errno::ENOSPC)
            && !self.full.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            crate::store::space::mark_full(self.fs.store().path());
        }
        run.unwrap_or_else(|payload| {
            let why = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("no message");
            let h = &req.header;
            tracing::error!(
                "request {} ({}, inode {}) panicked: {why}; answered EIO",
                h.unique,
                abi::opcode_name(h.opcode),
                h.nodeid
            );
            match req.op {
                Operation::Forget { .. }
                | Operation::BatchForget { .. }
                | Operation::Interrupt { .. } => Reply::None,
                _ => Reply::Error(Errno::EIO),
            }
        })
    }

    /// The test-only fault hook (`AGENTFS_FAULT_PANIC`): panic when the request's opcode (with
    /// or without its `FUSE_` prefix, any case) or one of its entry names equals the knob.
    fn fault(&self, req: &Request<'_>) {
        let Some(want) = &self.fault_panic else {
            return;
        };
        let op = abi::opcode_name(req.header.opcode);
        let by_op = op.eq_ignore_ascii_case(want)
            || op
                .strip_prefix("FUSE_")
                .is_some_and(|o| o.eq_ignore_ascii_case(want));
        let names: [&[u8]; 2] = match &req.op {
            Operation::Lookup { name }
            | Operation::Mknod { name, .. }
            | Operation::Mkdir { name, .. }
            | Operation::Symlink { name, .. }
            | Operation::Create { name, .. }
            | Operation::Unlink { name }
            | Operation::Rmdir { name } => [name, b""],
            Operation::Link { newname, .. } => [newname, b""],
            Operation::Rename { name, newname, .. } => [name, newname],
            _ => [b"", b""],
        };
        if by_op || names.contains(&want.as_bytes()) {
            panic!("AGENTFS_FAULT_PANIC={want}: injected panic in {op}");
        }
    }

    /// Route one request to the filesystem and build its reply.
    fn serve(&self, req: &Request<'_>) -> Reply {
        let ino = Ino(req.header.nodeid);
        let caller = Caller {
            uid: req.header.uid,
            gid: req.header.gid,
        };
        // Who a new inode belongs to; `caller` itself still tells whether the writer is root.
        let creator = self.owner().unwrap_or(caller);
        if let Some(g) = self.guard.get() {
            if let Err(e) = g.check(self.fs.as_ref(), req) {
                return Reply::Error(e);
            }
        }
        let result = match &req.op {
            Operation::Init { .. } => Err(Errno::EIO),
            Operation::Destroy => {
                if let Err(e) = self.fs.sync() {
                    tracing::error!("final sync at DESTROY failed: {e}");
                }
                Ok(Reply::Data(Vec::new()))
            }
            Operation::Forget { nlookup } => {
                self.fs.forget(&[(ino, *nlookup)], &self.refs);
                Ok(Reply::None)
            }
            Operation::BatchForget { nodes } => {
                let nodes: Vec<(Ino, u64)> = nodes.iter().map(|(n, c)| (Ino(n), c)).collect();
                self.fs.forget(&nodes, &self.refs);
                Ok(Reply::None)
            }
            Operation::Interrupt { .. } => Ok(Reply::None),
            Operation::Lookup { name } => self.lookup(ino, name),
            Operation::Getattr { .. } => self.fs.getattr(ino).map(|a| {
                Reply::Data(reply::attr(&attr::attr_out(
                    &a,
                    self.attr_ttl(ino),
                    self.owner(),
                )))
            }),
            Operation::Setattr(s) => self.setattr(ino, s),
            Operation::Readlink => self.fs.readlink(ino).map(Reply::Data),
            Operation::Symlink { name, target } => name_ok(name)
                .and_then(|n| self.fs.symlink(ino, n, target, creator))
                .map(|a| self.changed_entry(ino, a)),
            Operation::Mknod {
                name, mode, rdev, ..
            } => name_ok(name)
                .and_then(|n| self.fs.mknod(ino, n, *mode, *rdev, creator))
                .map(|a| self.changed_entry(ino, a)),
            Operation::Mkdir { name, mode, .. } => name_ok(name)
                .and_then(|n| self.fs.mkdir(ino, n, *mode, creator))
                .map(|a| self.changed_entry(ino, a)),
            Operation::Unlink { name } => self.fs.unlink(ino, name, &self.refs).map(|kept| {
                if let Some(node) = kept {
                    self.victims.record(node);
                }
                self.listed_changed(&[ino]);
                empty()
            }),
            Operation::Rmdir { name } => self.fs.rmdir(ino, name, &self.refs).map(|_| {
                self.listed_changed(&[ino]);
                empty()
            }),
            Operation::Rename {
                newdir,
                name,
                newname,
                flags,
            } => self.rename(ino, name, Ino(*newdir), newname, *flags),
            Operation::Link { oldnodeid, newname } => name_ok(newname)
                .and_then(|n| self.fs.link(Ino(*oldnodeid), ino, n))
                .map(|a| self.changed_entry(ino, a)),
            // Zero-message opens: after one ENOSYS the kernel opens files (directories) without
            // asking (fh = 0 from then on) and sends no RELEASE (RELEASEDIR). A directory
            // opened that way also gets FOPEN_CACHE_DIR: the kernel caches its listing, which
            // `fills` guards. An answered OPENDIR carries no flag: no kernel listing cache.
            Operation::Open { .. } if self.knobs.fuse_noopen => Err(Errno::ENOSYS),
            Operation::Opendir { .. } if self.knobs.fuse_noopendir => Err(Errno::ENOSYS),
            Operation::Open { .. } => Ok(Reply::Data(reply::open(&self.open_out()))),
            Operation::Opendir { .. } => Ok(Reply::Data(reply::open(&abi::OpenOut::default()))),
            Operation::Flush { .. } if self.knobs.fuse_noflush => Err(Errno::ENOSYS),
            Operation::Create { name, mode, .. } => self.create(ino, name, *mode, creator),
            Operation::Tmpfile { mode, .. } => self.tmpfile(ino, *mode, creator),
            Operation::Read { offset, size, .. } => {
                self.fs.read(ino, *offset, *size).map(Reply::Data)
            }
            Operation::Write {
                offset,
                data,
                write_flags,
                ..
            } => self
                .before_write(ino, write_flags & abi::FUSE_WRITE_KILL_SUIDGID != 0)
                .and_then(|_| self.fs.write(ino, *offset, data))
                .map(|n| Reply::Data(reply::write(n))),
            Operation::Release { .. }
            | Operation::Releasedir { .. }
            | Operation::Flush { .. }
            | Operation::Access { .. } => Ok(empty()),
            // fsync/fdatasync commit this inode's pending writes and end in a real fdatasync
            // of the WAL (which also covers every namespace change committed before).
            Operation::Fsync { .. } | Operation::Fsyncdir { .. } => {
                self.fs.fsync(ino).map(|_| empty())
            }
            // syncfs(2): commit everything pending, then the barrier.
            Operation::Unknown { opcode } if *opcode == abi::Opcode::Syncfs as u32 => {
                self.fs.sync().map(|_| empty())
            }
            Operation::Statfs => self
                .fs
                .statfs()
                .map(|s| Reply::Data(reply::statfs(&attr::kstatfs(&s)))),
            Operation::Setxattr { name, value, flags } if *name == acl::ACCESS => {
                self.set_access_acl(ino, value, *flags)
            }
            Operation::Setxattr { name, value, flags } => {
                self.fs.setxattr(ino, name, value, *flags).map(|_| empty())
            }
            Operation::Getxattr { name, size } => {
                self.fs.getxattr(ino, name).and_then(|v| sized(v, *size))
            }
            Operation::Listxattr { size } => self.fs.listxattr(ino).and_then(|v| sized(v, *size)),
            Operation::Removexattr { name } => self.fs.removexattr(ino, name).map(|_| empty()),
            Operation::Readdir { offset, size, .. } => {
                self.listing(ino, *offset, || self.readdir(ino, *offset, *size))
            }
            Operation::Readdirplus { offset, size, .. } => {
                self.listing(ino, *offset, || self.readdirplus(ino, *offset, *size))
            }
            Operation::Fallocate {
                offset,
                length,
                mode,
                ..
            } => self
                .before_write(ino, caller.uid != 0)
                .and_then(|_| self.fs.fallocate(ino, *offset, *length, *mode))
                .map(|_| empty()),
            // With the writeback cache, dirty pages the kernel has not sent yet are invisible
            // to the chunk map (the kernel does not flush before LSEEK), so a hole we report
            // could hide data. ENOSYS makes the kernel answer from i_size instead: the whole
            // file is data, which is always correct. Without it the chunk map is exact.
            Operation::Lseek { .. } if self.writeback_cache() => Err(Errno::ENOSYS),
            Operation::Lseek { offset, whence, .. } => self
                .fs
                .lseek(ino, *offset, *whence)
                .map(|o| Reply::Data(reply::lseek(o))),
            Operation::CopyFileRange {
                off_in,
                nodeid_out,
                off_out,
                len,
                wide,
                ..
            } => self
                .before_write(Ino(*nodeid_out), caller.uid != 0)
                .and_then(|_| {
                    self.fs
                        .copy_file_range(ino, *off_in, Ino(*nodeid_out), *off_out, *len)
                })
                .map(|n| {
                    Reply::Data(if *wide {
                        reply::copy_file_range_64(n)
                    } else {
                        reply::write(n.min(u32::MAX as u64) as u32)
                    })
                }),
            _ => Err(Errno::ENOSYS),
        };
        result.unwrap_or_else(Reply::Error)
    }

    /// The reply to OPEN and CREATE: no handle state (fh 0), page cache kept across opens
    /// unless the knob says otherwise.
    fn open_out(&self) -> abi::OpenOut {
        abi::OpenOut {
            open_flags: if self.knobs.fuse_keep_cache {
                abi::FOPEN_KEEP_CACHE
            } else {
                0
            },
            ..Default::default()
        }
    }

    /// [`Dispatcher::entry`] for a name just made in `parent`.
    fn changed_entry(&self, parent: Ino, e: Entry) -> Reply {
        self.listed_changed(&[parent]);
        self.entry(e)
    }

    /// An entry reply for a new kernel reference.
    fn entry(&self, e: Entry) -> Reply {
        self.refs.add(e.node, 1);
        Reply::Data(reply::entry(&attr::entry_out(
            &e,
            self.entry_ttl(),
            self.attr_ttl(e.node),
            self.owner(),
        )))
    }

    /// How long the kernel may cache a name: capped when the kernel cannot be told to
    /// revalidate every name it holds.
    fn entry_ttl(&self) -> Duration {
        match self.negotiated.get() {
            Some(n) if n.minor >= crate::transport::watch::INC_EPOCH_MINOR => self.ttl.entry,
            _ => self.ttl.entry_without_epoch,
        }
    }

    /// How long the kernel may cache `ino`'s attributes: not at all right after it lost one of
    /// several names (see `victims`).
    fn attr_ttl(&self, ino: Ino) -> Duration {
        if self.victims.is_recent(ino) {
            Duration::ZERO
        } else {
            self.ttl.attr
        }
    }

    /// Record the target of a successful unlink or rename-over if it still has names.
    fn note_victim(&self, victim: Option<Entry>) {
        if let Some(v) = victim {
            if v.attr.nlink > 1 && v.attr.mode & libc::S_IFMT != libc::S_IFDIR {
                self.victims.record(v.node);
            }
        }
    }

    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Reply, Errno> {
        let name = name_ok(name)?;
        match self.fs.lookup(parent, name) {
            Ok(a) => Ok(self.entry(a)),
            Err(e) if e == Errno::ENOENT && !self.ttl.negative.is_zero() => {
                // A negative entry (node id 0) the kernel may cache.
                Ok(Reply::Data(reply::entry(&attr::negative_entry(
                    self.ttl.negative,
                ))))
            }
            Err(e) => Err(e),
        }
    }

    fn create(&self, parent: Ino, name: &[u8], mode: u32, caller: Caller) -> Result<Reply, Errno> {
        let name = name_ok(name)?;
        let mode = (mode & 0o7777) | libc::S_IFREG;
        let e = self.fs.mknod(parent, name, mode, 0, caller)?;
        self.listed_changed(&[parent]);
        self.refs.add(e.node, 1);
        let entry = attr::entry_out(&e, self.ttl.entry, self.ttl.attr, self.owner());
        Ok(Reply::Data(reply::create(&entry, &self.open_out())))
    }

    /// O_TMPFILE: the unnamed file is an orphan from birth, reaped at its last FORGET unless
    /// a LINK names it first. Its directory's listing does not change.
    fn tmpfile(&self, parent: Ino, mode: u32, caller: Caller) -> Result<Reply, Errno> {
        let e = self.fs.tmpfile(parent, mode & 0o7777, caller)?;
        self.refs.add(e.node, 1);
        crate::store::Liveness::retain_orphan(&self.refs, e.node);
        let entry = attr::entry_out(&e, self.ttl.entry, self.ttl.attr, self.owner());
        Ok(Reply::Data(reply::create(&entry, &self.open_out())))
    }

    /// With HANDLE_KILLPRIV_V2, what the kernel left to us before a file's data changes:
    /// `suidgid` when the writer lacks CAP_FSETID.
    fn before_write(&self, ino: Ino, suidgid: bool) -> Result<(), Errno> {
        if suidgid && self.killpriv() {
            privs::before_write(self.fs.as_ref(), ino)?;
        }
        Ok(())
    }

    fn setattr(&self, ino: Ino, s: &abi::SetattrIn) -> Result<Reply, Errno> {
        let time = |t: Option<abi::SetTime>| {
            t.map(|t| match t {
                abi::SetTime::Now => TimeSet::Now,
                abi::SetTime::At { sec, nsec } => TimeSet::At(Timespec { sec, nsec }),
            })
        };
        let mut mode = s.mode().map(|m| m & 0o7777);
        if s.kill_suidgid() && self.killpriv() {
            let a = self.fs.getattr(ino)?;
            if a.mode & libc::S_IFMT != libc::S_IFDIR {
                let perm = mode.unwrap_or(a.mode & 0o7777);
                if privs::killed(perm) != perm || mode.is_some() {
                    mode = Some(privs::killed(perm));
                }
            }
        }
        let set = SetAttr {
            mode,
            uid: s.uid(),
            gid: s.gid(),
            size: s.size(),
            atime: time(s.atime()),
            mtime: time(s.mtime()),
            ctime: match s.ctime() {
                Some(abi::SetTime::At { sec, nsec }) => Some(Timespec { sec, nsec }),
                _ => None,
            },
        };
        let a = self.fs.setattr(ino, &set)?;
        Ok(Reply::Data(reply::attr(&attr::attr_out(
            &a,
            self.ttl.attr,
            self.owner(),
        ))))
    }

    /// setxattr of an access ACL: it sets the mode (see `acl`).
    fn set_access_acl(&self, ino: Ino, value: &[u8], flags: u32) -> Result<Reply, Errno> {
        let m = acl::parse(value)?;
        let mode = self.fs.getattr(ino)?.mode;
        let set = SetAttr {
            mode: Some((mode & 0o7000) | m.perm),
            uid: None,
            gid: None,
            size: None,
            atime: None,
            mtime: None,
            ctime: None,
        };
        self.fs.setattr(ino, &set)?;
        if m.extended {
            self.fs.setxattr(ino, acl::ACCESS, value, flags)?;
        } else {
            match self.fs.removexattr(ino, acl::ACCESS) {
                Err(e) if e != Errno::ENODATA => return Err(e),
                _ => {}
            }
        }
        Ok(empty())
    }

    fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: u32,
    ) -> Result<Reply, Errno> {
        let name_new = name_ok(newname)?;
        let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE;
        if flags & !known != 0 {
            // RENAME_WHITEOUT and anything newer.
            return Err(Errno::EINVAL);
        }
        let f = RenameFlags {
            noreplace: flags & libc::RENAME_NOREPLACE != 0,
            exchange: flags & libc::RENAME_EXCHANGE != 0,
        };
        if f.noreplace && f.exchange {
            return Err(Errno::EINVAL);
        }
        let victim = if f.exchange {
            None
        } else {
            self.fs.peek(newparent, name_new)
        };
        self.fs
            .rename(parent, name, newparent, name_new, f, &self.refs)?;
        self.note_victim(victim);
        self.listed_changed(&[parent, newparent]);
        Ok(empty())
    }

    fn readdir(&self, ino: Ino, offset: u64, size: u32) -> Result<Reply, Errno> {
        let mut buf = DirBuf::new(size as usize);
        let mut offset = offset;
        loop {
            let batch = self.fs.readdir(ino, offset, 256)?;
            if batch.is_empty() {
                break;
            }
            for e in &batch {
                if !buf.push(e.ino.0, e.offset, attr::dirent_type(e.kind), &e.name) {
                    return Ok(Reply::Data(buf.into_bytes()));
                }
                offset = e.offset;
            }
        }
        Ok(Reply::Data(buf.into_bytes()))
    }

    fn readdirplus(&self, ino: Ino, offset: u64, size: u32) -> Result<Reply, Errno> {
        let mut buf = DirPlusBuf::new(size as usize);
        let mut offset = offset;
        loop {
            let batch = self.fs.readdirplus(ino, offset, 128)?;
            if batch.is_empty() {
                break;
            }
            for (i, (e, ent)) in batch.iter().enumerate() {
                // The kernel takes no reference for "." and ".." or for a record with node id
                // 0, which we also send for a recent victim (see `victims`): the name is
                // listed, its attributes are not applied.
                let unlinked =
                    e.name == b"." || e.name == b".." || self.victims.is_recent(ent.node);
                let out = if unlinked {
                    attr::unlinked_entry(&ent.attr, self.owner())
                } else {
                    attr::entry_out(ent, self.ttl.entry, self.ttl.attr, self.owner())
                };
                if !buf.push(&out, e.offset, attr::dirent_type(e.kind), &e.name) {
                    // The entries not sent (this one and the rest of the batch) carry no
                    // reference after all.
                    for (x, en) in &batch[i..] {
                        if x.name != b"." && x.name != b".." {
                            self.fs.unused(en.node);
                        }
                    }
                    return Ok(Reply::Data(buf.into_bytes()));
                }
                if unlinked {
                    if e.name != b"." && e.name != b".." {
                        self.fs.unused(ent.node);
                    }
                } else {
                    self.refs.add(ent.node, 1);
                }
                offset = e.offset;
            }
        }
        Ok(Reply::Data(buf.into_bytes()))
    }
}

fn empty() -> Reply {
    Reply::Data(Vec::new())
}

/// Reply to GETXATTR/LISTXATTR: the size when asked with size 0, ERANGE when too small.
fn sized(v: Vec<u8>, size: u32) -> Result<Reply, Errno> {
    if size == 0 {
        Ok(Reply::Data(reply::xattr_size(v.len() as u32)))
    } else if v.len() > size as usize {
        Err(Errno::ERANGE)
    } else {
        Ok(Reply::Data(v))
    }
}
