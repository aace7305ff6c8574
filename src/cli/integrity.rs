//! `agentfs integrity DB [--json] [--require-portable] [--check-base]`

use std::path::PathBuf;

use serde_json::json;

use crate::store::{Finding, Store};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The database to check (safe while mounted).
    pub db: PathBuf,
    /// Print the result as one JSON object: {"db", "clean", "base" (overlay base directory or
    /// null), "findings": [{"rule", "detail"}]}.
    #[arg(long)]
    pub json: bool,
    /// Also fail when the database depends on an overlay base directory (partial-origin files):
    /// one `not_portable` finding per such file.
    #[arg(long)]
    pub require_portable: bool,
    /// Also compare each partial-origin file's recorded base fingerprint (size, mtime, ctime)
    /// with the base file on disk now: one `base_fingerprint` finding per mismatch.
    #[arg(long)]
    pub check_base: bool,
}

/// Every finding of `store`: SQLite's integrity_check, the consistency rules, and the optional
/// portability and base-fingerprint checks.
pub fn findings(
    store: &Store,
    require_portable: bool,
    check_base: bool,
) -> Result<Vec<Finding>, String> {
    let mut out = store.check().map_err(|e| format!("cannot check: {e}"))?;
    if require_portable || check_base {
        let origins = store
            .partial_origins()
            .map_err(|e| format!("cannot check: {e}"))?;
        for po in &origins {
            if require_portable {
                out.push(Finding {
                    rule: "not_portable",
                    detail: format!(
                        "inode {} reads unchanged chunks from base file {}",
                        po.delta_ino, po.base_path
                    ),
                });
            }
            if check_base {
                if let Err(why) = po.check_base() {
                    out.push(Finding {
                        rule: "base_fingerprint",
                        detail: why,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// The overlay base line of the text output (none for an ordinary database).
fn print_base(db: &str, base: Option<&str>) {
    if let Some(b) = base {
        println!("{db}: overlay delta over base {b}");
    }
}

/// Exit 0: clean; 1: findings; 2: could not check.
pub fn run(a: Args) -> super::CliResult {
    let db = a.db.display().to_string();
    // Could not check: the report says so, and the named error goes to stderr (exit 2).
    let fail = |e: super::CliError| {
        if a.json {
            println!("{}", json!({"db": db, "clean": false, "error": e.message}));
        }
        Err(e.exit_with(2))
    };
    let store = match Store::open(&a.db, true) {
        Ok(s) => s,
        Err(e) => return fail(e.into()),
    };
    let bar = super::progress::Bar::spinner("checking");
    let result = findings(&store, a.require_portable, a.check_base);
    drop(bar);
    let found = match result {
        Ok(f) => f,
        Err(e) => return fail(format!("{db}: {e}").into()),
    };
    let base = match store.overlay_config() {
        Ok(cfg) => cfg.map(|c| c.base_path.display().to_string()),
        Err(e) => return fail(e.into()),
    };
    if a.json {
        let list: Vec<_> = found
            .iter()
            .map(|f| json!({"rule": f.rule, "detail": f.detail}))
            .collect();
        println!(
            "{}",
            json!({"db": db, "clean": found.is_empty(), "base": base, "findings": list})
        );
    } else if found.is_empty() {
        print_base(&db, base.as_deref());
        println!("{db}: clean");
    } else {
        print_base(&db, base.as_deref());
        for f in &found {
            println!("{}: {}", f.rule, f.detail);
        }
        println!("{db}: {} finding(s)", found.len());
    }
    Ok(if found.is_empty() { 0 } else { 1 })
}
