//! The key/value store (`kv_store`): values are JSON text, checked before they are written;
//! `set` is the SPEC's upsert (`updated_at` refreshed, `created_at` kept). Every operation is
//! one transaction on the store's connections, so it works while a server has the database
//! mounted (the busy timeout waits out the server's short write transactions).

use rusqlite::OptionalExtension;

use super::Store;
use crate::errno::Errno;

/// One key as listed: the SPEC's `SELECT key, created_at, updated_at` plus the value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEntry {
    pub key: String,
    pub value: String,
    pub created_at: Option<i64>,
    pub updated_at: Option<i64>,
}

/// Ok if `text` is one valid JSON value; otherwise why not (serde_json's message).
pub fn validate_json(text: &str) -> Result<(), String> {
    serde_json::from_str::<serde_json::Value>(text)
        .map(|_| ())
        .map_err(|e| format!("not valid JSON: {e}"))
}

fn errno(e: Errno) -> String {
    format!("database error: {e}")
}

impl Store {
    /// The value stored under `key`, if any.
    pub fn kv_get(&self, key: &str) -> Result<Option<String>, String> {
        self.read_tx(|c| {
            Ok(
                c.query_row("SELECT value FROM kv_store WHERE key = ?1", [key], |r| {
                    r.get::<_, String>(0)
                })
                .optional()?,
            )
        })
        .map_err(errno)
    }

    /// Insert or replace `key` with the JSON text `value` (refused unless valid JSON).
    pub fn kv_set(&self, key: &str, value: &str) -> Result<(), String> {
        validate_json(value)?;
        self.admit(super::space::Need::op(key.len() + value.len()))
            .map_err(errno)?;
        self.write_tx(|c| {
            c.execute(
                "INSERT INTO kv_store (key, value, updated_at) VALUES (?1, ?2, unixepoch())
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value, updated_at = unixepoch()",
                [key, value],
            )?;
            Ok(())
        })
        .map_err(errno)
    }

    /// Delete `key`; returns whether it existed.
    pub fn kv_delete(&self, key: &str) -> Result<bool, String> {
        self.write_tx(|c| Ok(c.execute("DELETE FROM kv_store WHERE key = ?1", [key])? > 0))
            .map_err(errno)
    }

    /// Every key in key order, optionally only those starting with `prefix`.
    pub fn kv_list(&self, prefix: Option<&str>) -> Result<Vec<KvEntry>, String> {
        self.read_tx(|c| {
            let mut st = c.prepare(
                "SELECT key, value, created_at, updated_at FROM kv_store
                 WHERE ?1 IS NULL OR substr(key, 1, length(?1)) = ?1 ORDER BY key ASC",
            )?;
            let rows = st.query_map([prefix], |r| {
                Ok(KvEntry {
                    key: r.get(0)?,
                    value: r.get(1)?,
                    created_at: r.get(2)?,
                    updated_at: r.get(3)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .map_err(errno)
    }
}
