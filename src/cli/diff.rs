//! `agentfs diff DB [--name-only | --patch | --json]`, and `agentfs diff NAME A B [--json]`:
//! with three arguments the first is a project and the others two of its snapshots.

use std::io::Write;
use std::path::PathBuf;

use serde_json::json;

use crate::delta::patch::Binary;
use crate::delta::{Overlay, Side};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The overlay delta database (made with `agentfs init --base`) or a project name; safe
    /// while mounted. With two more arguments: a project name.
    pub db: PathBuf,
    /// Take the argument as a project name even where a file of that name exists here.
    #[arg(long)]
    pub project: bool,
    /// Two snapshots of project DB (tags, hashes, HEAD~N) to compare path by path instead.
    #[arg(num_args = 0..=2, conflicts_with_all = ["name_only", "patch"])]
    pub snapshots: Vec<String>,
    /// Print only the changed paths, one per line.
    #[arg(long, conflicts_with_all = ["patch", "json"])]
    pub name_only: bool,
    /// Print a patch that `git apply` accepts in (a copy of) the base directory.
    #[arg(long, conflicts_with = "json")]
    pub patch: bool,
    /// With --patch: binary files as `GIT binary patch` hunks (as `git diff --binary`) instead
    /// of a "Binary files ... differ" line.
    #[arg(long, requires = "patch")]
    pub binary: bool,
    /// Print a JSON array of {path, change, kind, old_hash, new_hash, old_mode, new_mode}.
    #[arg(long)]
    pub json: bool,
}

fn mode_str(s: Option<&Side>) -> serde_json::Value {
    s.map_or(serde_json::Value::Null, |s| {
        json!(format!("{:06o}", s.mode))
    })
}

pub fn run(mut a: Args, knobs: &crate::knobs::Knobs) -> super::CliResult {
    match a.snapshots.as_slice() {
        [] => {}
        [x, y] => return super::history::diff(&a.db.to_string_lossy(), x, y, a.json),
        _ => return Err("diff takes DB, or NAME A B (two snapshots of a project)".into()),
    }
    a.db = crate::project::delta_path(&a.db, a.project, knobs).map_err(|e| e.to_string())?;
    let overlay = Overlay::open(&a.db)?;
    let changes = overlay.changes()?;
    let mut out = Vec::new();
    if a.patch {
        let binary = if a.binary {
            Binary::Patch
        } else {
            Binary::Mention
        };
        out = overlay.patch(&changes, binary)?;
    } else if a.json {
        let list: Vec<_> = changes
            .iter()
            .map(|e| {
                json!({
                    "path": String::from_utf8_lossy(&e.path),
                    "change": e.change.name(),
                    "kind": e.kind().name(),
                    "old_hash": e.old.as_ref().map(|s| s.hash.clone()),
                    "new_hash": e.new.as_ref().map(|s| s.hash.clone()),
                    "old_mode": mode_str(e.old.as_ref()),
                    "new_mode": mode_str(e.new.as_ref()),
                })
            })
            .collect();
        out = serde_json::to_vec_pretty(&list).map_err(|e| e.to_string())?;
        out.push(b'\n');
    } else {
        let mut last: Option<&[u8]> = None;
        for e in &changes {
            if a.name_only {
                if last != Some(e.path.as_slice()) {
                    out.extend_from_slice(&e.path);
                    out.push(b'\n');
                }
                last = Some(&e.path);
            } else {
                out.extend_from_slice(format!("{} ", e.change.letter()).as_bytes());
                out.extend_from_slice(&e.path);
                out.push(b'\n');
            }
        }
    }
    std::io::stdout()
        .write_all(&out)
        .map_err(|e| format!("stdout: {e}"))?;
    Ok(0)
}
