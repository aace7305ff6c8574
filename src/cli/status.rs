//! `agentfs status [NAME] [--all] [--json]`

use serde_json::{json, Value};

use crate::knobs::Knobs;
use crate::project::{self, Project};
use crate::replica;
use crate::sys::{mounts, registry};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Show only this project (no mounts).
    pub name: Option<String>,
    /// Also list other users' agentfs mounts (by default only the caller's own are listed).
    #[arg(long)]
    pub all: bool,
    /// Print {"mounts": [...], "projects": [...]} as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args, knobs: &Knobs) -> super::CliResult {
    // Without a home there are no projects to list, and the mounts are still shown.
    let root = project::root(knobs);
    // With a name: that project's directory, whose databases the mounts and replications
    // shown are narrowed to.
    let mut only: Option<std::path::PathBuf> = None;
    let projects: Vec<(String, Result<Project, project::Error>)> = match (&a.name, root) {
        (Some(n), root) => {
            let p = root.and_then(|r| Project::open(&r, n));
            let p = p.map_err(|e| e.to_string())?;
            only = Some(p.dir.clone());
            vec![(n.clone(), Ok(p))]
        }
        (None, Ok(root)) => Project::list(&root),
        (None, Err(_)) => Vec::new(),
    };
    let projects: Vec<Value> = projects
        .into_iter()
        .map(|(n, p)| project_json(&n, p))
        .collect();
    if a.json {
        let mounts = match &only {
            None => mounts_json(a.all),
            Some(dir) => registry::live()
                .iter()
                .filter(|s| s.db.starts_with(dir))
                .map(server_json)
                .collect(),
        };
        let replications =
            replications_json(knobs, |db| only.as_ref().is_none_or(|d| db.starts_with(d)));
        super::say(format_args!(
            "{}",
            json!({ "mounts": mounts, "replications": replications, "projects": projects })
        ));
        return Ok(0);
    }
    if a.name.is_none() {
        print_mounts(a.all);
        print_replications(knobs);
    }
    print_projects(&projects);
    Ok(0)
}

/// One project as JSON: name, source, position, delta size, the live sandbox (its pids, each
/// checked alive), the last run record; a project whose config cannot be read gives its error.
fn project_json(name: &str, p: Result<Project, project::Error>) -> Value {
    let p = match p {
        Ok(p) => p,
        Err(e) => return json!({ "name": name, "error": e.to_string() }),
    };
    // The sandbox's own reading of its marker: live only while its supervisor and pid 1 are.
    let live = crate::sandbox::live(&p.dir);
    let pids: Vec<Value> = live
        .iter()
        .flat_map(|m| {
            [
                ("supervisor", m.supervisor),
                ("pid1", m.pid1),
                ("server", m.server),
            ]
        })
        .map(|(role, pid)| json!({ "role": role, "pid": pid, "alive": true }))
        .collect();
    json!({
        "name": p.name,
        "dir": p.dir,
        "source": p.source(),
        "position": position(&p),
        "backend": p.config.project.backend,
        "delta_bytes": p.delta_bytes(),
        "live": live.is_some(),
        "pids": pids,
        "live_record": live,
        "last_run": crate::sandbox::latest_record(&p.dir),
        "escape_attempts": escape_attempts(&p.dir),
        "capacity_exhausted_since": crate::store::space::full_since(&p.db()),
    })
}

/// The project's flag for logged escape attempts (null without any): the code, how many, the
/// last one and the log.
fn escape_attempts(dir: &std::path::Path) -> Value {
    use crate::sandbox::audit;
    match audit::summary(dir) {
        None => Value::Null,
        Some((count, last)) => json!({
            "code": crate::errors::Code::EscapeAttempt.as_str(),
            "count": count,
            "last": last,
            "log": audit::path(dir),
        }),
    }
}

/// Where the project stands: its HEAD snapshot (short hash and tags; null without snapshots)
/// and how many paths of the delta differ from the real directory, not yet applied (null with
/// the reason when the delta cannot be read).
fn position(p: &Project) -> Value {
    let store = p.dir.join(project::HISTORY);
    let head = if store.is_dir() {
        crate::history::History::open(&store)
            .and_then(|mut h| h.log_upto(1))
            .map(|log| log.into_iter().next())
    } else {
        Ok(None)
    };
    let head = match head {
        Ok(Some(i)) => json!({
            "hash": crate::history::object::hex(&i.hash),
            "tags": i.tags,
        }),
        Ok(None) => Value::Null,
        Err(e) => json!({ "error": e }),
    };
    match p.unapplied() {
        Ok(n) => json!({ "head": head, "unapplied_changes": n }),
        Err(e) => json!({ "head": head, "unapplied_changes": null, "error": e }),
    }
}

/// The position column: HEAD (12 hex digits and its tags) or "no snapshots", then the count
/// of unapplied changes.
fn position_text(pos: &Value) -> String {
    let head = match &pos["head"] {
        Value::Null => "no snapshots".to_string(),
        h => match (h["hash"].as_str(), h["tags"].as_array()) {
            (Some(hash), tags) => {
                let tags: Vec<&str> = tags
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                let short = hash.get(..12).unwrap_or(hash);
                if tags.is_empty() {
                    short.to_string()
                } else {
                    format!("{short} ({})", tags.join(","))
                }
            }
            _ => "history unreadable".to_string(),
        },
    };
    match pos["unapplied_changes"].as_u64() {
        Some(0) => format!("{head}, nothing to apply"),
        Some(n) => format!("{head}, {n} unapplied"),
        None => format!("{head}, delta unreadable"),
    }
}

fn print_projects(projects: &[Value]) {
    if projects.is_empty() {
        return;
    }
    println!();
    println!(
        "{:<20} {:>10} {:<24} {:<36} SOURCE",
        "PROJECT", "DELTA", "SANDBOX", "POSITION"
    );
    for p in projects {
        let name = p["name"].as_str().unwrap_or("?");
        if let Some(err) = p["error"].as_str() {
            println!("{name:<20} {:>10} {:<24} {:<36} {err}", "-", "-", "-");
            continue;
        }
        let sandbox = if p["live"] == json!(true) {
            let pids: Vec<String> = p["pids"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|x| x["alive"] == json!(true))
                .map(|x| x["pid"].to_string())
                .collect();
            let replicated = if p["live_record"]["replicate"].is_string() {
                ", replicated"
            } else {
                ""
            };
            format!("live, pids {}{replicated}", pids.join(","))
        } else {
            "-".into()
        };
        let source = p["source"].as_str().unwrap_or("(none yet)");
        println!(
            "{name:<20} {:>10} {sandbox:<24} {:<36} {source}",
            p["delta_bytes"].as_u64().unwrap_or(0),
            position_text(&p["position"])
        );
        let flag = &p["escape_attempts"];
        if let Some(n) = flag["count"].as_u64() {
            let last = &flag["last"];
            println!(
                "{:<20} {}: {n} refused, last {} {} (pid {}); see {}",
                "",
                flag["code"].as_str().unwrap_or("?"),
                last["operation"].as_str().unwrap_or("?"),
                last["path"].as_str().unwrap_or("?"),
                last["pid"],
                flag["log"].as_str().unwrap_or("?")
            );
        }
        if let Some(t) = p["capacity_exhausted_since"].as_u64() {
            println!(
                "{:<20} DIRTY: out of space since {} (a write was refused with ENOSPC; what \
                 was committed is kept)",
                "",
                super::history::utc(t as i64)
            );
        }
    }
}

/// Every live replication: its owner and Litestream pids, and per database the replica's
/// position and lag (docs: "Many machines").
/// The live replications, those with a database `keep` accepts (their positions asked of
/// Litestream only for those).
fn replications_json(knobs: &Knobs, keep: impl Fn(&std::path::Path) -> bool) -> Vec<Value> {
    replica::live()
        .iter()
        .filter(|r| r.dbs.iter().any(|(db, _)| keep(db)))
        .map(|r| {
            json!({
                "pid": r.pid,
                "litestream_pid": r.litestream_pid,
                "litestream_alive": std::path::Path::new(&format!("/proc/{}", r.litestream_pid)).exists(),
                "log": r.log,
                "databases": replica::positions(r, knobs),
            })
        })
        .collect()
}

fn print_replications(knobs: &Knobs) {
    let live = replications_json(knobs, |_| true);
    if live.is_empty() {
        return;
    }
    println!(
        "{:<8} {:<10} {:>10} {:>10} {:>8} {:<22} DATABASE -> REPLICA",
        "PID", "LITESTREAM", "LOCAL_TX", "REPLICA_TX", "LAG_TX", "REPLICA_TIME"
    );
    let num = |v: &Value| v.as_u64().map_or("?".to_string(), |n| n.to_string());
    for r in &live {
        let ls = if r["litestream_alive"] == true {
            num(&r["litestream_pid"])
        } else {
            "exited".to_string()
        };
        for d in r["databases"].as_array().into_iter().flatten() {
            println!(
                "{:<8} {:<10} {:>10} {:>10} {:>8} {:<22} {} -> {}",
                num(&r["pid"]),
                ls,
                num(&d["local_txid"]),
                num(&d["replica_txid"]),
                num(&d["lag_txns"]),
                d["replica_time"].as_str().unwrap_or("-"),
                d["db"].as_str().unwrap_or("?"),
                d["url"].as_str().unwrap_or("?"),
            );
            if let Some(e) = d["error"].as_str() {
                println!("         last error: {e}");
            }
        }
    }
}

fn mounts_json(all: bool) -> Vec<Value> {
    let me = crate::sys::ids::effective().0;
    let servers = registry::live();
    let mut out: Vec<Value> = servers.iter().map(server_json).collect();
    out.extend(
        mounts::agentfs_mounts()
            .into_iter()
            .filter(|m| all || m.owner == Some(me))
            .filter(|m| !servers.iter().any(|s| s.mount_point == m.mount_point))
            .map(|m| json!({ "pid": null, "mount_point": m.mount_point, "owner": m.owner })),
    );
    out
}

/// One live server as JSON: where it serves what, its request counters and its memory.
fn server_json(s: &registry::ServerRecord) -> Value {
    json!({
        "pid": s.pid,
        "transport": s.transport,
        "mount_point": s.mount_point,
        "db": s.db,
        "log": s.log,
        "lost": s.lost,
        "requests": {
            "ring": s.ring_requests,
            "devfuse": s.devfuse_requests,
            "forgets": s.forgets,
            "worker": s.worker_requests,
            "polled": s.polled,
        },
        "memory": memory_json(&s.memory),
    })
}

fn print_mounts(all: bool) {
    let me = crate::sys::ids::effective().0;
    let servers = registry::live();
    let mounted: Vec<_> = mounts::agentfs_mounts()
        .into_iter()
        .filter(|m| all || m.owner == Some(me))
        .collect();
    if servers.is_empty() && mounted.is_empty() {
        println!("no agentfs mounts");
        return;
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
}

/// The server's resident memory and the budget's breakdown by consumer, in bytes (null before
/// the server first measured them).
fn memory_json(m: &crate::memory::Usage) -> Value {
    if m.budget == 0 {
        return Value::Null;
    }
    json!({
        "rss": m.rss,
        "budget": m.budget,
        "sqlite": m.sqlite,
        "caches": m.caches,
        "write_batches": m.batch,
        "request_buffers": m.transport,
        "reusable_buffers": m.buffers,
    })
}

/// The server's resident memory and the budget's breakdown by consumer, in MiB.
fn memory_line(m: &crate::memory::Usage) -> String {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    format!(
        "memory: rss {:.1} MiB; budget {:.0} MiB: sqlite {:.1}, caches {:.1}, write batches {:.1}, \
         request buffers {:.1}, reusable buffers {:.1}",
        mib(m.rss),
        mib(m.budget),
        mib(m.sqlite),
        mib(m.caches),
        mib(m.batch),
        mib(m.transport),
        mib(m.buffers)
    )
}
