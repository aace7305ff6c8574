//! The record of live servers, for `agentfs status`: one small file per server pid in a runtime
//! directory (/run/agentfs for root, $XDG_RUNTIME_DIR/agentfs or /tmp/agentfs-UID otherwise).
//! The record is advisory; status cross-checks it with /proc and the mount table. Beside it: a
//! background server's log (`PID.log`) and, once a server has ended, its outcome (`PID.exit`),
//! which `agentfs umount` reads and removes.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Logs and outcomes of servers that ended are removed after this long.
const KEEP_ENDED: Duration = Duration::from_secs(24 * 3600);

/// One live (or stale) server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerRecord {
    pub pid: u32,
    pub db: PathBuf,
    pub mount_point: PathBuf,
    /// "io-uring" or "dev-fuse", as the kernel accepted it.
    pub transport: String,
    pub ring_queues: usize,
    pub ring_requests: u64,
    /// Requests answered over /dev/fuse.
    pub devfuse_requests: u64,
    /// FORGETs and INTERRUPTs read from /dev/fuse (no reply; on a ring mount they still come
    /// this way).
    pub forgets: u64,
    /// Requests a transport thread handed to a worker instead of running them itself.
    pub worker_requests: u64,
    /// Times a /dev/fuse thread polling for the next request found one (`AGENTFS_FUSE_SPIN_US`).
    pub polled: u64,
    /// Where the server logs (a background server; empty: its standard error).
    pub log: Option<PathBuf>,
    /// What a failed commit lost (empty while nothing was).
    pub lost: String,
    /// Pages of the database, and those on its free list.
    pub db_pages: u64,
    pub free_pages: u64,
    /// Resident memory and the memory budget's breakdown by consumer.
    pub memory: crate::memory::Usage,
}

pub fn runtime_dir() -> PathBuf {
    let uid = super::ids::effective().0;
    if uid == 0 {
        return PathBuf::from("/run/agentfs");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("agentfs"),
        _ => PathBuf::from(format!("/tmp/agentfs-{uid}")),
    }
}

fn record_path(pid: u32) -> PathBuf {
    runtime_dir().join(format!("{pid}.server"))
}

/// Where the background server `pid` logs.
pub fn log_path(pid: u32) -> PathBuf {
    runtime_dir().join(format!("{pid}.log"))
}

fn exit_path(pid: u32) -> PathBuf {
    runtime_dir().join(format!("{pid}.exit"))
}

/// Leave the ending server's outcome for `agentfs umount`: `None` when everything it
/// acknowledged is in the database, else what went wrong (one line).
pub fn record_exit(pid: u32, failure: Option<&str>) -> std::io::Result<()> {
    let text = match failure {
        None => "ok\n".to_string(),
        Some(msg) => format!("error: {}\n", msg.replace('\n', " ")),
    };
    std::fs::create_dir_all(runtime_dir())?;
    std::fs::write(exit_path(pid), text)
}

/// The outcome server `pid` left (and remove it): `Some(Ok)` clean, `Some(Err(what))`, or
/// `None` when it left none (it was killed, or never registered).
pub fn take_exit(pid: u32) -> Option<Result<(), String>> {
    let path = exit_path(pid);
    let text = std::fs::read_to_string(&path).ok()?;
    let _ = std::fs::remove_file(&path);
    let line = text.trim_end();
    Some(match line.strip_prefix("error: ") {
        Some(msg) => Err(msg.to_string()),
        None if line == "ok" => Ok(()),
        None => Err(format!("unreadable outcome {line:?}")),
    })
}

/// Write this server's record; returns its path for removal at exit.
pub fn register(rec: &ServerRecord) -> std::io::Result<PathBuf> {
    let dir = runtime_dir();
    std::fs::create_dir_all(&dir)?;
    let path = record_path(rec.pid);
    let mut text = format!(
        "pid={}\ndb={}\nmount={}\ntransport={}\nring_queues={}\nring_requests={}\ndevfuse_requests={}\nforgets={}\nworker_requests={}\npolled={}\ndb_pages={}\nfree_pages={}\n",
        rec.pid,
        rec.db.display(),
        rec.mount_point.display(),
        rec.transport,
        rec.ring_queues,
        rec.ring_requests,
        rec.devfuse_requests,
        rec.forgets,
        rec.worker_requests,
        rec.polled,
        rec.db_pages,
        rec.free_pages
    );
    let m = &rec.memory;
    text.push_str(&format!(
        "rss={}\nmem_budget={}\nmem_sqlite={}\nmem_caches={}\nmem_batch={}\nmem_transport={}\nmem_buffers={}\n",
        m.rss, m.budget, m.sqlite, m.caches, m.batch, m.transport, m.buffers
    ));
    if let Some(log) = &rec.log {
        text.push_str(&format!("log={}\n", log.display()));
    }
    if !rec.lost.is_empty() {
        text.push_str(&format!("lost={}\n", rec.lost.replace('\n', " ")));
    }
    // Write then rename, so a reader never sees half a record.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

fn parse(text: &str) -> Option<ServerRecord> {
    let mut pid = None;
    let mut db = None;
    let mut mnt = None;
    let mut rec = ServerRecord::default();
    for line in text.lines() {
        match line.split_once('=') {
            Some(("pid", v)) => pid = v.parse().ok(),
            Some(("db", v)) => db = Some(PathBuf::from(v)),
            Some(("mount", v)) => mnt = Some(PathBuf::from(v)),
            Some(("transport", v)) => rec.transport = v.to_string(),
            Some(("ring_queues", v)) => rec.ring_queues = v.parse().unwrap_or(0),
            Some(("ring_requests", v)) => rec.ring_requests = v.parse().unwrap_or(0),
            Some(("devfuse_requests", v)) => rec.devfuse_requests = v.parse().unwrap_or(0),
            Some(("forgets", v)) => rec.forgets = v.parse().unwrap_or(0),
            Some(("worker_requests", v)) => rec.worker_requests = v.parse().unwrap_or(0),
            Some(("polled", v)) => rec.polled = v.parse().unwrap_or(0),
            Some(("log", v)) => rec.log = Some(PathBuf::from(v)),
            Some(("lost", v)) => rec.lost = v.to_string(),
            Some(("db_pages", v)) => rec.db_pages = v.parse().unwrap_or(0),
            Some(("free_pages", v)) => rec.free_pages = v.parse().unwrap_or(0),
            Some(("rss", v)) => rec.memory.rss = v.parse().unwrap_or(0),
            Some(("mem_budget", v)) => rec.memory.budget = v.parse().unwrap_or(0),
            Some(("mem_sqlite", v)) => rec.memory.sqlite = v.parse().unwrap_or(0),
            Some(("mem_caches", v)) => rec.memory.caches = v.parse().unwrap_or(0),
            Some(("mem_batch", v)) => rec.memory.batch = v.parse().unwrap_or(0),
            Some(("mem_transport", v)) => rec.memory.transport = v.parse().unwrap_or(0),
            Some(("mem_buffers", v)) => rec.memory.buffers = v.parse().unwrap_or(0),
            _ => {}
        }
    }
    rec.pid = pid?;
    rec.db = db?;
    rec.mount_point = mnt?;
    Some(rec)
}

/// Every record whose server is still alive; stale records are removed.
pub fn live() -> Vec<ServerRecord> {
    let mut out = Vec::new();
    for (path, rec) in records() {
        match rec {
            Some(r) if super::ns::running(r.pid as i32) => out.push(r),
            _ => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    out.sort_by_key(|r| r.pid);
    out
}

/// The records whose server is gone (or that cannot be read), with the pid when known; left
/// in place for the caller to remove.
pub fn stale() -> Vec<(PathBuf, Option<u32>)> {
    let mut out: Vec<(PathBuf, Option<u32>)> = records()
        .into_iter()
        .filter_map(|(path, rec)| match rec {
            Some(r) if super::ns::running(r.pid as i32) => None,
            r => Some((path, r.map(|r| r.pid))),
        })
        .collect();
    out.sort();
    out
}

/// Every server record file and what it says (None: unreadable); what ended servers and
/// sandboxes left (logs, outcomes, Litestream's configuration and log) past [`KEEP_ENDED`] is
/// removed on the way.
fn records() -> Vec<(PathBuf, Option<ServerRecord>)> {
    records_in(&runtime_dir(), std::time::SystemTime::now())
}

fn records_in(dir: &Path, now: std::time::SystemTime) -> Vec<(PathBuf, Option<ServerRecord>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for ent in entries.flatten() {
        let path = ent.path();
        if let Some(pid) = leftover_of(&path) {
            remove_if_ended(&path, pid, now);
            continue;
        }
        if path.extension().and_then(|e| e.to_str()) != Some("server") {
            continue;
        }
        let rec = std::fs::read_to_string(&path).ok().and_then(|t| parse(&t));
        out.push((path, rec));
    }
    out
}

/// The pid of the process that left `path` when it is one of the files kept past a process's
/// end: `PID.log`, `PID.exit`, `PID.litestream.log`, `PID.litestream.yml`.
fn leftover_of(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let (pid, rest) = name.split_once('.')?;
    if !matches!(rest, "log" | "exit" | "litestream.log" | "litestream.yml") {
        return None;
    }
    pid.parse().ok()
}

/// Remove `path`, left by process `pid`, once that process is gone and the file is older
/// than [`KEEP_ENDED`].
fn remove_if_ended(path: &Path, pid: u32, now: std::time::SystemTime) {
    if Path::new(&format!("/proc/{pid}")).exists() {
        return;
    }
    let age = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| now.duration_since(t).ok());
    if age.is_some_and(|a| a > KEEP_ENDED) {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    /// What ended processes left goes after a day, Litestream's configuration included; a
    /// living process's files, a fresh file and anything else stay.
    #[test]
    fn files_of_ended_processes_go_after_a_day() {
        let dir = tempfile::tempdir().unwrap();
        // Above any pid_max: never a living process.
        let dead = 4_000_000_000u32;
        let me = std::process::id();
        let names = [
            format!("{dead}.log"),
            format!("{dead}.exit"),
            format!("{dead}.litestream.log"),
            format!("{dead}.litestream.yml"),
            format!("{me}.log"),
            format!("{me}.litestream.yml"),
            format!("{dead}.notes"),
            "other.yml".to_string(),
        ];
        for n in &names {
            std::fs::write(dir.path().join(n), "x").unwrap();
        }
        let fresh = dir.path().join(format!("{}.log", dead - 1));
        std::fs::write(&fresh, "x").unwrap();
        // Two days from now, every file but `fresh` (touched then) is two days old.
        let later = SystemTime::now() + Duration::from_secs(2 * 24 * 3600);
        let f = std::fs::File::options().write(true).open(&fresh).unwrap();
        f.set_modified(later).unwrap();
        records_in(dir.path(), later);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want = vec![
            format!("{me}.log"),
            format!("{me}.litestream.yml"),
            format!("{dead}.notes"),
            format!("{}.log", dead - 1),
            "other.yml".to_string(),
        ];
        want.sort();
        assert_eq!(left, want);
    }
}
