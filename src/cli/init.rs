//! `agentfs init DB [--base DIR ...]` and `agentfs init NAME [--source DIR]`

use super::Code;
use std::path::PathBuf;

use crate::knobs::Knobs;
use crate::project::{self, Project, Target};

use crate::store::overlay::{self, OverlayConfig, PartialOriginPolicy};
use crate::store::{InitOptions, Store};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A project name, or the path of the database file to create (must not exist): a path has
    /// a `/` or ends in .db, .sqlite or .sqlite3.
    pub db: PathBuf,
    /// Take the argument as a project name even where a file of that name exists here.
    #[arg(long)]
    pub project: bool,
    /// Bytes per data chunk in fs_data (a power of two).
    #[arg(long, default_value_t = 65536)]
    pub chunk_size: u64,
    /// Largest dense regular file stored inline in its inode row, in bytes.
    #[arg(long, default_value_t = 4096)]
    pub inline_threshold: u64,
    /// Make an overlay delta over this read-only base directory (must not contain the
    /// database); for a project, the directory it overlays (also spelled --source).
    #[arg(long, visible_alias = "source")]
    pub base: Option<PathBuf>,
    /// Overlay copy-up policy: keep reading unchanged chunks of copied-up files from the base
    /// (on), never (off), or for files of at least the threshold size (auto).
    #[arg(long, requires = "base", value_parser = ["off", "on", "auto"])]
    pub partial_origin: Option<String>,
    /// Size from which `--partial-origin auto` applies, in bytes.
    #[arg(long, requires = "base")]
    pub partial_origin_threshold_bytes: Option<u64>,
}

pub fn run(a: Args, knobs: &Knobs) -> super::CliResult {
    let opts = InitOptions {
        chunk_size: a.chunk_size,
        inline_threshold: a.inline_threshold,
        ..InitOptions::default()
    };
    if let Target::Project(name) = project::classify(a.db.as_os_str(), a.project)? {
        return Ok(init_project(&name, &a, &opts, knobs)?);
    }
    match overlay_config(&a, &a.db)? {
        None => Store::create(&a.db, &opts)?,
        Some(cfg) => overlay::create(&a.db, &opts, &cfg)?,
    }
    Ok(0)
}

/// Make the project `name`, overlaying `--source` when given.
fn init_project(
    name: &str,
    a: &Args,
    opts: &InitOptions,
    knobs: &Knobs,
) -> Result<i32, project::Error> {
    let root = project::root(knobs)?;
    let mut p = Project::create(&root, name)?;
    let attached = overlay_config(a, &p.db())
        .map_err(|e| project::Error::new(Code::DeltaCreate, e))
        .and_then(|cfg| match cfg {
            Some(cfg) => p.attach(&cfg, opts),
            None => Ok(()),
        });
    if let Err(e) = attached {
        let _ = std::fs::remove_dir_all(&p.dir);
        return Err(e);
    }
    match p.source() {
        Some(src) => super::say(format_args!(
            "project {name} overlays {} (kept in {}); enter it with: agentfs run {name}",
            src.display(),
            p.dir.display()
        )),
        None => super::say(format_args!(
            "project {name} made in {}; give it its directory with: agentfs mount {name} DIR",
            p.dir.display()
        )),
    }
    Ok(0)
}

/// The overlay settings of `--base` for a delta at `db`, None without `--base`.
fn overlay_config(a: &Args, db: &std::path::Path) -> Result<Option<OverlayConfig>, String> {
    Ok(match &a.base {
        None => None,
        Some(base) => {
            let mut cfg = OverlayConfig::new(overlay::check_base(db, base)?);
            if let Some(p) = a
                .partial_origin
                .as_deref()
                .and_then(PartialOriginPolicy::parse)
            {
                cfg.partial_origin = p;
            }
            if let Some(n) = a.partial_origin_threshold_bytes {
                cfg.partial_origin_threshold_bytes = n;
            }
            Some(cfg)
        }
    })
}
