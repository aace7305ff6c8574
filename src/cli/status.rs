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
        "{:<8} {:<10} {:>12} {:>12} {:>12} {:<30} DATABASE",
        "PID", "TRANSPORT", "RING_REQS", "DEVFUSE_REQS", "WORKER_REQS", "MOUNT"
    );
    for s in &servers {
        let live = mounted.iter().any(|m| m.mount_point == s.mount_point);
        println!(
            "{:<8} {:<10} {:>12} {:>12} {:>12} {:<30} {}{}",
            s.pid,
            s.transport,
            s.ring_requests,
            s.devfuse_requests,
            s.worker_requests,
            s.mount_point.display(),
            s.db.display(),
            if live { "" } else { " (not mounted)" }
        );
        if let Some(log) = &s.log {
            println!("{:<8} log: {}", "", log.display());
        }
        if !s.lost.is_empty() {
            println!("{:<8} FAILED: {}", "", s.lost);
        }
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
