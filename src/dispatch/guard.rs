//! The server's own fence inside a sandbox's project (docs/sandbox.md, "Which fence refuses
//! what"): a launch whose writable set does not cover the whole project serves the project
//! writable at the mount level and refuses here, by path, every change outside the writable
//! sub-trees with EROFS; an opt-in rule refuses symlinks whose target leaves the project with
//! EPERM. Every refusal is handed to the launch's audit log.
//!
//! Paths are the mount's own ("/src/a.rs"). A node's path is one of its names; a node without
//! a name (unlinked, O_TMPFILE) is let through: only an operation the guard allowed can have
//! removed or made it.

use crate::errno::Errno;
use crate::protocol::{Operation, Request};
use crate::store::overlay::join;
use crate::store::Ino;

use super::Filesystem;

/// One refused request, as the audit log records it.
pub struct Refusal<'a> {
    /// The requesting process, as the sandbox's pid namespace numbers it.
    pub pid: u32,
    /// The operation (`create`, `write`, `rename`, ...).
    pub op: &'static str,
    /// The refused path, absolute in the sandbox's view.
    pub path: &'a [u8],
    pub errno: Errno,
    /// A refused symlink's target.
    pub target: Option<&'a [u8]>,
}

/// Where refusals go (the project's audit log).
pub type Sink = Box<dyn Fn(&Refusal<'_>) + Send + Sync>;

/// What the server refuses on its own.
pub struct Guard {
    /// Where the mount is in the view: log paths are shown under it, absolute symlink targets
    /// compared with it.
    mount_point: Vec<u8>,
    /// The writable sub-trees as mount paths ("/src"); None: the whole mount is writable.
    writable: Option<Vec<Vec<u8>>>,
    /// Refuse symlinks whose target resolves outside the mount.
    refuse_escaping_symlinks: bool,
    sink: Sink,
}

/// Whether `path` is `root` or lies below it, by whole components.
fn within(path: &[u8], root: &[u8]) -> bool {
    let root = root.strip_suffix(b"/").unwrap_or(root);
    path == root || (path.starts_with(root) && path.get(root.len()) == Some(&b'/'))
}

/// Whether symlink `target`, made in directory `dir` (a mount path), resolves lexically
/// outside the mount at `mount_point` (a relative target is taken from where the link is).
pub fn escapes(mount_point: &[u8], dir: &[u8], target: &[u8]) -> bool {
    let from = if target.starts_with(b"/") {
        target.to_vec()
    } else {
        join(
            &join(mount_point, dir.strip_prefix(b"/").unwrap_or(dir)),
            target,
        )
    };
    let mut kept: Vec<&[u8]> = Vec::new();
    for c in from.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                kept.pop();
            }
            _ => kept.push(c),
        }
    }
    let landed: Vec<u8> = kept.iter().flat_map(|c| [&b"/"[..], c].concat()).collect();
    !within(&landed, mount_point)
}

impl Guard {
    pub fn new(
        mount_point: Vec<u8>,
        writable: Option<Vec<Vec<u8>>>,
        refuse_escaping_symlinks: bool,
        sink: Sink,
    ) -> Guard {
        Guard {
            mount_point,
            writable,
            refuse_escaping_symlinks,
            sink,
        }
    }

    fn writable(&self, path: &[u8]) -> bool {
        self.writable
            .as_ref()
            .is_none_or(|roots| roots.iter().any(|r| within(path, r)))
    }

    fn refuse(
        &self,
        req: &Request<'_>,
        op: &'static str,
        path: &[u8],
        errno: Errno,
        target: Option<&[u8]>,
    ) -> Errno {
        let shown = join(&self.mount_point, path.strip_prefix(b"/").unwrap_or(path));
        (self.sink)(&Refusal {
            pid: req.header.pid,
            op,
            path: shown.strip_suffix(b"/").unwrap_or(&shown),
            errno,
            target,
        });
        errno
    }

    /// Refuse `req` when it changes something outside the writable set, or makes an escaping
    /// symlink under the opt-in rule; logs what it refuses.
    pub fn check(&self, fs: &dyn Filesystem, req: &Request<'_>) -> Result<(), Errno> {
        let ino = Ino(req.header.nodeid);
        if let Operation::Symlink { name, target } = &req.op {
            if let (true, Some(dir)) = (self.refuse_escaping_symlinks, fs.node_path(ino)?) {
                if escapes(&self.mount_point, &dir, target) {
                    let path = join(&dir, name);
                    return Err(self.refuse(req, "symlink", &path, Errno::EPERM, Some(target)));
                }
            }
        }
        if self.writable.is_none() {
            return Ok(());
        }
        let at = |dir: Ino, name: &[u8]| -> Result<Option<Vec<u8>>, Errno> {
            Ok(fs.node_path(dir)?.map(|d| join(&d, name)))
        };
        let writes = |flags: u32| {
            flags as i32 & libc::O_ACCMODE != libc::O_RDONLY || flags as i32 & libc::O_TRUNC != 0
        };
        let (op, paths) = match &req.op {
            Operation::Create { name, .. } => ("create", [at(ino, name)?, None]),
            Operation::Mknod { name, .. } => ("mknod", [at(ino, name)?, None]),
            Operation::Mkdir { name, .. } => ("mkdir", [at(ino, name)?, None]),
            Operation::Symlink { name, .. } => ("symlink", [at(ino, name)?, None]),
            Operation::Unlink { name } => ("unlink", [at(ino, name)?, None]),
            Operation::Rmdir { name } => ("rmdir", [at(ino, name)?, None]),
            Operation::Rename {
                newdir,
                name,
                newname,
                ..
            } => ("rename", [at(ino, name)?, at(Ino(*newdir), newname)?]),
            // The new name, and the node it names: a writable alias of a read-only file would
            // let its bytes change.
            Operation::Link { oldnodeid, newname } => {
                ("link", [at(ino, newname)?, fs.node_path(Ino(*oldnodeid))?])
            }
            Operation::Tmpfile { .. } => ("tmpfile", [fs.node_path(ino)?, None]),
            Operation::Open { flags } if writes(*flags) => ("open", [fs.node_path(ino)?, None]),
            Operation::Setattr(_) => ("setattr", [fs.node_path(ino)?, None]),
            Operation::Write { .. } => ("write", [fs.node_path(ino)?, None]),
            Operation::Fallocate { .. } => ("fallocate", [fs.node_path(ino)?, None]),
            Operation::Setxattr { .. } => ("setxattr", [fs.node_path(ino)?, None]),
            Operation::Removexattr { .. } => ("removexattr", [fs.node_path(ino)?, None]),
            Operation::CopyFileRange { nodeid_out, .. } => {
                ("copy_file_range", [fs.node_path(Ino(*nodeid_out))?, None])
            }
            _ => return Ok(()),
        };
        for p in paths.iter().flatten() {
            if !self.writable(p) {
                return Err(self.refuse(req, op, p, Errno::EROFS, None));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containment_is_by_whole_components() {
        assert!(within(b"/src", b"/src"));
        assert!(within(b"/src/a", b"/src"));
        assert!(within(b"/src/a", b"/src/"));
        assert!(!within(b"/srcX", b"/src"));
        assert!(!within(b"/README", b"/src"));
        assert!(within(b"/anything", b"/"));
    }

    #[test]
    fn symlink_targets_that_leave_the_mount_escape() {
        let m = b"/srv/p";
        for (dir, target) in [
            (&b"/"[..], &b"/etc/passwd"[..]),
            (b"/", b".."),
            (b"/a", b"../../x"),
            (b"/a/b", b"../../../srv/p/x"),
            (b"/", b"/srv/pX"),
            (b"/", b"a/../../b"),
        ] {
            assert!(escapes(m, dir, target), "{dir:?} {target:?}");
        }
        for (dir, target) in [
            (&b"/"[..], &b"a"[..]),
            (b"/a/b", b"../../c"),
            (b"/", b"/srv/p/x"),
            (b"/", b"/srv/p"),
            (b"/a", b"./b/../c"),
            (b"/", b"/srv/p/../p/x"),
            (b"/", b"../p/README"),
        ] {
            assert!(!escapes(m, dir, target), "{dir:?} {target:?}");
        }
    }
}
