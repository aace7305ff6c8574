//! `agentfs status`

use crate::sys::{mounts, registry};

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_: Args) -> super::CliResult {
    let servers = registry::live();
    let mounted = mounts::agentfs_mounts();
    if servers.is_empty() && mounted.is_empty() {
        println!("no agentfs mounts");
        return Ok(0);
    }
    println!(
        "{:<8} {:<10} {:>12} {:>12} {:>12} {:>5} {:<30} DATABASE",
        "PID", "TRANSPORT", "RING_REQS", "DEVFUSE_REQS", "WORKER_REQS", "FREE", "MOUNT"
    );
    for s in &servers {
        let live = mounted.iter().any(|m| m.mount_point == s.mount_point);
        // The free pages' share of the database file (handed back when the mount is idle).
        let pages = crate::store::space::DbPages {
            pages: s.db_pages,
            free: s.free_pages,
            ..Default::default()
        };
        let free = if s.db_pages == 0 {
            "-".to_string()
        } else {
            format!("{}%", pages.free_percent())
        };
        println!(
            "{:<8} {:<10} {:>12} {:>12} {:>12} {:>5} {:<30} {}{}",
            s.pid,
            s.transport,
            s.ring_requests,
            s.devfuse_requests,
            s.worker_requests,
            free,
            s.mount_point.display(),
            s.db.display(),
            if live { "" } else { " (not mounted)" }
        );
    }
    for m in mounted
        .iter()
        .filter(|m| !servers.iter().any(|s| s.mount_point == m.mount_point))
    {
        println!(
            "{:<8} {:<10} {:<30} ? (no live server: agentfs umount --force)",
            "-",
            "-",
            m.mount_point.display()
        );
    }
    Ok(0)
}
