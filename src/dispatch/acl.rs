//! POSIX access ACLs written as the `system.posix_acl_access` attribute.
//!
//! The kernel is not asked to enforce ACLs (no FUSE_POSIX_ACL): permissions come from the mode
//! bits alone. Tools that copy files (`cp -a`, `mv` across filesystems) set a file's mode by
//! writing an access ACL, so that attribute must change the mode as it does on a local
//! filesystem: an ACL made only of the owner, group and other entries *is* the mode and is not
//! kept; a richer one is kept as data, and the mode takes its owner, mask (or group) and other
//! permissions.

use crate::errno::Errno;

pub const ACCESS: &[u8] = b"system.posix_acl_access";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// What an access ACL means for the mode.
#[derive(Debug, PartialEq, Eq)]
pub struct AclMode {
    /// The rwx bits for owner, group class and others (0o777 at most).
    pub perm: u32,
    /// Whether the ACL says more than the mode can (named entries): then it is kept.
    pub extended: bool,
}

/// Decode the kernel's xattr form of an access ACL; EINVAL when malformed.
pub fn parse(value: &[u8]) -> Result<AclMode, Errno> {
    let (head, rest) = value.split_at_checked(4).ok_or(Errno::EINVAL)?;
    if u32::from_le_bytes([head[0], head[1], head[2], head[3]]) != VERSION || rest.len() % 8 != 0 {
        return Err(Errno::EINVAL);
    }
    let (mut user, mut group, mut other, mut mask) = (None, None, None, None);
    let mut extended = false;
    for e in rest.chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u32::from(u16::from_le_bytes([e[2], e[3]]) & 7);
        match tag {
            USER_OBJ => user = Some(perm),
            GROUP_OBJ => group = Some(perm),
            OTHER => other = Some(perm),
            MASK => mask = Some(perm),
            USER | GROUP => extended = true,
            _ => return Err(Errno::EINVAL),
        }
    }
    let (Some(u), Some(g), Some(o)) = (user, group, other) else {
        return Err(Errno::EINVAL);
    };
    if extended && mask.is_none() {
        return Err(Errno::EINVAL);
    }
    let g = mask.unwrap_or(g);
    Ok(AclMode {
        perm: (u << 6) | (g << 3) | o,
        extended: extended || mask.is_some_and(|m| Some(m) != group),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16)]) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for (tag, perm) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&u32::MAX.to_le_bytes());
        }
        v
    }

    #[test]
    fn a_minimal_acl_is_the_mode() {
        let a = parse(&acl(&[(USER_OBJ, 7), (GROUP_OBJ, 5), (OTHER, 5)])).unwrap();
        assert_eq!(
            a,
            AclMode {
                perm: 0o755,
                extended: false
            }
        );
    }

    #[test]
    fn named_entries_are_kept_and_the_mask_is_the_group_class() {
        let a = parse(&acl(&[
            (USER_OBJ, 6),
            (USER, 6),
            (GROUP_OBJ, 4),
            (MASK, 6),
            (OTHER, 0),
        ]));
        assert_eq!(
            a.unwrap(),
            AclMode {
                perm: 0o660,
                extended: true
            }
        );
    }

    #[test]
    fn malformed_acls_are_rejected() {
        assert_eq!(parse(b"\x02\0\0"), Err(Errno::EINVAL));
        assert_eq!(parse(&acl(&[(USER_OBJ, 7)])), Err(Errno::EINVAL));
        assert_eq!(
            parse(&acl(&[
                (USER_OBJ, 7),
                (USER, 7),
                (GROUP_OBJ, 7),
                (OTHER, 7)
            ])),
            Err(Errno::EINVAL)
        );
        assert_eq!(parse(&acl(&[(0x40, 7)])), Err(Errno::EINVAL));
    }
}
