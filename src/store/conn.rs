//! Connections: the single writer (behind the store's mutex) and the pool of read connections,
//! the per-connection settings, the transaction helpers and the durability barrier.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use crate::errno::Errno;

/// Most idle read connections kept; more are opened on demand and closed when returned.
const MAX_IDLE_READERS: usize = 16;
/// Prepared statements cached per connection.
const STATEMENT_CACHE: usize = 96;

/// Open a connection with the settings every connection shares (busy timeout, cache size,
/// statement cache) taken from the knobs.
pub fn open(path: &Path, readonly: bool) -> rusqlite::Result<Connection> {
    let rw = if readonly {
        OpenFlags::SQLITE_OPEN_READ_ONLY
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
    };
    let conn = Connection::open_with_flags(path, rw | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    let k = crate::knobs::get();
    conn.busy_timeout(Duration::from_millis(k.sqlite_busy_timeout_ms))?;
    let kib = i64::try_from(k.sqlite_cache_kib).unwrap_or(i64::MAX);
    conn.pragma_update(None, "cache_size", -kib)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// The writer connection and what the durability barrier remembers about the WAL file.
pub struct Writer {
    pub conn: Connection,
    /// (st_dev, st_ino) of the -wal file last made durable: a different value means the file
    /// was (re)created since, so its directory entry must be synced too.
    synced_wal: Option<(u64, u64)>,
}

impl Writer {
    /// Open the writer: WAL journal, synchronous=NORMAL.
    pub fn open(path: &Path) -> rusqlite::Result<Writer> {
        let conn = open(path, false)?;
        let _: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        Ok(Writer {
            conn,
            synced_wal: None,
        })
    }

    /// Run `f` as ONE immediate transaction: commit if it returns Ok, roll back otherwise (and
    /// if the commit itself fails), so the database never keeps half an operation.
    pub fn transact<T>(
        &mut self,
        f: impl FnOnce(&Connection) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()?;
        Ok(out)
    }

    /// The durability barrier. The caller holds the writer lock, so every transaction committed
    /// before this call is in the -wal file (or, after a checkpoint, the main file); an fdatasync
    /// of that file makes it durable. A freshly created -wal file also gets its directory
    /// synced, or a power cut could lose the file's name along with the frames.
    pub fn sync(&mut self, db: &Path) -> Result<(), Errno> {
        let wal = wal_path(db);
        match File::open(&wal) {
            Ok(f) => {
                let md = f.metadata()?;
                f.sync_data()?;
                let id = (md.dev(), md.ino());
                if self.synced_wal != Some(id) {
                    sync_parent_dir(db)?;
                    self.synced_wal = Some(id);
                }
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                File::open(db)?.sync_data()?;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// `<db>-wal`, the name SQLite gives the write-ahead log.
pub fn wal_path(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_os_string();
    s.push("-wal");
    PathBuf::from(s)
}

fn sync_parent_dir(db: &Path) -> Result<(), Errno> {
    let dir = match db.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Read-only connections checked out per call. The mutex guards only the idle list; a
/// checked-out connection is owned by one caller until its guard drops.
pub struct Pool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl Pool {
    pub fn new(path: &Path) -> Pool {
        Pool {
            path: path.to_path_buf(),
            idle: Mutex::new(Vec::new()),
        }
    }

    fn checkout(&self) -> Result<Connection, Errno> {
        if let Some(c) = self.idle.lock().pop() {
            return Ok(c);
        }
        Ok(open(&self.path, true)?)
    }

    fn checkin(&self, conn: Connection) {
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE_READERS {
            idle.push(conn);
        }
    }

    /// Run `f` inside one read transaction (a consistent snapshot across its statements).
    pub fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T, Errno>) -> Result<T, Errno> {
        let mut conn = self.checkout()?;
        let out = (|| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        })();
        if conn.is_autocommit() {
            self.checkin(conn);
        }
        out
    }
}
