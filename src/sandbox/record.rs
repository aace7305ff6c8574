//! What a run leaves in the project's directory: `live.json` while it runs, and
//! `runs/<start>-<pid>.json` with what it actually enforced.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::plan::Op;

/// Present while a sandbox of the project runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LiveMarker {
    /// The `agentfs run` process.
    pub supervisor: i32,
    /// The sandbox's pid 1, as the host sees it (`exec` joins its namespaces).
    pub pid1: i32,
    /// The process serving the project's delta.
    pub server: i32,
    /// Unix seconds when the marker was written, after the supervisor and pid 1 started: a
    /// process with one of their pids that started later is another one.
    pub started: u64,
    pub source: PathBuf,
    /// The cgroup checkpoints freeze (`exec` puts its command there too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<PathBuf>,
    /// The replica URL the sandbox replicates to (`exec --replicate` must name the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicate: Option<String>,
}

/// One mount of the view and the mode it ended with.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MountRecord {
    pub op: String,
    pub path: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub source: Option<PathBuf>,
    pub mode: String,
}

/// What one run enforced, written when it starts and completed when it ends.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    pub project: String,
    pub source: PathBuf,
    pub supervisor: i32,
    pub namespaces: Vec<String>,
    pub mounts: Vec<MountRecord>,
    pub masks: Vec<PathBuf>,
    pub writable_roots: Vec<PathBuf>,
    pub net: String,
    pub home: String,
    pub uid_inside: u32,
    pub gid_inside: u32,
    pub uid_host: u32,
    pub gid_host: u32,
    pub backend: String,
    /// Why this backend: the project's config.toml, `--mount-backend`, or what `auto` tried.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub backend_reason: String,
    pub command: Vec<String>,
    pub cwd: PathBuf,
    /// Unix seconds.
    pub started: u64,
    /// The nanoseconds within `started`: with it the records of one second keep the order
    /// they started in (pids wrap, so the supervisor's pid cannot order them).
    #[serde(default)]
    pub started_ns: u32,
    pub ended: Option<u64>,
    /// The status propagated to the caller (128+N when killed by signal N).
    pub exit_status: Option<i32>,
    /// The named error when the run did not start or its server failed.
    pub error: Option<String>,
    /// How a run ended that could not finish its record itself: `killed` (its supervisor was
    /// killed; `agentfs recover` wrote `ended`, the time it found the run gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// What the run did for the project's history.
    #[serde(default)]
    pub history: HistoryRecord,
    /// Writes (and escaping symlinks) the server refused and logged as escape attempts.
    #[serde(default)]
    pub escape_attempts: u64,
    /// The replication that ran for the sandbox's lifetime, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationRecord>,
}

/// The replication side of a run (docs/replication.md).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReplicationRecord {
    pub url: String,
    pub litestream_pid: u32,
    /// Each replicated database and its replica URL.
    pub databases: Vec<(PathBuf, String)>,
    /// How it ended: `caught up` (the last pass shipped everything up to the final barrier)
    /// or the named error that says what the replica may miss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
}

/// The history side of a run (docs/history.md).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HistoryRecord {
    /// How checkpoints stop the sandbox: `cgroup <path>` (frozen), `unfrozen: <why>`, or `off
    /// ...` (AGENTFS_CHECKPOINT_FREEZE=off).
    pub freezer: String,
    /// The exit snapshot's commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_snapshot: Option<String>,
    /// Checkpoints the watcher took while the command ran (one equal to HEAD included).
    #[serde(default)]
    pub checkpoints: u64,
    /// Of those, the ones taken with the sandbox frozen.
    #[serde(default)]
    pub frozen_checkpoints: u64,
    /// The longest the sandbox stayed frozen for one checkpoint (freeze to thaw), in ms.
    #[serde(default)]
    pub frozen_ms_max: f64,
    /// The nice value checkpoints walked at once the sandbox was thawed
    /// (AGENTFS_CHECKPOINT_NICE), as the walk read it back; absent when none walked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walk_nice: Option<i32>,
}

pub fn now() -> u64 {
    now_precise().0
}

/// Unix seconds and the nanoseconds within them.
pub fn now_precise() -> (u64, u32) {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| (d.as_secs(), d.subsec_nanos()))
        .unwrap_or((0, 0))
}

impl RunRecord {
    /// The mounts of `plan` with the mode each ends with.
    pub fn mounts_of(plan: &[Op]) -> Vec<MountRecord> {
        let writable: Vec<&Path> = plan
            .iter()
            .filter(|o| matches!(o, Op::Writable { .. }))
            .map(|o| o.path())
            .collect();
        plan.iter()
            .filter(|o| {
                !matches!(
                    o,
                    Op::Symlink { .. } | Op::ReadOnly { .. } | Op::Writable { .. }
                )
            })
            .map(|o| MountRecord {
                op: o.name().to_string(),
                path: o.path().to_path_buf(),
                source: match o {
                    Op::RoBind { src, .. } | Op::Bind { src, .. } => Some(src.clone()),
                    Op::Overlayfs { upper, .. } => Some(upper.clone()),
                    _ => None,
                },
                mode: match o {
                    Op::DevNode { .. } | Op::Devpts { .. } => "dev",
                    _ if writable.contains(&o.path()) => "rw",
                    _ => "ro",
                }
                .to_string(),
            })
            .collect()
    }

    /// Where this record lives in `project_dir`: `runs/<seconds>.<nanoseconds>-<pid>.json`,
    /// or `runs/<seconds>-<pid>.json` for a record without nanoseconds (older versions wrote
    /// those; `recover` rewrites them in place).
    pub fn path(&self, project_dir: &Path) -> PathBuf {
        let name = match self.started_ns {
            0 => format!("{}-{}.json", self.started, self.supervisor),
            ns => format!("{}.{:09}-{}.json", self.started, ns, self.supervisor),
        };
        project_dir.join("runs").join(name)
    }

    pub fn write(&self, project_dir: &Path) -> std::io::Result<()> {
        let p = self.path(project_dir);
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        let tmp = p.with_extension("tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(tmp, p)
    }
}

/// The run records of the project, oldest first (by their start; a name without the
/// nanoseconds, as older versions wrote, starts at its second's beginning).
fn record_files(project_dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(project_dir.join("runs")) else {
        return Vec::new();
    };
    let mut names: Vec<(RecordName, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let p = e.path();
            (p.extension()? == "json").then_some(())?;
            Some((RecordName::parse(p.file_stem()?.to_str()?)?, p))
        })
        .collect();
    names.sort();
    names.into_iter().map(|(_, p)| p).collect()
}

/// A record's file name, `<seconds>[.<nanoseconds>]-<pid>`, in the order runs started.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct RecordName {
    secs: u64,
    nanos: u32,
    pid: i32,
}

impl RecordName {
    fn parse(stem: &str) -> Option<RecordName> {
        let (t, pid) = stem.split_once('-')?;
        let (secs, nanos) = match t.split_once('.') {
            Some((s, n)) => (s.parse().ok()?, n.parse().ok()?),
            None => (t.parse().ok()?, 0),
        };
        Some(RecordName {
            secs,
            nanos,
            pid: pid.parse().ok()?,
        })
    }
}

fn read_record(p: &Path) -> Option<RunRecord> {
    serde_json::from_slice(&std::fs::read(p).ok()?).ok()
}

/// The newest run record of the project, if any.
pub fn latest_record(project_dir: &Path) -> Option<RunRecord> {
    read_record(record_files(project_dir).last()?)
}

/// The project's run records that their run never finished (`ended` null) although its
/// supervisor is gone: what a killed supervisor leaves.
pub fn unfinished(project_dir: &Path) -> Vec<RunRecord> {
    record_files(project_dir)
        .iter()
        .filter_map(|p| read_record(p))
        .filter(|r| r.ended.is_none() && !crate::sys::ns::same_process(r.supervisor, r.started))
        .collect()
}

pub fn marker_path(project_dir: &Path) -> PathBuf {
    project_dir.join("live.json")
}

/// The live sandbox of the project: None when there is none, or when the marker is stale
/// (its supervisor or pid 1 is gone, or the pid now belongs to another process).
pub fn live(project_dir: &Path) -> Option<LiveMarker> {
    marker(project_dir).filter(LiveMarker::running)
}

/// The marker as it is on disk, live or stale.
pub fn marker(project_dir: &Path) -> Option<LiveMarker> {
    serde_json::from_slice(&std::fs::read(marker_path(project_dir)).ok()?).ok()
}

impl LiveMarker {
    /// Whether the processes the marker names are still the ones that wrote it: the
    /// supervisor and pid 1 run and started no later than the marker, and pid 1 is the first
    /// process of its own pid namespace. A pid reused by another process fails this.
    pub fn running(&self) -> bool {
        use crate::sys::ns;
        ns::same_process(self.supervisor, self.started)
            && ns::same_process(self.pid1, self.started)
            && ns::is_namespace_init(self.pid1)
    }
}

pub fn write_live(project_dir: &Path, m: &LiveMarker) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(m).map_err(std::io::Error::other)?;
    let tmp = project_dir.join("live.json.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, marker_path(project_dir))
}

/// Remove the live marker if `supervisor` wrote it: a launch refused because another sandbox
/// of the project holds the delta leaves that sandbox's marker alone.
pub fn remove_live(project_dir: &Path, supervisor: i32) {
    let path = marker_path(project_dir);
    let ours = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<LiveMarker>(&b).ok())
        .is_some_and(|m| m.supervisor == supervisor);
    if ours {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::RecordName;

    /// Two runs in one second: the later one sorts last even when the pids wrapped and its
    /// supervisor's pid is the smaller; a name without nanoseconds is its second's start.
    #[test]
    fn records_sort_by_start_not_by_pid() {
        let mut names: Vec<RecordName> = [
            "100.000000500-32700",
            "100.000000900-301",
            "100-40000",
            "99.999999999-5",
        ]
        .iter()
        .map(|s| RecordName::parse(s).unwrap())
        .collect();
        names.sort();
        let pids: Vec<i32> = names.iter().map(|n| n.pid).collect();
        assert_eq!(pids, [5, 40000, 32700, 301]);
        assert_eq!(RecordName::parse("100.x-1"), None);
        assert_eq!(
            RecordName::parse("100-7"),
            RecordName::parse("100.000000000-7")
        );
        assert_eq!(RecordName::parse("100"), None);
    }
}
