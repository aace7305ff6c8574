//! `agentfs tools DB record|list|stats`: the insert-only tool-call audit log. Safe while the
//! database is mounted.

use std::path::PathBuf;

use serde_json::json;

use crate::store::tools::{NewToolCall, ToolCall, ToolFilter};
use crate::store::Store;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The database.
    pub db: PathBuf,
    #[command(subcommand)]
    pub op: Op,
}

#[derive(clap::Subcommand, Debug)]
pub enum Op {
    /// Append one completed tool call; prints its id. Exactly one of --result and --error.
    #[command(group(clap::ArgGroup::new("outcome").required(true).args(["result", "error"])))]
    Record {
        /// Tool name (e.g. read_file).
        name: String,
        /// Input parameters as JSON.
        #[arg(long)]
        parameters: Option<String>,
        /// The result as JSON (a successful call).
        #[arg(long)]
        result: Option<String>,
        /// The error message (a failed call).
        #[arg(long)]
        error: Option<String>,
        /// Start time in epoch seconds (default: --completed, or now).
        #[arg(long)]
        started: Option<i64>,
        /// Completion time in epoch seconds (default: now). duration_ms is derived from both.
        #[arg(long)]
        completed: Option<i64>,
    },
    /// List calls, newest first.
    List {
        /// Only calls of this tool.
        #[arg(long)]
        name: Option<String>,
        /// Only calls started after this epoch second.
        #[arg(long)]
        since: Option<i64>,
        /// At most this many calls.
        #[arg(long)]
        limit: Option<u64>,
        /// Print a JSON array of records.
        #[arg(long)]
        json: bool,
    },
    /// Per-tool totals, successes, failures and mean duration.
    Stats {
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
    },
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn call_json(c: &ToolCall) -> serde_json::Value {
    let parse = |s: &Option<String>| -> serde_json::Value {
        match s {
            Some(t) => serde_json::from_str(t).unwrap_or(json!(t)),
            None => serde_json::Value::Null,
        }
    };
    json!({
        "id": c.id, "name": c.name, "parameters": parse(&c.parameters),
        "result": parse(&c.result), "error": c.error, "started_at": c.started_at,
        "completed_at": c.completed_at, "duration_ms": c.duration_ms,
    })
}

pub fn run(a: Args) -> super::CliResult {
    let readonly = !matches!(a.op, Op::Record { .. });
    let store = Store::open(&a.db, readonly)?;
    match a.op {
        Op::Record {
            name,
            parameters,
            result,
            error,
            started,
            completed,
        } => {
            let (started_at, completed_at) = match (started, completed) {
                (Some(s), Some(c)) => (s, c),
                (Some(s), None) => (s, now()),
                (None, Some(c)) => (c, c),
                (None, None) => {
                    let n = now();
                    (n, n)
                }
            };
            let id = store.tool_record(&NewToolCall {
                name,
                parameters,
                result,
                error,
                started_at,
                completed_at,
            })?;
            println!("{id}");
        }
        Op::List {
            name,
            since,
            limit,
            json,
        } => {
            let calls = store.tool_list(&ToolFilter { name, since, limit })?;
            if json {
                let items: Vec<_> = calls.iter().map(call_json).collect();
                println!("{}", serde_json::Value::Array(items));
            } else {
                for c in &calls {
                    let outcome = match (&c.result, &c.error) {
                        (_, Some(e)) => format!("error: {e}"),
                        (Some(r), None) => format!("result: {r}"),
                        (None, None) => "-".into(),
                    };
                    println!(
                        "{}\t{}\t{}\t{}ms\t{}",
                        c.id, c.name, c.started_at, c.duration_ms, outcome
                    );
                }
            }
        }
        Op::Stats { json } => {
            let stats = store.tool_stats()?;
            if json {
                let items: Vec<_> = stats
                    .iter()
                    .map(|s| {
                        json!({"name": s.name, "total_calls": s.total_calls,
                               "successful": s.successful, "failed": s.failed,
                               "avg_duration_ms": s.avg_duration_ms})
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(items));
            } else {
                println!(
                    "{:<24} {:>8} {:>8} {:>8} {:>12}",
                    "NAME", "CALLS", "OK", "FAILED", "AVG_MS"
                );
                for s in &stats {
                    println!(
                        "{:<24} {:>8} {:>8} {:>8} {:>12.1}",
                        s.name, s.total_calls, s.successful, s.failed, s.avg_duration_ms
                    );
                }
            }
        }
    }
    Ok(0)
}
