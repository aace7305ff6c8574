//! Read-only access to a directory tree that can never leave it: every path is resolved by
//! `openat2(2)` relative to the tree's root with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, so
//! neither `..` nor a symlink (planted before or during the walk) reaches outside, and a
//! symlink is only ever seen as itself, never followed. Nothing here writes.
//!
//! Paths are relative byte strings without a leading `/` (`""` is the root itself).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// One directory entry of the tree: name, DT_* type and inode number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirent {
    pub name: Vec<u8>,
    pub kind: u8,
    pub ino: u64,
}

/// A directory tree opened once; every access resolves beneath it.
pub struct Beneath {
    root: OwnedFd,
}

fn cstr(rel: &[u8]) -> io::Result<CString> {
    let rel = if rel.is_empty() { b"." as &[u8] } else { rel };
    CString::new(rel).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

impl Beneath {
    /// Open `dir` (which must be a directory) as the root of the tree.
    pub fn open(dir: &Path) -> io::Result<Beneath> {
        let c = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `c` is a valid NUL-terminated string; the returned descriptor is checked
        // and owned exactly once below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(Beneath {
            root: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// `openat2(root, rel, flags)` confined to the tree, symlinks never followed.
    fn openat2(&self, rel: &[u8], flags: i32) -> io::Result<OwnedFd> {
        let c = cstr(rel)?;
        // SAFETY: open_how is plain data; all-zero is its documented "no options" value and
        // the fields we need are set right after.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64;
        how.resolve =
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
        loop {
            // SAFETY: the pointers are valid for the call (`c` NUL-terminated, `how` sized as
            // passed); the kernel returns a new descriptor or -1.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    self.root.as_raw_fd(),
                    c.as_ptr(),
                    &how as *const libc::open_how,
                    std::mem::size_of::<libc::open_how>(),
                )
            };
            if fd >= 0 {
                // SAFETY: a fresh descriptor owned only here.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
            }
            let e = io::Error::last_os_error();
            // EAGAIN: a concurrent rename raced the resolution; it is safe to retry.
            if e.raw_os_error() != Some(libc::EAGAIN) {
                // A symlink met in the middle of the path reports ELOOP; to callers that is
                // "no such directory here".
                return Err(match e.raw_os_error() {
                    Some(libc::ELOOP) | Some(libc::EXDEV) => {
                        io::Error::from_raw_os_error(libc::ENOENT)
                    }
                    _ => e,
                });
            }
        }
    }

    /// lstat(2) of `rel`.
    pub fn lstat(&self, rel: &[u8]) -> io::Result<libc::stat> {
        let fd = self.openat2(rel, libc::O_PATH)?;
        fstat(&fd)
    }

    /// Open the regular file `rel` for reading.
    pub fn open_file(&self, rel: &[u8]) -> io::Result<File> {
        let fd = self.openat2(rel, libc::O_RDONLY)?;
        Ok(File::from(fd))
    }

    /// The target of the symlink `rel`.
    pub fn readlink(&self, rel: &[u8]) -> io::Result<Vec<u8>> {
        let fd = self.openat2(rel, libc::O_PATH)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: `buf` is writable for its length; an empty path with an O_PATH descriptor
        // reads the link the descriptor refers to.
        let n = unsafe {
            libc::readlinkat(
                fd.as_raw_fd(),
                c"".as_ptr(),
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

    /// Every entry of directory `rel` except "." and "..", unsorted.
    pub fn list(&self, rel: &[u8]) -> io::Result<Vec<Dirent>> {
        let fd = self.openat2(rel, libc::O_RDONLY | libc::O_DIRECTORY)?;
        let raw = fd.as_raw_fd();
        // SAFETY: on success fdopendir takes ownership of the descriptor (closed by closedir
        // below), so ownership is released from `fd` first.
        let dir = unsafe { libc::fdopendir(raw) };
        if dir.is_null() {
            return Err(io::Error::last_os_error());
        }
        std::mem::forget(fd);
        let mut out = Vec::new();
        loop {
            // SAFETY: `dir` is a valid DIR stream until closedir; the entry is copied before
            // the next readdir call can reuse its storage.
            let ent = unsafe { libc::readdir64(dir) };
            if ent.is_null() {
                break;
            }
            // SAFETY: readdir64 returned a valid entry whose d_name is NUL-terminated.
            let (name, kind, ino) = unsafe {
                let e = &*ent;
                let name = std::ffi::CStr::from_ptr(e.d_name.as_ptr())
                    .to_bytes()
                    .to_vec();
                (name, e.d_type, e.d_ino)
            };
            if name == b"." || name == b".." {
                continue;
            }
            out.push(Dirent { name, kind, ino });
        }
        // SAFETY: `dir` came from fdopendir and is closed exactly once.
        unsafe { libc::closedir(dir) };
        Ok(out)
    }
}

/// fstat(2) of an open descriptor (an O_PATH one included).
pub fn fstat(fd: &impl AsRawFd) -> io::Result<libc::stat> {
    // SAFETY: all-zero is a valid `stat`; the kernel fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is writable; AT_EMPTY_PATH with "" stats the descriptor itself.
    let r = unsafe {
        libc::fstatat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            &mut st,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
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
        assert_eq!(b.lstat(b"d/f").unwrap().st_size, 1);
        assert!(b.lstat(b"../secret").is_err());
        assert!(b.open_file(b"up").is_err(), "symlinks are not followed");
        assert!(b.lstat(b"abs/etc").is_err());
        assert!(b.lstat(b"dl/f").is_err(), "not even inside the tree");
        assert_eq!(
            b.lstat(b"up").unwrap().st_mode & libc::S_IFMT,
            libc::S_IFLNK
        );
        assert_eq!(b.readlink(b"up").unwrap(), b"../secret");
        let mut names: Vec<_> = b.list(b"").unwrap().into_iter().map(|e| e.name).collect();
        names.sort();
        assert_eq!(
            names,
            vec![
                b"abs".to_vec(),
                b"d".to_vec(),
                b"dl".to_vec(),
                b"up".to_vec()
            ]
        );
    }
}
