//! Applies a plan inside the sandbox's mount namespace. The view is built under `/newroot` of a
//! staging tmpfs while the host's root stays reachable at `/oldroot`; the first failure stops
//! everything and names the operation and path.

use std::io;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use super::plan::Op;
use crate::sys::ns;

const NEW: &str = "/newroot";
const OLD: &str = "/oldroot";
const EMPTY_FILE: &str = "/masked-file";
const EMPTY_DIR: &str = "/masked-dir";

/// A step that failed: its error code, operation and path.
pub struct Failure {
    pub code: &'static str,
    pub op: &'static str,
    pub path: PathBuf,
    pub err: io::Error,
}

impl Failure {
    pub fn new(code: &'static str, op: &'static str, path: &Path, err: io::Error) -> Self {
        Failure {
            code,
            op,
            path: path.to_path_buf(),
            err,
        }
    }

    /// `code \t op \t path \t error`, as the supervisor reads it back.
    pub fn wire(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}",
            self.code,
            self.op,
            self.path.display(),
            self.err
        )
    }
}

fn under(base: &str, p: &Path) -> PathBuf {
    Path::new(base).join(p.strip_prefix("/").unwrap_or(p))
}

/// Where `p` of the view is while it is being built.
fn new(p: &Path) -> PathBuf {
    under(NEW, p)
}

/// Where host path `p` is while the view is being built.
fn old(p: &Path) -> PathBuf {
    under(OLD, p)
}

fn setup(path: &str, err: io::Error) -> Failure {
    Failure::new("mount_failed", "setup", Path::new(path), err)
}

/// Make every mount private, put a staging tmpfs at the root and the host's root at /oldroot.
pub fn stage() -> Result<(), Failure> {
    ns::make_private(Path::new("/")).map_err(|e| setup("/", e))?;
    let staging = Path::new("/tmp");
    ns::mount_tmpfs(staging, 0o755).map_err(|e| setup("/tmp", e))?;
    for d in [NEW, OLD, EMPTY_DIR] {
        std::fs::create_dir(under("/tmp", Path::new(d))).map_err(|e| setup(d, e))?;
    }
    let empty = under("/tmp", Path::new(EMPTY_FILE));
    std::fs::write(&empty, b"").map_err(|e| setup(EMPTY_FILE, e))?;
    for (p, mode) in [(empty, 0o444), (under("/tmp", Path::new(EMPTY_DIR)), 0o555)] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
            .map_err(|e| setup(EMPTY_FILE, e))?;
    }
    std::env::set_current_dir(staging).map_err(|e| setup("/tmp", e))?;
    ns::pivot_root(Path::new("."), Path::new("oldroot")).map_err(|e| setup("pivot_root", e))?;
    std::env::set_current_dir("/").map_err(|e| setup("/", e))
}

/// A directory at `p` (and its parents) unless something is there.
fn make_dir(p: &Path) -> io::Result<()> {
    if p.symlink_metadata().is_ok() {
        return Ok(());
    }
    std::fs::create_dir_all(p)
}

/// An empty file at `p` (parents created) unless something is there.
fn make_file(p: &Path) -> io::Result<()> {
    if p.symlink_metadata().is_ok() {
        return Ok(());
    }
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(p, b"")
}

/// A mount point for `src` at `dst`: a directory for a directory, a file otherwise.
fn make_target(src: &Path, dst: &Path) -> io::Result<()> {
    if std::fs::metadata(src)?.is_dir() {
        make_dir(dst)
    } else {
        make_file(dst)
    }
}

fn bind_ro(src: &Path, dst: &Path) -> io::Result<()> {
    make_target(src, dst)?;
    ns::bind(src, dst)?;
    ns::set_readonly(dst, true, true)
}

/// Apply `ops` in order. `owner` gets the tmpfs marked owned; `project` waits for the
/// supervisor's go and, on FUSE, mounts the project at the path it is given (and hands the
/// connection to the server); an overlayfs project is mounted here after the go.
pub fn apply(
    ops: &[Op],
    owner: (u32, u32),
    project: &mut dyn FnMut(&Path) -> io::Result<()>,
) -> Result<(), Failure> {
    for op in ops {
        let dst = new(op.path());
        let code = match op {
            Op::RoBind { .. }
            | Op::Bind { .. }
            | Op::DevNode { .. }
            | Op::MaskFile { .. }
            | Op::MaskDir { .. }
            | Op::SelfBind { .. } => "bind_failed",
            Op::ReadOnly { .. } | Op::Writable { .. } => "policy_unenforceable",
            _ => "mount_failed",
        };
        let done = match op {
            Op::Tmpfs { mode, owned, .. } => make_dir(&dst)
                .and_then(|_| ns::mount_tmpfs(&dst, *mode))
                .and_then(|_| {
                    if *owned {
                        std::os::unix::fs::chown(&dst, Some(owner.0), Some(owner.1))
                    } else {
                        Ok(())
                    }
                }),
            Op::RoBind { src, .. } => bind_ro(&old(src), &dst),
            Op::Bind { src, .. } => {
                let src = old(src);
                make_target(&src, &dst).and_then(|_| ns::bind(&src, &dst))
            }
            Op::Symlink { target, .. } => dst
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|_| symlink(target, &dst)),
            Op::Proc { .. } => make_dir(&dst).and_then(|_| ns::mount_proc(&dst)),
            Op::DevNode { path } => {
                let src = old(path);
                make_file(&dst).and_then(|_| ns::bind(&src, &dst))
            }
            Op::Devpts { .. } => make_dir(&dst).and_then(|_| ns::mount_devpts(&dst)),
            Op::Fuse { .. } => make_dir(&dst).and_then(|_| project(&dst)),
            Op::Overlayfs { path, upper, work } => make_dir(&dst)
                .and_then(|_| project(&dst))
                .and_then(|_| ns::mount_overlay(&old(path), &old(upper), &old(work), &dst)),
            Op::MaskFile { .. } => bind_ro(Path::new(EMPTY_FILE), &dst),
            Op::MaskDir { .. } => bind_ro(Path::new(EMPTY_DIR), &dst),
            Op::SelfBind { .. } => ns::bind(&dst, &dst),
            Op::ReadOnly { .. } => ns::set_readonly(&dst, true, true),
            Op::Writable { .. } => ns::set_readonly(&dst, false, false),
        };
        done.map_err(|e| Failure::new(code, op.name(), op.path(), e))?;
    }
    Ok(())
}

/// Make the built view the root; the staging tmpfs and the host's root go away.
pub fn enter() -> Result<(), Failure> {
    std::env::set_current_dir(NEW).map_err(|e| setup(NEW, e))?;
    ns::pivot_to_cwd().map_err(|e| setup("pivot_root", e))
}
