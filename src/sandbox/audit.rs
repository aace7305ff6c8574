//! The project's audit log, `audit/events.ndjson`: one JSON line per write the server refused
//! because it would land outside the sandbox's writable set, or per escaping symlink refused
//! under the opt-in rule (docs/sandbox.md, "Escape attempts").
//!
//! A line: `{"time": unix seconds, "pid": pid in the sandbox, "path": absolute in the view,
//! "operation": "create"|"write"|..., "errno": "EROFS"|"EPERM"}`, and `"target"` for a
//! symlink. One run writes at most `AGENTFS_AUDIT_MAX_EVENTS` of them; past the cap refusals go
//! on, unlogged, and the run ends the log with one `{"time", "capped": N}` line saying how
//! many went unlogged.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::delta::escaped;
use crate::dispatch::guard::Refusal;

/// The log's directory and file under the project's directory.
pub const DIR: &str = "audit";
pub const FILE: &str = "events.ndjson";

pub fn path(project_dir: &Path) -> PathBuf {
    project_dir.join(DIR).join(FILE)
}

struct State {
    file: std::fs::File,
    /// Events this run refused, logged or not.
    refused: u64,
}

/// The log one run appends to.
pub struct AuditLog {
    state: Mutex<State>,
    cap: u64,
}

fn errno_name(e: i32) -> String {
    match e {
        libc::EROFS => "EROFS".into(),
        libc::EPERM => "EPERM".into(),
        other => format!("errno {other}"),
    }
}

fn append(file: &mut std::fs::File, v: &Value) {
    // A line that cannot be written is a log lost, not a refusal undone: the write stays
    // refused, and the run's count (said at its end) still has it.
    if let Err(e) = writeln!(file, "{v}") {
        tracing::warn!("audit log: {e}");
    }
}

impl AuditLog {
    /// Open (create) the project's log for appending.
    pub fn open(project_dir: &Path, cap: u64) -> std::io::Result<AuditLog> {
        let p = path(project_dir);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)?;
        Ok(AuditLog {
            state: Mutex::new(State { file, refused: 0 }),
            cap,
        })
    }

    /// Log one refusal (up to the cap).
    pub fn record(&self, r: &Refusal<'_>) {
        let mut s = self.state.lock();
        s.refused += 1;
        if s.refused > self.cap {
            return;
        }
        let mut v = json!({
            "time": super::record::now(),
            "pid": r.pid,
            "path": escaped(r.path),
            "operation": r.op,
            "errno": errno_name(r.errno.0),
        });
        if let Some(t) = r.target {
            v["target"] = Value::String(escaped(t));
        }
        append(&mut s.file, &v);
    }

    /// End the run's part of the log: the `capped` line when the cap was reached. Returns how
    /// many refusals the run had.
    pub fn finish(&self) -> u64 {
        let mut s = self.state.lock();
        if s.refused > self.cap {
            let unlogged = s.refused - self.cap;
            let v = json!({ "time": super::record::now(), "capped": unlogged });
            append(&mut s.file, &v);
        }
        s.refused
    }
}

/// What the log of `project_dir` holds: the events logged (capped lines not counted) and the
/// last one; None without events.
pub fn summary(project_dir: &Path) -> Option<(u64, Value)> {
    let text = std::fs::read_to_string(path(project_dir)).ok()?;
    let mut count = 0;
    let mut last = None;
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v.get("operation").is_some() {
            count += 1;
            last = Some(v);
        }
    }
    last.map(|l| (count, l))
}
