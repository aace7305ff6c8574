//! `agentfs umount MNT [--force]`: unmount, then wait for the server's final commit and
//! report its outcome (exit status 1 and what was lost when a commit failed).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{CliError, Code};
use crate::sys::{mount, mounts, registry};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The mount point.
    pub mount_point: PathBuf,
    /// Abort the FUSE connection (for a hung, stopped or dead server) and detach the mount,
    /// without waiting for the server to answer. Pending requests fail with ENOTCONN; writes
    /// the kernel still held are lost. The server is left running (or stopped) so it can
    /// commit what it acknowledged; a stopped one is reported, with its pid, and the exit
    /// status is 1 until it finishes. Safe to repeat.
    #[arg(long)]
    pub force: bool,
    /// How long to wait for the server's final commit after the unmount, in seconds.
    #[arg(long, default_value_t = 60)]
    pub wait: u64,
}

pub fn run(a: Args) -> super::CliResult {
    let mnt = mounts::locate(&a.mount_point);
    let entry = mounts::find(&mnt);
    let server = registry::live().into_iter().find(|r| r.mount_point == mnt);
    match (&entry, a.force) {
        (None, true) => return Ok(0),
        (None, false) => {
            return Err(
                CliError::new(Code::NotFound, format!("{} is not mounted", mnt.display())).at(&mnt),
            )
        }
        (Some(e), _) if !e.fstype.starts_with("fuse") => {
            return Err(CliError::new(
                Code::MountPointConflict,
                format!("{} is not a FUSE mount ({})", mnt.display(), e.fstype),
            )
            .at(&mnt))
        }
        _ => {}
    }
    let pid = server.as_ref().map(|r| r.pid);
    if a.force {
        if let Some(e) = &entry {
            mounts::abort_connection(e).map_err(|err| format!("abort {}: {err}", mnt.display()))?;
            println!("aborted FUSE connection {} of {}", e.minor, mnt.display());
        }
        mount::unmount(&mnt, true).map_err(|e| format!("unmount {}: {e}", mnt.display()))?;
        println!("detached {}", mnt.display());
        if let Some(pid) = pid.filter(|&p| stopped(p)) {
            return Err(busy(
                format!(
                    "server pid {pid} is stopped and was left so: it commits what it acknowledged \
                 and exits once continued (kill -CONT {pid}); the database is not final before"
                ),
                &mnt,
            ));
        }
    } else {
        // A stopped server cannot answer: the unmount would wait for it (writing back cached
        // pages) or fail as busy because of callers stuck waiting.
        if let Some(pid) = pid.filter(|&p| stopped(p)) {
            return Err(busy(
                format!(
                    "{} is not answering: server pid {pid} is stopped (continue it with \
                     kill -CONT {pid}, or use --force)",
                    mnt.display()
                ),
                &mnt,
            ));
        }
        mount::unmount(&mnt, false).map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => match entry.as_ref().and_then(stuck_requests) {
                Some(n) => busy(
                    format!(
                        "{} is not answering: {n} requests have waited over a second for the \
                         server; use --force",
                        mnt.display()
                    ),
                    &mnt,
                ),
                None => busy(
                    format!(
                        "{} is busy (files open or a process inside); close them or use --force",
                        mnt.display()
                    ),
                    &mnt,
                ),
            },
            _ => CliError::new(Code::of_io(&e), format!("unmount {}: {e}", mnt.display())).at(&mnt),
        })?;
    }
    // The server finishes its last commit and checkpoint after the kernel lets go.
    let Some(rec) = server else {
        return Ok(0);
    };
    let deadline = Instant::now() + Duration::from_secs(a.wait);
    while crate::sys::ns::running(rec.pid as i32) {
        if a.force && stopped(rec.pid) {
            return Err(busy(
                format!(
                    "server pid {} stopped before it finished; continue it (kill -CONT {})",
                    rec.pid, rec.pid
                ),
                &mnt,
            ));
        }
        if Instant::now() > deadline {
            return Err(busy(
                format!(
                    "unmounted {}, but server pid {} is still writing the database after {}s \
                     (the database is not final until it exits)",
                    mnt.display(),
                    rec.pid,
                    a.wait
                ),
                &mnt,
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
        Some(Err(what)) => {
            // The server's own failure, or (its database final) a last replication pass that
            // did not finish.
            let behind = format!("{}: ", Code::ReplicaBehind);
            let (code, what) = match what.strip_prefix(&behind) {
                Some(rest) => (Code::ReplicaBehind, rest),
                None => (Code::ServerFailed, what.as_str()),
            };
            Err(CliError::new(
                code,
                format!(
                    "unmounted {}, but server pid {}: {what}{log}",
                    mnt.display(),
                    rec.pid
                ),
            )
            .at(&mnt))
        }
        None => Err(CliError::new(
            Code::ServerFailed,
            format!(
                "unmounted {}, but server pid {} ended without reporting its final commit \
                 (killed?); acknowledged work may be lost{log}",
                mnt.display(),
                rec.pid
            ),
        )
        .at(&mnt)),
    }
}

/// The server or the kernel holds the mount: the busy refusal.
fn busy(message: String, mnt: &Path) -> CliError {
    CliError::new(Code::Busy, message).at(mnt)
}

/// Whether process `pid` is stopped (SIGSTOP, or a tracer holds it).
fn stopped(pid: u32) -> bool {
    matches!(crate::sys::ns::state(pid as i32), Some('T' | 't'))
}

/// Requests that keep the connection behind `entry` waiting for about a second: the count
/// never drops to zero while it is sampled. None when the server answers (or it is unknown).
fn stuck_requests(entry: &mounts::MountEntry) -> Option<u64> {
    let mut least = u64::MAX;
    for _ in 0..20 {
        least = least.min(mounts::waiting_requests(entry)?);
        if least == 0 {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(least)
}
