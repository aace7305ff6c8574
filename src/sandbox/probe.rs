//! `--mount-backend auto`: which backend can serve a sandbox here, decided by doing it. A
//! throwaway child process enters user (rootless) and mount namespaces of its own and tries a
//! real FUSE mount (/dev/fuse opened there, mounted with that descriptor: mount(2) needs no
//! server to succeed), then a real overlayfs mount of small scratch directories in the
//! project's directory. The first that mounts is the backend. Nothing outlives the child: its
//! mounts die with its namespace.

use std::io::{Read as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::path::Path;

use nix::sched::CloneFlags;

use super::request::MountBackend;
use crate::sys::ns::{self, Forked};

/// What the probe found: the backend, and why (each attempt's outcome).
#[derive(Debug, Clone)]
pub struct Choice {
    pub backend: MountBackend,
    pub reason: String,
}

/// Try FUSE, then overlayfs. Err carries both failures when neither mounts. The scratch
/// directories go under `project_dir`, where the overlayfs backend keeps its upper and work
/// directories: overlayfs takes an upper directory only on some filesystems (not on another
/// overlayfs, for one), so the attempt is made on the filesystem a run would use.
pub fn probe(project_dir: &Path) -> Result<Choice, String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = project_dir.join(format!("{SCRATCH}{}-{nanos}", std::process::id()));
    let scratch = Scratch(dir.clone());
    std::fs::create_dir(&dir).map_err(|e| format!("probe scratch {}: {e}", dir.display()))?;
    for d in ["fuse", "lower", "upper", "work", "merged"] {
        std::fs::create_dir(dir.join(d)).map_err(|e| format!("probe scratch: {e}"))?;
    }
    let (mut r, w) = std::os::unix::net::UnixStream::pair().map_err(|e| e.to_string())?;
    let (uid, gid) = crate::sys::ids::effective();
    let child = match ns::fork().map_err(|e| format!("fork: {e}"))? {
        Forked::Child => {
            drop(r);
            let line = attempts(&dir, uid, gid);
            let _ = (&w).write_all(line.as_bytes());
            ns::exit_now(0)
        }
        Forked::Parent(p) => p.as_raw(),
    };
    drop(w);
    let mut line = String::new();
    let _ = r.read_to_string(&mut line);
    let _ = ns::wait_child(child);
    drop(scratch);
    decide(&line)
}

/// The probe's scratch directory, removed with everything overlayfs left in it.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = remove_scratch(&self.0);
    }
}

/// The prefix of a probe's scratch directory in a project's directory (`probe-<pid>-<nanos>`).
const SCRATCH: &str = "probe-";

/// Remove a probe's scratch directory and everything overlayfs left in it.
pub fn remove_scratch(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    // Overlayfs leaves work/work with mode 0.
    let _ = std::fs::set_permissions(
        dir.join("work/work"),
        std::fs::Permissions::from_mode(0o700),
    );
    std::fs::remove_dir_all(dir)
}

/// Scratch directories in `project_dir` of probes that are gone (killed before they removed
/// theirs), with the pid each names.
pub fn leftover_scratch(project_dir: &Path) -> Vec<(std::path::PathBuf, u32)> {
    let Ok(rd) = std::fs::read_dir(project_dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let (pid, nanos) = name.strip_prefix(SCRATCH)?.split_once('-')?;
            let pid: u32 = pid.parse().ok()?;
            nanos.parse::<u32>().ok()?;
            (e.file_type().ok()?.is_dir() && !ns::running(pid as i32)).then(|| (e.path(), pid))
        })
        .collect();
    out.sort();
    out
}

/// The outcome of one attempt as the child reports it.
fn outcome(r: std::io::Result<()>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => e.to_string(),
    }
}

/// In the throwaway child: `fuse=<outcome>\toverlayfs=<outcome>`.
fn attempts(dir: &Path, uid: u32, gid: u32) -> String {
    let root = uid == 0;
    let entered = (|| {
        if !root {
            ns::unshare(CloneFlags::CLONE_NEWUSER)?;
            ns::map_self(uid, gid)?;
        }
        ns::unshare(CloneFlags::CLONE_NEWNS)?;
        ns::make_private(Path::new("/"))
    })();
    if let Err(e) = entered {
        let why = format!("namespaces: {e}");
        return format!("fuse={why}\toverlayfs={why}");
    }
    let fuse = crate::sys::mount::open_dev_fuse()
        .map_err(|e| std::io::Error::other(e.to_string()))
        .and_then(|fd| ns::mount_fuse(&dir.join("fuse"), fd.as_raw_fd(), uid, gid, false));
    let overlay = ns::mount_overlay(
        &dir.join("lower"),
        &dir.join("upper"),
        &dir.join("work"),
        &dir.join("merged"),
    );
    format!("fuse={}\toverlayfs={}", outcome(fuse), outcome(overlay))
}

/// The backend the child's report names, or both failures.
fn decide(line: &str) -> Result<Choice, String> {
    let get = |k: &str| {
        line.split('\t')
            .find_map(|f| f.strip_prefix(k)?.strip_prefix('='))
            .unwrap_or("the probe did not answer")
            .to_string()
    };
    let (fuse, overlay) = (get("fuse"), get("overlayfs"));
    if fuse == "ok" {
        return Ok(Choice {
            backend: MountBackend::Fuse,
            reason: "auto: a FUSE mount succeeded".into(),
        });
    }
    if overlay == "ok" {
        return Ok(Choice {
            backend: MountBackend::Overlayfs,
            reason: format!("auto: FUSE failed ({fuse}); an overlayfs mount succeeded"),
        });
    }
    Err(format!("FUSE: {fuse}; overlayfs: {overlay}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_backend_that_mounted_wins_and_both_failures_are_named() {
        let c = decide("fuse=ok\toverlayfs=ok").unwrap();
        assert_eq!(c.backend, MountBackend::Fuse);
        let c = decide("fuse=Permission denied (os error 13)\toverlayfs=ok").unwrap();
        assert_eq!(c.backend, MountBackend::Overlayfs);
        assert!(c.reason.contains("Permission denied"), "{}", c.reason);
        let e = decide("fuse=EACCES\toverlayfs=EPERM").unwrap_err();
        assert!(
            e.contains("FUSE: EACCES") && e.contains("overlayfs: EPERM"),
            "{e}"
        );
        assert!(decide("").is_err());
    }
}
