//! `agentfs integrity DB`

use std::path::PathBuf;

use crate::store::Store;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The database to check.
    pub db: PathBuf,
}

/// Exit 0: clean; 1: findings; 2: could not check.
pub fn run(a: Args) -> super::CliResult {
    let store = match Store::open(&a.db, true) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("agentfs: {e}");
            return Ok(2);
        }
    };
    match store.check() {
        Ok(findings) if findings.is_empty() => {
            println!("{}: clean", a.db.display());
            Ok(0)
        }
        Ok(findings) => {
            for f in &findings {
                println!("{}: {}", f.rule, f.detail);
            }
            println!("{}: {} finding(s)", a.db.display(), findings.len());
            Ok(1)
        }
        Err(e) => {
            eprintln!("agentfs: {}: cannot check: {e}", a.db.display());
            Ok(2)
        }
    }
}
