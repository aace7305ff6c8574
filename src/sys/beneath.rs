//! File operations confined to one directory tree: every path is resolved beneath the root
//! with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), so no symlink (and no "..") in any
//! component can lead outside, and the last component is never followed. Used by
//! overlay mounts and `agentfs diff` (reads of the base) and by `agentfs apply` (its only
//! writer).
//!
//! Paths are relative byte strings ("a/b"; "" is the root itself).

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What lstat found at a path.
#[derive(Clone, Copy)]
pub struct Stat {
    /// st_mode: type and permission bits.
    pub mode: u32,
    /// Everything lstat returned.
    pub raw: libc::stat,
}

/// Extended attributes: (name, value) pairs.
pub type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// An object of the tree held open for reading its extended attributes. A symlink shows
/// none: its own attributes cannot be read here without risking its target's.
pub struct XattrHandle {
    _fd: OwnedFd,
    at: CString,
    /// The object's fstat, to tell it is still the one expected.
    pub stat: libc::stat,
}

impl XattrHandle {
    fn is_symlink(&self) -> bool {
        self.stat.st_mode & libc::S_IFMT == libc::S_IFLNK
    }

    /// Every attribute name, each NUL-terminated (empty on a filesystem without them).
    pub fn names(&self) -> io::Result<Vec<u8>> {
        if self.is_symlink() {
            return Ok(Vec::new());
        }
        // SAFETY: `at` is NUL-terminated; the call writes at most the length it is given.
        let names = xattr_buf(|buf| unsafe {
            libc::listxattr(self.at.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        });
        match names {
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => Ok(Vec::new()),
            r => r,
        }
    }

    /// The value of attribute `name`; ENODATA when absent (or unsupported here).
    pub fn get(&self, name: &[u8]) -> io::Result<Vec<u8>> {
        if self.is_symlink() {
            return Err(io::Error::from_raw_os_error(libc::ENODATA));
        }
        let name = cstr(name)?;
        // SAFETY: both strings are NUL-terminated; the call writes at most the length given.
        let value = xattr_buf(|buf| unsafe {
            libc::getxattr(
                self.at.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        });
        match value {
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => {
                Err(io::Error::from_raw_os_error(libc::ENODATA))
            }
            r => r,
        }
    }
}

/// One directory entry: name, DT_* type and inode number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirent {
    pub name: Vec<u8>,
    pub kind: u8,
    pub ino: u64,
}

impl Stat {
    pub fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }
}

/// A directory tree that operations cannot leave.
pub struct Beneath {
    root: OwnedFd,
}

fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Split "a/b/c" into ("a/b", "c"); "c" into ("", "c").
fn split(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|b| *b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&[], rel),
    }
}

/// Whether an error means "a component on the way is a symlink or leads outside".
pub fn is_escape(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::EXDEV))
}

/// Whether an error means "nothing there" (a missing name or a non-directory on the way).
pub fn is_missing(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR))
}

/// The name of the temporary file [`Beneath::write_file`] of process `pid` writes beside the
/// file named `last` before renaming it over it: `.<last>.agentfs-apply-<pid>`.
pub fn temp_name(last: &[u8], pid: u32) -> Vec<u8> {
    let mut name = b".".to_vec();
    name.extend_from_slice(&last[..last.len().min(200)]);
    name.extend_from_slice(format!(".agentfs-apply-{pid}").as_bytes());
    name
}

impl Beneath {
    /// Open `root` (a directory) as the confining tree.
    pub fn open(root: &Path) -> io::Result<Beneath> {
        let c = cstr(root.as_os_str().as_bytes())?;
        // SAFETY: `c` is a valid NUL-terminated path; the returned fd is checked and owned.
        let fd = check(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: `fd` was just returned by open and is owned by nothing else.
        let root = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Beneath { root })
    }

    /// openat2 beneath the root without following any symlink.
    fn open_at(&self, rel: &[u8], flags: libc::c_int) -> io::Result<OwnedFd> {
        let path = cstr(if rel.is_empty() { b"." } else { rel })?;
        openat2(
            self.root.as_raw_fd(),
            &path,
            flags,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
        )
    }

    /// The directory holding `rel` (resolved beneath the root) and the last component.
    fn parent<'a>(&self, rel: &'a [u8]) -> io::Result<(OwnedFd, CString, &'a [u8])> {
        let (dir, name) = split(rel);
        if name.is_empty() || name == b"." || name == b".." {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let fd = self.open_at(dir, libc::O_PATH | libc::O_DIRECTORY)?;
        Ok((fd, cstr(name)?, name))
    }

    /// lstat of `rel`; `None` when nothing is there (also when a component on the way is not
    /// a directory). A symlink on the way is an error ([`is_escape`]); a symlink as the last
    /// component is reported, not followed.
    pub fn lstat(&self, rel: &[u8]) -> io::Result<Option<Stat>> {
        let fd = match self.open_at(rel, libc::O_PATH) {
            Ok(fd) => fd,
            Err(e) if is_missing(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        // SAFETY: zeroed stat is a valid out-buffer; fstat writes it for a valid fd.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is a valid open descriptor and `st` a valid out-pointer.
        check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
        Ok(Some(to_stat(&st)))
    }

    /// The bytes of regular file `rel`.
    pub fn read_file(&self, rel: &[u8]) -> io::Result<Vec<u8>> {
        let fd = self.open_at(rel, libc::O_RDONLY | libc::O_NONBLOCK)?;
        let mut f = File::from(fd);
        if !f.metadata()?.is_file() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut out = Vec::new();
        f.read_to_end(&mut out)?;
        Ok(out)
    }

    /// The target of symlink `rel`.
    pub fn read_link(&self, rel: &[u8]) -> io::Result<Vec<u8>> {
        let (dir, name, _) = self.parent(rel)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: valid dir fd and NUL-terminated name; readlinkat writes at most buf.len().
        let n = unsafe {
            libc::readlinkat(
                dir.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(buf)
    }

    /// Open `rel` (never following it) to read its extended attributes.
    pub fn xattr_handle(&self, rel: &[u8]) -> io::Result<XattrHandle> {
        let fd = self.open_at(rel, libc::O_PATH)?;
        let stat = fstat(&fd)?;
        // An O_PATH descriptor serves no *xattr call itself; its /proc link reaches the object
        // it was opened on (not a path that could have been swapped since).
        let at = cstr(format!("/proc/self/fd/{}", fd.as_raw_fd()).as_bytes())?;
        Ok(XattrHandle { _fd: fd, at, stat })
    }

    /// The names in directory `rel` ("" for the root), sorted, without "." and "..".
    pub fn list(&self, rel: &[u8]) -> io::Result<Vec<Vec<u8>>> {
        let mut names: Vec<_> = self.entries(rel)?.into_iter().map(|e| e.name).collect();
        names.sort();
        Ok(names)
    }

    /// Open regular file `rel` for reading.
    pub fn open_file(&self, rel: &[u8]) -> io::Result<File> {
        Ok(File::from(
            self.open_at(rel, libc::O_RDONLY | libc::O_NONBLOCK)?,
        ))
    }

    /// The entries of directory `rel` ("" for the root), unsorted, without "." and "..".
    pub fn entries(&self, rel: &[u8]) -> io::Result<Vec<Dirent>> {
        let fd = self.open_at(rel, libc::O_RDONLY | libc::O_DIRECTORY)?;
        let raw = fd.as_raw_fd();
        // SAFETY: fdopendir takes ownership of a valid directory fd on success.
        let dirp = unsafe { libc::fdopendir(raw) };
        if dirp.is_null() {
            return Err(io::Error::last_os_error());
        }
        std::mem::forget(fd);
        let mut out = Vec::new();
        let result = loop {
            // SAFETY: errno is thread-local; resetting it distinguishes end from error.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: `dirp` is a valid DIR* until closedir below.
            let ent = unsafe { libc::readdir(dirp) };
            if ent.is_null() {
                let e = io::Error::last_os_error();
                break if e.raw_os_error() == Some(0) {
                    Ok(())
                } else {
                    Err(e)
                };
            }
            // SAFETY: a live dirent: d_name is a NUL-terminated string; it is copied before
            // the next readdir call can reuse its storage.
            let (name, kind, ino) = unsafe {
                let e = &*ent;
                let name = std::ffi::CStr::from_ptr(e.d_name.as_ptr()).to_bytes();
                (name, e.d_type, e.d_ino)
            };
            if name != b"." && name != b".." {
                out.push(Dirent {
                    name: name.to_vec(),
                    kind,
                    ino,
                });
            }
        };
        // SAFETY: `dirp` is valid and closed exactly once (this also closes the fd).
        unsafe { libc::closedir(dirp) };
        result?;
        Ok(out)
    }

    /// Create directory `rel` with permission bits `mode` (exactly, regardless of umask).
    pub fn mkdir(&self, rel: &[u8], mode: u32) -> io::Result<()> {
        let (dir, name, _) = self.parent(rel)?;
        // SAFETY: valid dir fd and NUL-terminated name.
        check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o700) })?;
        self.chmod(rel, mode)
    }

    /// Remove `rel`: an empty directory when `dir`, else a file or symlink.
    pub fn remove(&self, rel: &[u8], dir_entry: bool) -> io::Result<()> {
        let (dir, name, _) = self.parent(rel)?;
        let flags = if dir_entry { libc::AT_REMOVEDIR } else { 0 };
        // SAFETY: valid dir fd and NUL-terminated name.
        check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })?;
        Ok(())
    }

    /// Create symlink `rel` pointing at `target`.
    pub fn symlink(&self, target: &[u8], rel: &[u8]) -> io::Result<()> {
        let (dir, name, _) = self.parent(rel)?;
        let t = cstr(target)?;
        // SAFETY: valid dir fd and NUL-terminated strings.
        check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })?;
        Ok(())
    }

    /// Give `rel` itself (a symlink is not followed) the owner `owner`; None does nothing.
    pub fn chown(&self, rel: &[u8], owner: Option<(u32, u32)>) -> io::Result<()> {
        let Some((uid, gid)) = owner else {
            return Ok(());
        };
        let (dir, name, _) = self.parent(rel)?;
        // SAFETY: valid dir fd and NUL-terminated name.
        check(unsafe {
            libc::fchownat(
                dir.as_raw_fd(),
                name.as_ptr(),
                uid,
                gid,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
        Ok(())
    }

    /// Set the permission bits of the file or directory `rel` (never through a symlink).
    pub fn chmod(&self, rel: &[u8], mode: u32) -> io::Result<()> {
        let fd = self.open_at(rel, libc::O_RDONLY | libc::O_NONBLOCK)?;
        // SAFETY: `fd` is a valid open descriptor.
        check(unsafe { libc::fchmod(fd.as_raw_fd(), mode & 0o7777) })?;
        Ok(())
    }

    /// Make `rel` a regular file holding `data` with permission bits `mode`: the bytes go to a
    /// new file in the same directory, which is synced and renamed over `rel`.
    pub fn write_file(
        &self,
        rel: &[u8],
        data: &[u8],
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> io::Result<()> {
        let (dir, name, last) = self.parent(rel)?;
        let tmp = cstr(&temp_name(last, std::process::id()))?;
        // SAFETY: valid dir fd and NUL-terminated name; a leftover from a crashed run is removed.
        unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
        // SAFETY: valid dir fd and NUL-terminated name; O_EXCL|O_NOFOLLOW create a new file.
        let fd = check(unsafe {
            libc::openat(
                dir.as_raw_fd(),
                tmp.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        })?;
        // SAFETY: `fd` was just returned by openat and is owned by nothing else.
        let mut f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let written = f
            .write_all(data)
            .and_then(|()| match owner {
                // Before the mode: a chown clears set-id bits.
                // SAFETY: `f` holds a valid open descriptor.
                Some((uid, gid)) => check(unsafe { libc::fchown(f.as_raw_fd(), uid, gid) }),
                None => Ok(0),
            })
            .and_then(|_| {
                // SAFETY: `f` holds a valid open descriptor.
                check(unsafe { libc::fchmod(f.as_raw_fd(), mode & 0o7777) }).map(|_| ())
            })
            .and_then(|()| f.sync_all())
            .and_then(|()| {
                // SAFETY: valid dir fd (both sides) and NUL-terminated names.
                check(unsafe {
                    libc::renameat(
                        dir.as_raw_fd(),
                        tmp.as_ptr(),
                        dir.as_raw_fd(),
                        name.as_ptr(),
                    )
                })
                .map(|_| ())
            });
        if written.is_err() {
            // SAFETY: valid dir fd and NUL-terminated name.
            unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
        }
        written
    }

    /// Create regular file `rel` (it must not exist) holding `data` with permission bits
    /// `mode`; not synced (for trees that are a cache of a database, like an overlayfs upper).
    pub fn create_file(&self, rel: &[u8], data: &[u8], mode: u32) -> io::Result<()> {
        let (dir, name, _) = self.parent(rel)?;
        // SAFETY: valid dir fd and NUL-terminated name; O_EXCL|O_NOFOLLOW create a new file.
        let fd = check(unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        })?;
        // SAFETY: `fd` was just returned by openat and is owned by nothing else.
        let mut f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        f.write_all(data)?;
        // SAFETY: `f` holds a valid open descriptor.
        check(unsafe { libc::fchmod(f.as_raw_fd(), mode & 0o7777) })?;
        Ok(())
    }

    /// Create the special file `rel`: `mode` holds its type (FIFO, socket, device) and bits,
    /// `rdev` the device in the kernel's 32-bit encoding (0/0 character device: an overlayfs
    /// whiteout, which the kernel lets any user make).
    pub fn mknod(&self, rel: &[u8], mode: u32, rdev: u32) -> io::Result<()> {
        let (dir, name, _) = self.parent(rel)?;
        let major = (rdev & 0xfff00) >> 8;
        let minor = (rdev & 0xff) | ((rdev >> 12) & 0xfff00);
        let dev = libc::makedev(major, minor);
        // SAFETY: valid dir fd and NUL-terminated name.
        check(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, dev) })?;
        Ok(())
    }

    /// Give the object at `existing` one more name, `rel` (a hard link; neither followed).
    pub fn link(&self, existing: &[u8], rel: &[u8]) -> io::Result<()> {
        let (from_dir, from, _) = self.parent(existing)?;
        let (dir, name, _) = self.parent(rel)?;
        // SAFETY: valid dir fds and NUL-terminated names.
        check(unsafe {
            libc::linkat(
                from_dir.as_raw_fd(),
                from.as_ptr(),
                dir.as_raw_fd(),
                name.as_ptr(),
                0,
            )
        })?;
        Ok(())
    }

    /// Set extended attribute `name` of `rel` (never through a symlink) to `value`.
    pub fn set_xattr(&self, rel: &[u8], name: &[u8], value: &[u8]) -> io::Result<()> {
        let h = self.xattr_handle(rel)?;
        let name = cstr(name)?;
        // SAFETY: both strings are NUL-terminated; the value is read for its length only.
        check(unsafe {
            libc::setxattr(
                h.at.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        })?;
        Ok(())
    }

    /// Set the access and modification times of `rel` itself (a symlink is not followed) to
    /// `sec`.`nsec`.
    pub fn set_times(&self, rel: &[u8], sec: i64, nsec: u32) -> io::Result<()> {
        let t = libc::timespec {
            tv_sec: sec,
            tv_nsec: i64::from(nsec),
        };
        let times = [t, t];
        if rel.is_empty() {
            let fd = self.open_at(rel, libc::O_RDONLY | libc::O_DIRECTORY)?;
            // SAFETY: valid fd; `times` holds two timespecs.
            check(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) })?;
            return Ok(());
        }
        let (dir, name, _) = self.parent(rel)?;
        // SAFETY: valid dir fd, NUL-terminated name; `times` holds two timespecs.
        check(unsafe {
            libc::utimensat(
                dir.as_raw_fd(),
                name.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
        Ok(())
    }

    /// fsync the directory `rel` ("" for the root).
    pub fn sync_dir(&self, rel: &[u8]) -> io::Result<()> {
        let fd = self.open_at(rel, libc::O_RDONLY | libc::O_DIRECTORY)?;
        File::from(fd).sync_all()
    }
}

fn to_stat(st: &libc::stat) -> Stat {
    Stat {
        mode: st.st_mode,
        raw: *st,
    }
}

/// openat2 of `path` relative to `dir` with `resolve` flags, never following the last
/// component (O_NOFOLLOW); retried while a concurrent rename makes it EAGAIN.
fn openat2(
    dir: libc::c_int,
    path: &std::ffi::CStr,
    flags: libc::c_int,
    resolve: u64,
) -> io::Result<OwnedFd> {
    // SAFETY: open_how is plain data; all-zero is its documented "no options" value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64;
    how.resolve = resolve;
    loop {
        // SAFETY: openat2 reads `path` (NUL-terminated) and `how` (a valid open_how of the
        // size passed); the returned fd is checked and then owned.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                path.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: `fd` was just returned by openat2 and is owned by nothing else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) });
        }
        let e = io::Error::last_os_error();
        // EAGAIN: a concurrent rename raced the resolution; trying again is safe.
        if e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(e);
        }
    }
}

/// Open absolute path `abs` with `flags`, refusing a symlink in any directory on the way
/// (ELOOP) and never following the last component: for host paths recorded in canonical form,
/// which a symlink put in place of one of their directories must not redirect.
pub fn open_no_symlinks(abs: &Path, flags: libc::c_int) -> io::Result<File> {
    let path = cstr(abs.as_os_str().as_bytes())?;
    Ok(File::from(openat2(
        libc::AT_FDCWD,
        &path,
        flags,
        libc::RESOLVE_NO_SYMLINKS,
    )?))
}

/// Run a list/get xattr call into a buffer that grows until the answer fits.
fn xattr_buf(call: impl Fn(&mut [u8]) -> libc::ssize_t) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    loop {
        let n = call(&mut buf);
        if n >= 0 {
            buf.truncate(n as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        // ERANGE: it grew between the size query and the read; XATTR_SIZE_MAX caps the loop.
        if e.raw_os_error() != Some(libc::ERANGE) || buf.len() > 1 << 20 {
            return Err(e);
        }
        let want = call(&mut []);
        let want = usize::try_from(want).map_err(|_| io::Error::last_os_error())?;
        buf.resize(want.max(buf.len() * 2), 0);
    }
}

/// fstat(2) of an open descriptor (an O_PATH one included).
pub fn fstat(fd: &impl AsRawFd) -> io::Result<libc::stat> {
    // SAFETY: all-zero is a valid `stat`; the kernel fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is a valid descriptor and `st` a valid out-pointer.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_leaves_the_tree() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::write(root.join("d/f"), b"x").unwrap();
        std::fs::write(t.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink("../secret", root.join("up")).unwrap();
        std::os::unix::fs::symlink("/", root.join("abs")).unwrap();
        std::os::unix::fs::symlink("d", root.join("dl")).unwrap();
        let b = Beneath::open(&root).unwrap();
        assert_eq!(b.lstat(b"d/f").unwrap().unwrap().raw.st_size, 1);
        assert!(b.lstat(b"../secret").is_err());
        assert!(b.open_file(b"up").is_err(), "symlinks are not followed");
        assert!(b.lstat(b"abs/etc").is_err());
        assert!(b.lstat(b"dl/f").is_err(), "not even inside the tree");
        assert_eq!(b.lstat(b"up").unwrap().unwrap().kind(), libc::S_IFLNK);
        assert_eq!(b.read_link(b"up").unwrap(), b"../secret");
        assert_eq!(
            b.list(b"").unwrap(),
            vec![
                b"abs".to_vec(),
                b"d".to_vec(),
                b"dl".to_vec(),
                b"up".to_vec()
            ]
        );
    }
}
