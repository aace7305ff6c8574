//! Unit tests of the store (run with `cargo test --lib store`).

mod batched;
mod check_rules;
mod data;
mod durability;
mod model;
mod namespace;
mod nsbatch;
mod ordering;
mod schema;

use std::path::PathBuf;

use super::*;

pub const ME: Caller = Caller {
    uid: 1000,
    gid: 1000,
};

/// Keeps every inode that loses its last name (as if the kernel still had it open).
pub struct Keep;
impl Liveness for Keep {
    fn retain_orphan(&self, _: Ino) -> bool {
        true
    }
}

pub struct Db {
    pub dir: tempfile::TempDir,
    pub store: Store,
}

impl std::ops::Deref for Db {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

impl Db {
    pub fn path(&self) -> PathBuf {
        self.store.path().to_path_buf()
    }
    /// A raw connection for inspecting or corrupting rows (after committing the open
    /// namespace batch, whose operations only the writer connection sees).
    pub fn raw(&self) -> rusqlite::Connection {
        self.store.commit_namespace_batch().unwrap();
        rusqlite::Connection::open(self.store.path()).unwrap()
    }
    pub fn q(&self, sql: &str) -> i64 {
        self.raw().query_row(sql, [], |r| r.get(0)).unwrap()
    }
    pub fn file(&self, parent: Ino, name: &str) -> Ino {
        self.mknod(parent, name.as_bytes(), libc::S_IFREG | 0o644, 0, ME)
            .unwrap()
            .ino
    }
    pub fn file_err(&self, parent: Ino, name: &str) -> Option<Errno> {
        self.mknod(parent, name.as_bytes(), libc::S_IFREG | 0o644, 0, ME)
            .err()
    }
    pub fn dir(&self, parent: Ino, name: &str) -> Ino {
        self.mkdir(parent, name.as_bytes(), 0o755, ME).unwrap().ino
    }
    pub fn kind(&self, ino: Ino) -> i64 {
        self.q(&format!(
            "SELECT storage_kind FROM fs_inode WHERE ino = {}",
            ino.0
        ))
    }
    pub fn rows(&self, ino: Ino) -> i64 {
        self.q(&format!(
            "SELECT count(*) FROM fs_data WHERE ino = {}",
            ino.0
        ))
    }
    pub fn all(&self, ino: Ino) -> Vec<u8> {
        let size = self.getattr(ino).unwrap().size;
        let mut out = Vec::new();
        while (out.len() as u64) < size {
            let got = self.read(ino, out.len() as u64, 1 << 20).unwrap();
            assert!(!got.is_empty());
            out.extend(got);
        }
        out
    }
    pub fn assert_clean(&self) {
        let f = self.check().unwrap();
        assert!(f.is_empty(), "check findings: {f:#?}");
    }
}

/// A database opened without batching: the storage-layer tests inspect rows right after
/// each call. `batched.rs` and the model test cover the batched path.
pub fn fresh_with(chunk_size: u64, inline_threshold: u64) -> Db {
    fresh_cfg(chunk_size, inline_threshold, None)
}

/// A batching policy for tests: nothing commits on its own for a minute unless `window_ms`
/// is small.
pub fn batching(window_ms: u64) -> batch::BatchConfig {
    batch::BatchConfig {
        window: std::time::Duration::from_millis(window_ms),
        inode_trigger: 1 << 30,
        max_pending: 1 << 30,
        txn_inodes: 1024,
        txn_bytes: 1 << 30,
    }
}

/// Namespace batching as the knobs say, with a window that never ends during a test: every
/// operation stays in the open batch until a barrier, [`Db::raw`] or the op budget.
pub fn namespace_batching() -> Option<NamespaceBatch> {
    NamespaceBatch::from_knobs(crate::knobs::get()).map(|p| NamespaceBatch {
        window: std::time::Duration::from_secs(3600),
        gap: std::time::Duration::ZERO,
        ..p
    })
}

pub fn fresh_cfg(
    chunk_size: u64,
    inline_threshold: u64,
    batching: Option<batch::BatchConfig>,
) -> Db {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fs.db");
    Store::create(
        &path,
        &InitOptions {
            chunk_size,
            inline_threshold,
            ..InitOptions::default()
        },
    )
    .unwrap();
    let store = Store::open_with(
        &path,
        false,
        batching,
        namespace_batching(),
        crate::cache::CacheConfig::from_knobs(crate::knobs::get()),
    )
    .unwrap();
    Db { dir, store }
}

pub fn fresh() -> Db {
    fresh_with(65536, 4096)
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seed as u32) as u8 | 1)
        .collect()
}
