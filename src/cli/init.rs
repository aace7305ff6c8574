//! `agentfs init DB`

use std::path::PathBuf;

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
}

pub fn run(a: Args) -> super::CliResult {
    let opts = InitOptions {
        chunk_size: a.chunk_size,
        inline_threshold: a.inline_threshold,
        ..InitOptions::default()
    };
    Store::create(&a.db, &opts).map_err(|e| e.to_string())?;
    Ok(0)
}
