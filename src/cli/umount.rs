//! `agentfs umount MNT [--force]`: unmount, then wait for the server's final commit and
//! report its outcome (exit status 1 and what was lost when a commit failed).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::sys::{mount, mounts, registry};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The mount point.
    pub mount_point: PathBuf,
    /// Abort the FUSE connection (for a hung or dead server) and detach the mount. Pending
    /// requests fail with ENOTCONN; data not yet synced may be lost. Safe to repeat.
    #[arg(long)]
    pub force: bool,
    /// How long to wait for the server's final commit after the unmount, in seconds.
    #[arg(long, default_value_t = 60)]
    pub wait: u64,
}

pub fn run(a: Args) -> super::CliResult {
    let mnt = std::fs::canonicalize(&a.mount_point).unwrap_or_else(|_| a.mount_point.clone());
    let entry = mounts::find(&mnt);
    let server = registry::live().into_iter().find(|r| r.mount_point == mnt);
    match (&entry, a.force) {
        (None, true) => return Ok(0),
        (None, false) => return Err(format!("{} is not mounted", mnt.display())),
        (Some(e), _) if !e.fstype.starts_with("fuse") => {
            return Err(format!(
                "{} is not a FUSE mount ({})",
                mnt.display(),
                e.fstype
            ))
        }
        _ => {}
    }
    if a.force {
        if let Some(e) = &entry {
            mounts::abort_connection(e).map_err(|err| format!("abort {}: {err}", mnt.display()))?;
        }
        mount::unmount(&mnt, true).map_err(|e| format!("unmount {}: {e}", mnt.display()))?;
    } else {
        mount::unmount(&mnt, false).map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => format!(
                "{} is busy (files open or a process inside); close them or use --force",
                mnt.display()
            ),
            _ => format!("unmount {}: {e}", mnt.display()),
        })?;
    }
    // The server finishes its last commit and checkpoint after the kernel lets go.
    let Some(rec) = server else {
        return Ok(0);
    };
    let proc_dir = PathBuf::from(format!("/proc/{}", rec.pid));
    let deadline = Instant::now() + Duration::from_secs(a.wait);
    while proc_dir.exists() && !is_zombie(&proc_dir) {
        if Instant::now() > deadline {
            return Err(format!(
                "unmounted {}, but server pid {} is still writing the database after {}s \
                 (the database is not final until it exits)",
                mnt.display(),
                rec.pid,
                a.wait
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = rec
        .log
        .map(|l| format!(" (log: {})", l.display()))
        .unwrap_or_default();
    match registry::take_exit(rec.pid) {
        Some(Ok(())) => Ok(0),
        // --force aborts the connection: whatever the server reports, the user was warned.
        _ if a.force => Ok(0),
        Some(Err(what)) => Err(format!(
            "unmounted {}, but server pid {}: {what}{log}",
            mnt.display(),
            rec.pid
        )),
        None => Err(format!(
            "unmounted {}, but server pid {} ended without reporting its final commit \
             (killed?); acknowledged work may be lost{log}",
            mnt.display(),
            rec.pid
        )),
    }
}

fn is_zombie(proc_dir: &std::path::Path) -> bool {
    std::fs::read_to_string(proc_dir.join("stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}
