//! The server's half of FUSE_HANDLE_KILLPRIV_V2: clearing set-id bits when a regular file is
//! modified.
//!
//! Without it the kernel asks before every write(2) whether the file has a
//! security.capability attribute (one GETXATTR round trip per call, even with the writeback
//! cache). With it the kernel marks the superblock SB_NOSEC, asks once per inode, and leaves
//! the rest to us:
//! * WRITE carries FUSE_WRITE_KILL_SUIDGID when the writer lacks CAP_FSETID; SETATTR carries
//!   FATTR_KILL_SUIDGID for a chown of a non-directory, and for a truncate by a caller
//!   without CAP_FSETID. S_ISUID is cleared, and S_ISGID when group execute is set, as the
//!   protocol's description of the flag says. (Since Linux 6.2 the VFS also clears S_ISGID
//!   without group execute when the writer is not in the file's group; the server does not
//!   know the writer's groups, so such a file keeps the bit here.)
//! * File capabilities stay the kernel's job: it still asks once per inode, again after every
//!   attribute refresh (which clears S_NOSEC), and whenever an attribute in security.* is
//!   set through the mount, and drops them itself.
//! * fallocate and copy_file_range carry no flag, and the kernel leaves the bits alone for
//!   them; a caller other than uid 0 stands in for "lacks CAP_FSETID" there.

use super::fs::Filesystem;
use crate::errno::Errno;
use crate::store::{Ino, SetAttr};

/// The permission bits after a change by a caller without CAP_FSETID.
pub fn killed(perm: u32) -> u32 {
    let mut m = perm & !libc::S_ISUID;
    if m & libc::S_IXGRP != 0 {
        m &= !libc::S_ISGID;
    }
    m
}

/// Before `node`'s data changes on behalf of a caller without CAP_FSETID: clear its set-id
/// bits.
pub fn before_write(fs: &dyn Filesystem, node: Ino) -> Result<(), Errno> {
    let a = fs.getattr(node)?;
    let perm = a.mode & 0o7777;
    if a.mode & libc::S_IFMT == libc::S_IFREG && killed(perm) != perm {
        let set = SetAttr {
            mode: Some(killed(perm)),
            ..SetAttr::default()
        };
        fs.setattr(node, &set)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::killed;

    #[test]
    fn setgid_without_group_exec_stays() {
        assert_eq!(killed(0o6755), 0o755);
        assert_eq!(killed(0o6745), 0o2745);
        assert_eq!(killed(0o4700), 0o700);
        assert_eq!(killed(0o1777), 0o1777);
    }
}
