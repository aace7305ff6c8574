//! Reading the mount table (/proc/self/mountinfo) and aborting stuck FUSE connections (fusectl).

use std::path::{Path, PathBuf};

/// One line of /proc/self/mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    pub major: u32,
    pub minor: u32,
    pub fstype: String,
    pub source: String,
    /// The user a FUSE mount belongs to (its `user_id=` option); None for other filesystems.
    pub owner: Option<u32>,
}

/// Undo the octal escapes (\040 for space, ...) of mountinfo fields.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() && field.is_char_boundary(i + 4) {
            if let Ok(v) = u8::from_str_radix(&field[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let _id = l.next()?;
    let _parent = l.next()?;
    let (maj, min) = l.next()?.split_once(':')?;
    let _root = l.next()?;
    let mount_point = PathBuf::from(unescape(l.next()?));
    let mut r = right.split(' ');
    let fstype = r.next()?.to_string();
    let source = unescape(r.next()?);
    let owner = r
        .next()
        .and_then(|opts| opts.split(',').find_map(|o| o.strip_prefix("user_id=")))
        .and_then(|v| v.parse().ok());
    Some(MountEntry {
        mount_point,
        major: maj.parse().ok()?,
        minor: min.parse().ok()?,
        fstype,
        source,
        owner,
    })
}

/// Every mount visible to this process.
pub fn all() -> Vec<MountEntry> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|s| s.lines().filter_map(parse_line).collect())
        .unwrap_or_default()
}

/// The topmost mount at exactly `path` (which should be canonical), if any.
pub fn find(path: &Path) -> Option<MountEntry> {
    all().into_iter().rev().find(|m| m.mount_point == path)
}

/// The mount-table spelling of a mount point named by the user, found without stat-ing the
/// mount itself (a stat of a FUSE mount's root waits for its server, which may not answer):
/// the parent directory is resolved and the last name kept. When that is not a mount point
/// (e.g. `path` is a symlink to one), the whole path is resolved.
pub fn locate(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    if let (Some(dir), Some(name)) = (abs.parent(), abs.file_name()) {
        if let Ok(dir) = std::fs::canonicalize(dir) {
            let outside = dir.join(name);
            if is_mount_point(&outside) {
                return outside;
            }
        }
    }
    std::fs::canonicalize(&abs).unwrap_or(abs)
}

/// Whether `path` (canonical) is a mount point.
pub fn is_mount_point(path: &Path) -> bool {
    find(path).is_some()
}

/// Our mounts: FUSE mounts of type fuse.agentfs.
pub fn agentfs_mounts() -> Vec<MountEntry> {
    all()
        .into_iter()
        .filter(|m| m.fstype == format!("fuse.{}", super::mount::FS_NAME))
        .collect()
}

const FUSECTL: &str = "/sys/fs/fuse/connections";

/// The fusectl directory of the FUSE connection behind `entry` (mounting fusectl if needed).
fn connection_dir(entry: &MountEntry) -> std::io::Result<PathBuf> {
    if !entry.fstype.starts_with("fuse") {
        return Err(std::io::Error::other(format!(
            "{} is not a FUSE mount",
            entry.mount_point.display()
        )));
    }
    let dir = Path::new(FUSECTL);
    if std::fs::read_dir(dir)
        .map(|mut d| d.next().is_none())
        .unwrap_or(true)
    {
        // fusectl may not be mounted yet.
        let _ = std::process::Command::new("mount")
            .args(["-t", "fusectl", "none", FUSECTL])
            .stderr(std::process::Stdio::null())
            .status();
    }
    // The connection id is the minor number of the anonymous device FUSE mounts use.
    Ok(dir.join(entry.minor.to_string()))
}

/// Requests of the connection behind `entry` that wait for the server's answer (fusectl's
/// `waiting`); None when it cannot be read.
pub fn waiting_requests(entry: &MountEntry) -> Option<u64> {
    let text = std::fs::read_to_string(connection_dir(entry).ok()?.join("waiting")).ok()?;
    text.trim().parse().ok()
}

/// Abort the FUSE connection behind `mnt` through fusectl, so every waiting request fails with
/// ENOTCONN and the mount can be detached. Safe to repeat.
pub fn abort_connection(entry: &MountEntry) -> std::io::Result<()> {
    let abort = connection_dir(entry)?.join("abort");
    match std::fs::write(&abort, b"1") {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_lines() {
        let l = "36 35 0:52 / /mnt/a\\040b rw,nosuid - fuse.agentfs agentfs rw,user_id=0";
        let m = parse_line(l).expect("parses");
        assert_eq!(m.mount_point, PathBuf::from("/mnt/a b"));
        assert_eq!((m.major, m.minor), (0, 52));
        assert_eq!(m.fstype, "fuse.agentfs");
        assert_eq!(m.source, "agentfs");
        assert_eq!(m.owner, Some(0));
        let l = "36 35 0:52 / /mnt/b rw - fuse.agentfs agentfs rw,user_id=1000,group_id=1000";
        assert_eq!(parse_line(l).and_then(|m| m.owner), Some(1000));
        let l = "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw";
        assert_eq!(parse_line(l).and_then(|m| m.owner), None);
        assert!(parse_line("garbage").is_none());
    }
}
