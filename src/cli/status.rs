//! `agentfs status [--all]`

use crate::sys::{mounts, registry};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Also list other users' agentfs mounts (by default only the caller's own are listed).
    #[arg(long)]
    pub all: bool,
}

pub fn run(a: Args) -> super::CliResult {
    let me = crate::sys::ids::effective().0;
    let servers = registry::live();
    let mounted: Vec<_> = mounts::agentfs_mounts()
        .into_iter()
        .filter(|m| a.all || m.owner == Some(me))
        .collect();
    if servers.is_empty() && mounted.is_empty() {
        println!("no agentfs mounts");
        return Ok(0);
    }
    println!(
        "{:<8} {:<10} {:>12} {:>12} {:>10} {:>12} {:>5} {:<30} DATABASE",
        "PID", "TRANSPORT", "RING_REQS", "DEVFUSE_REQS", "FORGETS", "WORKER_REQS", "FREE", "MOUNT"
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
            "{:<8} {:<10} {:>12} {:>12} {:>10} {:>12} {:>5} {:<30} {}{}",
            s.pid,
            s.transport,
            s.ring_requests,
            s.devfuse_requests,
            s.forgets,
            s.worker_requests,
            free,
            s.mount_point.display(),
            s.db.display(),
            if live { "" } else { " (not mounted)" }
        );
        if s.memory.budget > 0 {
            println!("{:<8} {}", "", memory_line(&s.memory));
        }
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
        let why = match m.owner {
            Some(uid) if uid != me => format!("? (mounted by user {uid})"),
            _ => "? (no live server: agentfs umount --force)".to_string(),
        };
        println!(
            "{:<8} {:<10} {:<30} {why}",
            "-",
            "-",
            m.mount_point.display()
        );
    }
    Ok(0)
}

/// The server's resident memory and the budget's breakdown by consumer, in MiB.
fn memory_line(m: &crate::memory::Usage) -> String {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    format!(
        "memory: rss {:.1} MiB; budget {:.0} MiB: sqlite {:.1}, caches {:.1}, write batches {:.1}, \
         request buffers {:.1}",
        mib(m.rss),
        mib(m.budget),
        mib(m.sqlite),
        mib(m.caches),
        mib(m.batch),
        mib(m.transport)
    )
}
