//! A cgroup v2 directory made for one sandbox, used for its freezer: `cgroup.procs` to move a
//! process in, `cgroup.freeze` and `cgroup.events` to stop and resume every process inside.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup` on a pure v2 system,
/// `/sys/fs/cgroup/unified` on a hybrid one), from this process's mount table.
pub fn v2_mount() -> Option<PathBuf> {
    crate::sys::mounts::all()
        .into_iter()
        .find(|m| m.fstype == "cgroup2")
        .map(|m| m.mount_point)
}

/// Remove the cgroups (`<name>-<pid>`) of supervisors that died without removing theirs (a
/// SIGKILL); one that still holds processes stays (rmdir refuses).
fn remove_stale(parent: &Path) {
    let Ok(dir) = std::fs::read_dir(parent) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.rsplit_once('-'))
            .and_then(|(_, pid)| pid.parse::<i32>().ok());
        if pid.is_some_and(|p| !crate::sys::ns::alive(p)) {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// A cgroup this process created; removed on drop (once its processes are gone).
#[derive(Debug)]
pub struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    /// Create `<v2 mount>/agentfs/<name>`. Fails when there is no v2 hierarchy or this user
    /// may not create cgroups there (no delegated subtree).
    pub fn create(name: &str) -> io::Result<Cgroup> {
        let root = v2_mount().ok_or_else(|| io::Error::other("no cgroup2 hierarchy is mounted"))?;
        let parent = root.join("agentfs");
        match std::fs::create_dir(&parent) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("{}: {e}", parent.display()),
                ))
            }
            _ => {}
        }
        remove_stale(&parent);
        let dir = parent.join(name);
        std::fs::create_dir(&dir)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
        let cg = Cgroup { dir };
        if !cg.dir.join("cgroup.freeze").exists() {
            return Err(io::Error::other(format!(
                "{}: no cgroup.freeze (kernel before 5.2)",
                cg.dir.display()
            )));
        }
        Ok(cg)
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Move process `pid` (and so every child it forks afterwards) into this cgroup.
    pub fn add(&self, pid: i32) -> io::Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
    }

    fn frozen(&self) -> io::Result<bool> {
        let events = std::fs::read_to_string(self.dir.join("cgroup.events"))?;
        Ok(events.lines().any(|l| l.trim() == "frozen 1"))
    }

    /// Stop every process inside and wait (at most `wait`) until the kernel reports them all
    /// stopped. On a timeout the cgroup is thawed again and the error says so.
    pub fn freeze(&self, wait: Duration) -> io::Result<()> {
        std::fs::write(self.dir.join("cgroup.freeze"), "1")?;
        let until = Instant::now() + wait;
        loop {
            match self.frozen() {
                Ok(true) => return Ok(()),
                Ok(false) if Instant::now() < until => std::thread::sleep(Duration::from_millis(1)),
                Ok(false) => {
                    let _ = self.thaw();
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("not frozen after {} ms", wait.as_millis()),
                    ));
                }
                Err(e) => {
                    let _ = self.thaw();
                    return Err(e);
                }
            }
        }
    }

    pub fn thaw(&self) -> io::Result<()> {
        std::fs::write(self.dir.join("cgroup.freeze"), "0")
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = self.thaw();
        // Processes leave a cgroup as they are reaped: give the last ones a moment.
        for _ in 0..50 {
            match std::fs::remove_dir(&self.dir) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::ns::{fork_into_cgroup, Forked};
    use std::os::fd::AsFd as _;

    /// A child made by `fork_into_cgroup` is in the cgroup from its first instruction: its
    /// /proc/PID/cgroup names it while it has done nothing but wait.
    #[test]
    fn a_child_forked_into_a_cgroup_starts_inside_it() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIP: cgroups are created as root here");
            return;
        }
        let cg = match Cgroup::create(&format!("unit-fork-{}", std::process::id())) {
            Ok(cg) => cg,
            Err(e) => {
                eprintln!("SKIP: no cgroup v2 to create one in: {e}");
                return;
            }
        };
        let dir = std::fs::File::open(cg.path()).unwrap();
        match fork_into_cgroup(dir.as_fd()).unwrap() {
            Forked::Child => {
                // SAFETY: pause and _exit are async-signal-safe; the parent ends this child
                // with SIGKILL.
                unsafe {
                    libc::pause();
                    libc::_exit(0)
                }
            }
            Forked::Parent(child) => {
                let pid = child.as_raw();
                let seen = std::fs::read_to_string(format!("/proc/{pid}/cgroup"));
                // SAFETY: `pid` is our own child, not yet reaped.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, std::ptr::null_mut(), 0);
                }
                let seen = seen.unwrap();
                let name = cg
                    .path()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                let line = seen.lines().find(|l| l.starts_with("0::")).unwrap_or("");
                assert!(
                    line.ends_with(&format!("/agentfs/{name}")),
                    "the child is in {line:?}, not in {name}"
                );
            }
        }
    }
}
