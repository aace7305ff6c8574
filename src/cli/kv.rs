//! `agentfs kv DB get|set|delete|list`: the key/value store. Values are JSON text; invalid JSON
//! is refused. Safe while the database is mounted.

use std::io::Read as _;
use std::path::PathBuf;

use serde_json::json;

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
    /// Print the JSON value stored under KEY (exit 1 if there is none).
    Get { key: String },
    /// Store VALUE (JSON text; `-` reads it from standard input) under KEY, replacing any
    /// previous value and refreshing updated_at.
    Set { key: String, value: String },
    /// Remove KEY (exit 1 if there is none).
    Delete { key: String },
    /// List keys in order with created_at and updated_at.
    List {
        /// Only keys starting with this prefix.
        #[arg(long)]
        prefix: Option<String>,
        /// Print a JSON array of {"key", "value", "created_at", "updated_at"}.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(a: Args) -> super::CliResult {
    let readonly = matches!(a.op, Op::Get { .. } | Op::List { .. });
    let store = Store::open(&a.db, readonly)?;
    match a.op {
        Op::Get { key } => match store.kv_get(&key)? {
            Some(v) => println!("{v}"),
            None => {
                return Err(super::CliError::new(
                    super::Code::NotFound,
                    format!("{key}: no such key"),
                ))
            }
        },
        Op::Set { key, value } => {
            let value = if value == "-" {
                let mut s = String::new();
                std::io::stdin()
                    .read_to_string(&mut s)
                    .map_err(|e| format!("standard input: {e}"))?;
                s
            } else {
                value
            };
            store
                .kv_set(&key, &value)
                .map_err(|e| format!("{key}: {e}"))?;
        }
        Op::Delete { key } => {
            if !store.kv_delete(&key)? {
                return Err(super::CliError::new(
                    super::Code::NotFound,
                    format!("{key}: no such key"),
                ));
            }
        }
        Op::List { prefix, json } => {
            let list = store.kv_list(prefix.as_deref())?;
            if json {
                let items: Vec<_> = list
                    .iter()
                    .map(|e| {
                        let value: serde_json::Value =
                            serde_json::from_str(&e.value).unwrap_or(json!(e.value));
                        json!({"key": e.key, "value": value,
                               "created_at": e.created_at, "updated_at": e.updated_at})
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(items));
            } else {
                for e in &list {
                    println!(
                        "{}\t{}\t{}",
                        e.key,
                        e.created_at.unwrap_or(0),
                        e.updated_at.unwrap_or(0)
                    );
                }
            }
        }
    }
    Ok(0)
}
