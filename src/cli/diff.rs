//! `agentfs diff DB [--name-only | --patch [--binary] | --json]`, and `agentfs diff NAME A B [--json]`:
//! with three arguments the first is a project and the others two of its snapshots.

use std::io::Write;
use std::path::PathBuf;

use serde_json::json;

use crate::delta::patch::git_blob_id;
use crate::delta::patch::Binary;
use crate::delta::{escaped, Change, Entry, Kind, Overlay, Side};
use crate::store::progress::Progress;

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
    /// Print a JSON array, one object per changed path (docs/harness.md has the shape).
    #[arg(long)]
    pub json: bool,
}

/// The fields of one side, each prefixed `old_` or `new_` (all null for an absent side).
fn side_json(
    overlay: &Overlay,
    path: &[u8],
    prefix: &str,
    side: Option<&Side>,
    obj: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<(), String> {
    let null = serde_json::Value::Null;
    let content = match side {
        Some(s) if matches!(s.kind, Kind::File | Kind::Symlink) => Some(overlay.content(path, s)?),
        _ => None,
    };
    let c = content.as_deref();
    let fields = [
        ("type", side.map_or(null.clone(), |s| json!(s.kind.name()))),
        (
            "mode",
            side.map_or(null.clone(), |s| json!(format!("{:06o}", s.mode))),
        ),
        ("size", c.map_or(null.clone(), |c| json!(c.len()))),
        (
            "target",
            match (side, c) {
                (Some(s), Some(c)) if s.kind == Kind::Symlink => json!(escaped(c)),
                _ => null.clone(),
            },
        ),
        ("hash", side.map_or(null.clone(), |s| json!(s.hash))),
        ("oid", c.map_or(null.clone(), |c| json!(git_blob_id(c)))),
        (
            "blake3",
            c.map_or(null.clone(), |c| json!(blake3::hash(c).to_hex().as_str())),
        ),
    ];
    for (k, v) in fields {
        obj.insert(format!("{prefix}_{k}"), v);
    }
    Ok(())
}

/// One path's object: a deletion followed by an addition at the same path is one
/// `type-changed` change.
fn change_json(
    overlay: &Overlay,
    path: &[u8],
    change: &str,
    kind: Kind,
    old: Option<&Side>,
    new: Option<&Side>,
) -> Result<serde_json::Value, String> {
    let mut obj = serde_json::Map::new();
    obj.insert("path".into(), json!(escaped(path)));
    let hex = std::str::from_utf8(path)
        .is_err()
        .then(|| crate::delta::hex(path));
    obj.insert("path_hex".into(), json!(hex));
    obj.insert("change".into(), json!(change));
    obj.insert("kind".into(), json!(kind.name()));
    side_json(overlay, path, "old", old, &mut obj)?;
    side_json(overlay, path, "new", new, &mut obj)?;
    Ok(serde_json::Value::Object(obj))
}

/// The JSON list of `changes` (sorted by path).
fn changes_json(
    overlay: &Overlay,
    changes: &[Entry],
    progress: &dyn Progress,
) -> Result<Vec<serde_json::Value>, String> {
    let mut list = Vec::new();
    let mut i = 0;
    progress.start("diff", changes.len() as u64);
    while i < changes.len() {
        let first = i;
        let e = &changes[i];
        let replaced = changes.get(i + 1).filter(|n| {
            n.path == e.path && e.change == Change::Deleted && n.change == Change::Added
        });
        list.push(match replaced {
            Some(n) => {
                i += 1;
                change_json(
                    overlay,
                    &e.path,
                    "type-changed",
                    n.kind(),
                    e.old.as_ref(),
                    n.new.as_ref(),
                )?
            }
            None => change_json(
                overlay,
                &e.path,
                e.change.name(),
                e.kind(),
                e.old.as_ref(),
                e.new.as_ref(),
            )?,
        });
        i += 1;
        progress.advance((i - first) as u64);
    }
    Ok(list)
}

pub fn run(mut a: Args, knobs: &crate::knobs::Knobs) -> super::CliResult {
    match a.snapshots.as_slice() {
        [] => {}
        [x, y] => return super::history::diff(&a.db.to_string_lossy(), x, y, a.json),
        _ => return Err("diff takes DB, or NAME A B (two snapshots of a project)".into()),
    }
    a.db = crate::project::delta_path(&a.db, a.project, knobs)?;
    let overlay = Overlay::open(&a.db)?;
    let changes = overlay.changes()?;
    let mut out = Vec::new();
    if a.patch {
        let binary = if a.binary {
            Binary::Patch
        } else {
            Binary::Mention
        };
        out = overlay.patch(&changes, binary, &super::progress::Bar::new())?;
    } else if a.json {
        let list = changes_json(&overlay, &changes, &super::progress::Bar::new())?;
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
