//! `agentfs init DB [--base DIR ...]`

use std::path::PathBuf;

use crate::store::overlay::{self, OverlayConfig, PartialOriginPolicy};
use crate::store::{InitOptions, Store};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Path of the database file to create (must not exist).
    pub db: PathBuf,
    /// Bytes per data chunk in fs_data (a power of two).
    #[arg(long, default_value_t = 65536)]
    pub chunk_size: u64,
    /// Largest dense regular file stored inline in its inode row, in bytes.
    #[arg(long, default_value_t = 4096)]
    pub inline_threshold: u64,
    /// Make an overlay delta over this read-only base directory (must not contain the
    /// database).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// Overlay copy-up policy: keep reading unchanged chunks of copied-up files from the base
    /// (on), never (off), or for files of at least the threshold size (auto).
    #[arg(long, requires = "base", value_parser = ["off", "on", "auto"])]
    pub partial_origin: Option<String>,
    /// Size from which `--partial-origin auto` applies, in bytes.
    #[arg(long, requires = "base")]
    pub partial_origin_threshold_bytes: Option<u64>,
}

pub fn run(a: Args) -> super::CliResult {
    let opts = InitOptions {
        chunk_size: a.chunk_size,
        inline_threshold: a.inline_threshold,
        ..InitOptions::default()
    };
    let overlay = match &a.base {
        None => None,
        Some(base) => {
            let mut cfg = OverlayConfig::new(overlay::check_base(&a.db, base)?);
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
    };
    match overlay {
        None => Store::create(&a.db, &opts).map_err(|e| e.to_string())?,
        Some(cfg) => overlay::create(&a.db, &opts, &cfg)?,
    }
    Ok(0)
}
