//! Creating a FUSE mount: /dev/fuse plus mount(2) as root, or fusermount3 with fd passing.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Why a mount could not be made; each prints as one line for the user.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("/dev/fuse is missing: install fuse3 (apt-get install fuse3) and load the module (modprobe fuse); in a container run with --device /dev/fuse --cap-add SYS_ADMIN")]
    NoDevFuse,
    #[error("/dev/fuse: permission denied: run as root, or make /dev/fuse accessible and install fusermount3 (apt-get install fuse3)")]
    DevFuseDenied,
    #[error("mount point {0} does not exist")]
    MissingMountPoint(PathBuf),
    #[error("mount point {0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("{0} is already a mount point; unmount it first (agentfs umount {0})")]
    AlreadyMounted(PathBuf),
    #[error(
        "mount point {0} is not empty: the mount would hide its files (-o nonempty mounts anyway)"
    )]
    NotEmpty(PathBuf),
    #[error("fusermount3 not found: install fuse3 (apt-get install fuse3) or run as root")]
    NoFusermount,
    #[error("{what}: {source}")]
    Os {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("fusermount3 failed: {0}")]
    Fusermount(String),
}

/// What the kernel is told about a new mount.
#[derive(Clone, Debug, Default)]
pub struct MountOptions {
    pub readonly: bool,
    pub allow_other: bool,
    /// Accept a mount point that has entries (the mount hides them until unmounted).
    pub nonempty: bool,
    /// Options passed through verbatim (e.g. `noatime`, `nosuid`).
    pub extra: Vec<String>,
}

/// The source shown in /proc/mounts and the filesystem subtype (`fuse.agentfs`).
pub const FS_NAME: &str = "agentfs";

fn os_err(what: impl Into<String>) -> MountError {
    MountError::Os {
        what: what.into(),
        source: std::io::Error::last_os_error(),
    }
}

/// Check that `mnt` exists, is a directory, is not itself a mount point and, unless
/// `nonempty`, has no entries.
pub fn check_mount_point(mnt: &Path, nonempty: bool) -> Result<PathBuf, MountError> {
    let meta = match std::fs::metadata(mnt) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(MountError::MissingMountPoint(mnt.to_path_buf()))
        }
        Err(e) => {
            return Err(MountError::Os {
                what: mnt.display().to_string(),
                source: e,
            })
        }
    };
    if !meta.is_dir() {
        return Err(MountError::NotADirectory(mnt.to_path_buf()));
    }
    let abs = std::fs::canonicalize(mnt).map_err(|e| MountError::Os {
        what: mnt.display().to_string(),
        source: e,
    })?;
    if super::mounts::is_mount_point(&abs) {
        return Err(MountError::AlreadyMounted(abs));
    }
    if !nonempty {
        let mut entries = std::fs::read_dir(&abs).map_err(|e| MountError::Os {
            what: abs.display().to_string(),
            source: e,
        })?;
        if entries.next().is_some() {
            return Err(MountError::NotEmpty(abs));
        }
    }
    Ok(abs)
}

/// Open /dev/fuse read-write and close-on-exec, so no child process can inherit the connection.
pub fn open_dev_fuse() -> Result<OwnedFd, MountError> {
    let path = c"/dev/fuse";
    // SAFETY: `path` is a valid NUL-terminated string; open has no other preconditions.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ENXIO) => MountError::NoDevFuse,
            Some(libc::EACCES) | Some(libc::EPERM) => MountError::DevFuseDenied,
            _ => MountError::Os {
                what: "/dev/fuse".into(),
                source: err,
            },
        });
    }
    // SAFETY: `fd` was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn option_string(opts: &MountOptions, with_fd: Option<i32>) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(fd) = with_fd {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        parts.push(format!("fd={fd}"));
        parts.push("rootmode=40000".into());
        parts.push(format!("user_id={uid}"));
        parts.push(format!("group_id={gid}"));
    }
    parts.push("default_permissions".into());
    if opts.allow_other {
        parts.push("allow_other".into());
    }
    if with_fd.is_none() {
        parts.push(format!("fsname={FS_NAME}"));
        parts.push(format!("subtype={FS_NAME}"));
        if opts.readonly {
            parts.push("ro".into());
        }
    }
    parts.extend(opts.extra.iter().cloned());
    parts.join(",")
}

/// Whether this process may call mount(2) itself.
pub fn can_mount_directly() -> bool {
    super::ids::is_root()
}

/// Mount with mount(2) (root). Returns the /dev/fuse connection.
pub fn mount_direct(mnt: &Path, opts: &MountOptions) -> Result<OwnedFd, MountError> {
    let fd = open_dev_fuse()?;
    let data = option_string(opts, Some(fd.as_raw_fd()));
    let source = CString::new(FS_NAME).map_err(|_| os_err("source"))?;
    let target = CString::new(mnt.as_os_str().as_bytes()).map_err(|_| MountError::Os {
        what: mnt.display().to_string(),
        source: std::io::Error::from_raw_os_error(libc::EINVAL),
    })?;
    let fstype = CString::new(format!("fuse.{FS_NAME}")).map_err(|_| os_err("fstype"))?;
    let data_c = CString::new(data).map_err(|_| os_err("mount options"))?;
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    if opts.readonly {
        flags |= libc::MS_RDONLY;
    }
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data_c.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(os_err(format!("mount {}", mnt.display())));
    }
    Ok(fd)
}

/// Mount through the setuid helper fusermount3: it opens /dev/fuse, mounts, and passes the
/// connection back over a socket (SCM_RIGHTS).
pub fn mount_fusermount(mnt: &Path, opts: &MountOptions) -> Result<OwnedFd, MountError> {
    let (ours, theirs) = UnixStream::pair().map_err(|e| MountError::Os {
        what: "socketpair".into(),
        source: e,
    })?;
    // The child must inherit `theirs`: clear close-on-exec on a dup of it.
    // SAFETY: dup of a valid fd; the result is owned below.
    let inherit = unsafe { libc::dup(theirs.as_raw_fd()) };
    if inherit < 0 {
        return Err(os_err("dup"));
    }
    // SAFETY: `inherit` is a fresh fd owned by nobody else (dup does not set CLOEXEC).
    let inherit = unsafe { OwnedFd::from_raw_fd(inherit) };
    let child = Command::new("fusermount3")
        .arg("-o")
        .arg(option_string(opts, None))
        .arg("--")
        .arg(mnt)
        .env("_FUSE_COMMFD", inherit.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    drop(inherit);
    drop(theirs);
    let mut child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(MountError::NoFusermount),
        Err(e) => {
            return Err(MountError::Os {
                what: "fusermount3".into(),
                source: e,
            })
        }
    };
    let received = receive_fd(&ours);
    let status = child.wait().map_err(|e| MountError::Os {
        what: "fusermount3".into(),
        source: e,
    })?;
    let mut stderr = String::new();
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_string(&mut stderr);
    }
    match received {
        Some(fd) if status.success() => Ok(fd),
        _ => Err(MountError::Fusermount(
            stderr
                .lines()
                .next()
                .unwrap_or("no connection received")
                .to_string(),
        )),
    }
}

/// Receive one fd sent with SCM_RIGHTS, marked close-on-exec.
fn receive_fd(sock: &UnixStream) -> Option<OwnedFd> {
    super::ns::recv_msg(sock).ok().and_then(|(_, fd)| fd)
}

/// Set the readahead of the mount whose device is `(major, minor)` to `kib` KiB through its
/// backing device in sysfs (the kernel caps FUSE readahead, and with it the size of READ
/// requests, at the bdi's 128 KiB default, whatever INIT says). Only root may write there.
pub fn set_readahead((major, minor): (u32, u32), kib: u64) -> std::io::Result<()> {
    std::fs::write(
        format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb"),
        kib.to_string(),
    )
}

/// Unmount `mnt`. `lazy` detaches it even while busy. Non-root goes through fusermount3.
pub fn unmount(mnt: &Path, lazy: bool) -> std::io::Result<()> {
    if can_mount_directly() {
        let target = CString::new(mnt.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: target is a valid NUL-terminated path.
        if unsafe { libc::umount2(target.as_ptr(), flags) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        return Ok(());
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd.arg("--").arg(mnt).stdin(Stdio::null()).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}
