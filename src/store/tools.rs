//! The tool-call audit log (`tool_calls`): insert-only. A record has exactly one of result and
//! error; `parameters` and `result` must be valid JSON; `duration_ms` is always derived as
//! `(completed_at - started_at) * 1000` (SPEC "Tool Calls", consistency rules 1-4).

use super::kv::validate_json;
use super::Store;
use crate::errno::Errno;

/// A tool call to record.
#[derive(Clone, Debug, Default)]
pub struct NewToolCall {
    pub name: String,
    pub parameters: Option<String>,
    pub result: Option<String>,
    pub error: Option<String>,
    pub started_at: i64,
    pub completed_at: i64,
}

/// A recorded tool call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: i64,
    pub name: String,
    pub parameters: Option<String>,
    pub result: Option<String>,
    pub error: Option<String>,
    pub started_at: i64,
    pub completed_at: i64,
    pub duration_ms: i64,
}

/// The SPEC's "Analyze Tool Performance" row for one tool.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolStats {
    pub name: String,
    pub total_calls: i64,
    pub successful: i64,
    pub failed: i64,
    pub avg_duration_ms: f64,
}

/// Which calls `tool_list` returns (newest first).
#[derive(Clone, Debug, Default)]
pub struct ToolFilter {
    pub name: Option<String>,
    /// Only calls with `started_at > since`.
    pub since: Option<i64>,
    pub limit: Option<u64>,
}

fn errno(e: Errno) -> String {
    format!("database error: {e}")
}

impl Store {
    /// Append one record and return its id. Refuses both or neither of result/error, invalid
    /// JSON in parameters or result, an empty name and a completion before the start.
    pub fn tool_record(&self, call: &NewToolCall) -> Result<i64, String> {
        if call.name.is_empty() {
            return Err("tool name must not be empty".into());
        }
        match (&call.result, &call.error) {
            (Some(_), Some(_)) => {
                return Err("give exactly one of result and error, not both".into())
            }
            (None, None) => return Err("give exactly one of result and error".into()),
            _ => {}
        }
        if let Some(p) = &call.parameters {
            validate_json(p).map_err(|e| format!("parameters: {e}"))?;
        }
        if let Some(r) = &call.result {
            validate_json(r).map_err(|e| format!("result: {e}"))?;
        }
        if call.completed_at < call.started_at {
            return Err(format!(
                "completed_at {} is before started_at {}",
                call.completed_at, call.started_at
            ));
        }
        let duration = (call.completed_at - call.started_at)
            .checked_mul(1000)
            .ok_or("duration out of range")?;
        let text = [&call.parameters, &call.result, &call.error];
        let payload = call.name.len()
            + text
                .iter()
                .filter_map(|t| t.as_ref())
                .map(String::len)
                .sum::<usize>();
        self.admit(super::space::Need::op(payload)).map_err(errno)?;
        self.write_tx(|c| {
            c.execute(
                "INSERT INTO tool_calls (name, parameters, result, error, started_at, completed_at, duration_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                rusqlite::params![
                    call.name,
                    call.parameters,
                    call.result,
                    call.error,
                    call.started_at,
                    call.completed_at,
                    duration
                ],
            )?;
            Ok(c.last_insert_rowid())
        })
        .map_err(errno)
    }

    /// Recorded calls, newest first (the SPEC's by-name and recent queries).
    pub fn tool_list(&self, f: &ToolFilter) -> Result<Vec<ToolCall>, String> {
        let limit = f
            .limit
            .map(|l| i64::try_from(l).unwrap_or(i64::MAX))
            .unwrap_or(-1);
        self.read_tx(|c| {
            let mut st = c.prepare(
                "SELECT id, name, parameters, result, error, started_at, completed_at, duration_ms
                 FROM tool_calls WHERE (?1 IS NULL OR name = ?1) AND (?2 IS NULL OR started_at > ?2)
                 ORDER BY started_at DESC, id DESC LIMIT ?3",
            )?;
            let rows = st.query_map(rusqlite::params![f.name, f.since, limit], |r| {
                Ok(ToolCall {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    parameters: r.get(2)?,
                    result: r.get(3)?,
                    error: r.get(4)?,
                    started_at: r.get(5)?,
                    completed_at: r.get(6)?,
                    duration_ms: r.get(7)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .map_err(errno)
    }

    /// Per-tool totals, successes, failures and mean duration, most-called first.
    pub fn tool_stats(&self) -> Result<Vec<ToolStats>, String> {
        self.read_tx(|c| {
            let mut st = c.prepare(
                "SELECT name, COUNT(*) AS total_calls,
                        SUM(CASE WHEN error IS NULL THEN 1 ELSE 0 END) AS successful,
                        SUM(CASE WHEN error IS NOT NULL THEN 1 ELSE 0 END) AS failed,
                        AVG(duration_ms) AS avg_duration_ms
                 FROM tool_calls GROUP BY name ORDER BY total_calls DESC, name ASC",
            )?;
            let rows = st.query_map([], |r| {
                Ok(ToolStats {
                    name: r.get(0)?,
                    total_calls: r.get(1)?,
                    successful: r.get(2)?,
                    failed: r.get(3)?,
                    avg_duration_ms: r.get(4)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .map_err(errno)
    }
}
