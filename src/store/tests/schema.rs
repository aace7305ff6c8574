use super::*;

fn normalise(sql: &str) -> String {
    let no_comments: Vec<&str> = sql
        .lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .collect();
    no_comments
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace("( ", "(")
        .replace(" )", ")")
        .trim_end_matches(';')
        .trim()
        .to_string()
}

fn spec_ddl() -> Vec<String> {
    let spec = include_str!("../../../SPEC.md");
    let at = spec
        .find("\n## Schema (DDL)")
        .expect("SPEC.md has the DDL heading");
    let rest = &spec[at..];
    let start = rest.find("```sql\n").expect("sql block") + "```sql\n".len();
    let body = &rest[start..];
    let body = &body[..body.find("\n```").expect("block end")];
    assert_eq!(
        spec.matches("```sql").count(),
        1,
        "SPEC.md has exactly one sql block"
    );
    let mut v = statements(body);
    v.sort();
    v
}

/// Split DDL into statements at `;`, keeping a trigger's `BEGIN ... END` body whole.
fn statements(ddl: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for part in ddl.split(';') {
        cur.push_str(part);
        let text = normalise(&cur);
        if text.starts_with("CREATE TRIGGER") && !text.ends_with("END") {
            cur.push(';');
            continue;
        }
        if !text.is_empty() {
            out.push(text);
        }
        cur.clear();
    }
    out
}

#[test]
fn spec_ddl_matches_created_database() {
    let db = fresh();
    let c = db.raw();
    let mut st = c
        .prepare(
            "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'
             ORDER BY name",
        )
        .unwrap();
    let mut got: Vec<String> = st
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|s| normalise(&s.unwrap()))
        .collect();
    got.sort();
    assert_eq!(got, spec_ddl());
    // And the const itself is what SPEC.md shows.
    let mut own = statements(crate::store::schema::DDL);
    own.sort();
    assert_eq!(own, spec_ddl());
}

#[test]
fn new_database_has_root_config_and_version() {
    let db = fresh();
    assert_eq!(db.q("PRAGMA user_version"), USER_VERSION_V05);
    let root = db.getattr(Ino::ROOT).unwrap();
    assert_eq!(root.mode, 0o040755);
    assert_eq!(root.nlink, 2);
    assert_eq!(db.q("SELECT nlink FROM fs_inode WHERE ino = 1"), 1);
    assert_eq!(
        db.config(),
        FsConfig {
            chunk_size: 65536,
            inline_threshold: 4096
        }
    );
    let v: String = db
        .raw()
        .query_row(
            "SELECT value FROM fs_config WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(v, "0.5");
    let mode: String = db
        .raw()
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    db.assert_clean();
}

#[test]
fn create_refuses_existing_and_bad_options() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.db");
    std::fs::write(&p, b"hello").unwrap();
    assert!(matches!(
        Store::create(&p, &InitOptions::default()),
        Err(StoreError::Exists { .. })
    ));
    assert_eq!(std::fs::read(&p).unwrap(), b"hello");
    let q = dir.path().join("y.db");
    for (cs, thr) in [(1000, 10), (256, 10), (2 << 20, 10), (4096, 8192)] {
        let r = Store::create(
            &q,
            &InitOptions {
                chunk_size: cs,
                inline_threshold: thr,
                ..InitOptions::default()
            },
        );
        assert!(matches!(r, Err(StoreError::Invalid { .. })), "{cs} {thr}");
        assert!(!q.exists());
    }
}

fn refused(p: &std::path::Path) -> StoreError {
    let before = std::fs::read(p).unwrap();
    let e = match Store::open(p, false) {
        Err(e) => e,
        Ok(_) => panic!("opened {p:?}"),
    };
    assert_eq!(
        std::fs::read(p).unwrap(),
        before,
        "refusal modified the file"
    );
    e
}

#[test]
fn open_refuses_non_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("notes.txt");
    std::fs::write(
        &p,
        b"this is not a database, just some text that is long enough",
    )
    .unwrap();
    assert!(matches!(refused(&p), StoreError::NotSqlite { .. }));
    std::fs::write(&p, b"").unwrap();
    assert!(matches!(refused(&p), StoreError::NotSqlite { .. }));
    assert!(matches!(
        Store::open(&dir.path().join("missing.db"), false),
        Err(StoreError::Io { .. })
    ));
}

/// A checkpointed copy of a fresh database with some pragma/rows changed.
fn variant(edit: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("v.db");
    Store::create(&p, &InitOptions::default()).unwrap();
    let c = rusqlite::Connection::open(&p).unwrap();
    c.execute_batch(edit).unwrap();
    c.execute_batch("PRAGMA journal_mode=DELETE").unwrap();
    drop(c);
    (dir, p)
}

#[test]
fn open_refuses_old_and_unknown_versions() {
    for uv in 1..=4 {
        let (_d, p) = variant(&format!("PRAGMA user_version = {uv}"));
        match refused(&p) {
            StoreError::OldSchema { .. } => {}
            e => panic!("user_version {uv}: {e}"),
        }
        let msg = refused(&p).to_string();
        assert!(msg.contains("agentfs migrate"), "{msg}");
    }
    let (_d, p) = variant("PRAGMA user_version = 6");
    assert!(matches!(refused(&p), StoreError::UnknownSchema { .. }));
    let (_d, p) = variant(
        "PRAGMA user_version = 0; UPDATE fs_config SET value = '0.4' WHERE key = 'schema_version'",
    );
    assert!(matches!(refused(&p), StoreError::OldSchema { .. }));
    let (_d, p) = variant("UPDATE fs_config SET value = '0.9' WHERE key = 'schema_version'");
    assert!(matches!(refused(&p), StoreError::UnknownSchema { .. }));
    let (_d, p) = variant("PRAGMA user_version = 0; DROP TABLE fs_inode");
    assert!(matches!(refused(&p), StoreError::UnknownSchema { .. }));
    let (_d, p) = variant("DELETE FROM fs_config WHERE key = 'inline_threshold'");
    assert!(matches!(refused(&p), StoreError::Invalid { .. }));
}

#[test]
fn unstamped_foreign_v05_database_opens_with_its_layout() {
    // Another implementation: no user_version, no extension objects, 4 KiB chunks.
    let (_d, p) = variant(
        "PRAGMA user_version = 0;
         DROP TABLE fs_xattr; DROP INDEX idx_fs_dentry_parent_id; DROP INDEX idx_fs_dentry_ino;
         DROP INDEX idx_fs_inode_orphan;
         UPDATE fs_config SET value = '4096' WHERE key = 'chunk_size';
         UPDATE fs_config SET value = '1000' WHERE key = 'inline_threshold';",
    );
    let ro = Store::open(&p, true).unwrap();
    assert_eq!(ro.listxattr(Ino::ROOT).unwrap(), b"");
    assert_eq!(ro.getxattr(Ino::ROOT, b"user.x"), Err(Errno::ENODATA));
    drop(ro);
    let s = Store::open(&p, false).unwrap();
    assert_eq!(
        s.config(),
        FsConfig {
            chunk_size: 4096,
            inline_threshold: 1000
        }
    );
    let f = s
        .mknod(Ino::ROOT, b"f", libc::S_IFREG | 0o600, 0, ME)
        .unwrap()
        .ino;
    s.write(f, 0, &pattern(10000, 3)).unwrap();
    s.sync().unwrap(); // commit the batched write before looking at the rows
    let c = rusqlite::Connection::open(&p).unwrap();
    let rows: i64 = c
        .query_row(
            "SELECT count(*) FROM fs_data WHERE ino = ?1",
            [f.0 as i64],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(rows, 3);
    s.setxattr(f, b"user.a", b"1", 0).unwrap();
    assert!(s.check().unwrap().is_empty());
}

#[test]
fn readonly_open_reads_and_refuses_writes() {
    let db = fresh();
    let f = db.file(Ino::ROOT, "f");
    db.write(f, 0, b"hello").unwrap();
    // Another open sees committed state only: the barrier commits the namespace batch.
    db.sync().unwrap();
    let ro = Store::open(&db.path(), true).unwrap();
    assert_eq!(ro.read(f, 0, 100).unwrap(), b"hello");
    assert_eq!(ro.write(f, 0, b"x"), Err(Errno::EROFS));
    assert_eq!(ro.mkdir(Ino::ROOT, b"d", 0o755, ME), Err(Errno::EROFS));
    assert_eq!(ro.unlink(Ino::ROOT, b"f", &NoReferences), Err(Errno::EROFS));
    assert_eq!(ro.setxattr(f, b"user.a", b"", 0), Err(Errno::EROFS));
    assert_eq!(ro.reap_orphans(), Err(Errno::EROFS));
    ro.sync().unwrap();
    ro.checkpoint().unwrap();
}

#[test]
fn store_is_send_and_sync_and_serves_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Store>();
    let db = fresh();
    let store = std::sync::Arc::new(db.store);
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let s = store.clone();
            std::thread::spawn(move || {
                let d = s
                    .mkdir(Ino::ROOT, format!("d{t}").as_bytes(), 0o755, ME)
                    .unwrap()
                    .ino;
                for i in 0..20 {
                    let f = s
                        .mknod(d, format!("f{i}").as_bytes(), libc::S_IFREG | 0o644, 0, ME)
                        .unwrap()
                        .ino;
                    s.write(f, 0, &pattern(5000, i as u8)).unwrap();
                    assert_eq!(s.read(f, 0, 6000).unwrap(), pattern(5000, i as u8));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(store.getattr(Ino::ROOT).unwrap().nlink, 6);
    assert!(store.check().unwrap().is_empty());
}

#[test]
fn statfs_reports_space_and_inodes() {
    let db = fresh();
    for i in 0..5 {
        db.file(Ino::ROOT, &format!("f{i}"));
    }
    let s = db.statfs().unwrap();
    assert_eq!(s.bsize, 4096);
    assert_eq!(s.namelen, 255);
    assert!(s.blocks >= s.bfree);
    assert!(s.files >= 6 && s.files >= s.ffree);
}

#[test]
fn checkpoint_truncates_wal() {
    let db = fresh();
    let f = db.file(Ino::ROOT, "f");
    db.write(f, 0, &pattern(100_000, 1)).unwrap();
    db.checkpoint().unwrap();
    let wal = conn::wal_path(&db.path());
    assert_eq!(std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0), 0);
    // The main file alone is complete.
    let copy = db.dir.path().join("copy.db");
    std::fs::copy(db.path(), &copy).unwrap();
    let s = Store::open(&copy, true).unwrap();
    assert_eq!(s.read(f, 0, 200_000).unwrap(), pattern(100_000, 1));
}

#[test]
fn a_writable_open_adds_the_change_counter_that_a_database_lacks() {
    // A database made before the counter: no fs_change, none of its triggers.
    let (_d, p) = variant("");
    let c = rusqlite::Connection::open(&p).unwrap();
    let names = |c: &rusqlite::Connection| -> Vec<String> {
        let mut st = c
            .prepare("SELECT name FROM sqlite_master WHERE name LIKE 'fs\\_change%' ESCAPE '\\'")
            .unwrap();
        let v = st.query_map([], |r| r.get(0)).unwrap();
        v.collect::<Result<_, _>>().unwrap()
    };
    let made = names(&c);
    assert_eq!(made.len(), 28, "{made:?}");
    for n in &made {
        let kind = if n == "fs_change" { "TABLE" } else { "TRIGGER" };
        c.execute_batch(&format!("DROP {kind} {n}")).unwrap();
    }
    assert_eq!(crate::store::change_seq(&c).unwrap(), None);
    drop(c);
    // A read-only open leaves it as it is.
    drop(Store::open(&p, true).unwrap());
    let c = rusqlite::Connection::open(&p).unwrap();
    assert!(names(&c).is_empty());
    drop(c);
    let s = Store::open(&p, false).unwrap();
    let c = rusqlite::Connection::open(&p).unwrap();
    assert_eq!(names(&c).len(), 28);
    let before = crate::store::change_seq(&c).unwrap();
    s.mknod(Ino::ROOT, b"f", libc::S_IFREG | 0o600, 0, ME)
        .unwrap();
    s.sync().unwrap();
    let after = crate::store::change_seq(&c).unwrap();
    assert!(after > before, "{before:?} -> {after:?}");
    // A commit to a table outside the filesystem leaves it alone.
    c.execute_batch("CREATE TABLE _litestream_seq (id INTEGER PRIMARY KEY, seq INTEGER); INSERT INTO _litestream_seq VALUES (1, 1); INSERT INTO kv_store (key, value) VALUES ('k', '1');")
        .unwrap();
    assert_eq!(crate::store::change_seq(&c).unwrap(), after);
}

/// A connection as the store opens it plans each statement once: rusqlite's statement cache
/// clears a statement's bindings when it is returned, and SQLite (without its query planner
/// stability guarantee) takes that for a rebind of parameters it planned by value (here the
/// listing's LIMIT), so every use of the cached statement was parsed and planned again.
#[test]
fn a_cached_statement_is_planned_once_whatever_is_bound() {
    let db = fresh();
    let d = db.dir(Ino::ROOT, "d");
    for i in 0..20 {
        db.file(d, &format!("f{i}"));
    }
    let sql = "SELECT d.id, d.name FROM fs_dentry d
               WHERE d.parent_ino = ?1 AND d.id > ?2 ORDER BY d.id LIMIT ?3";
    let replans = |c: &rusqlite::Connection| {
        let mut n = 0;
        for k in 0..10i64 {
            let mut st = c.prepare_cached(sql).unwrap();
            {
                let mut rows = st.query((d.0 as i64, k, 5 + k)).unwrap();
                while rows.next().unwrap().is_some() {}
            }
            n = st.get_status(rusqlite::StatementStatus::RePrepare);
        }
        n
    };
    let ours = crate::store::conn::open(&db.dir.path().join("fs.db"), true).unwrap();
    assert_eq!(replans(&ours), 0, "a cached statement was planned again");
    // The control: a plain connection plans it again at each use.
    let plain = rusqlite::Connection::open(db.dir.path().join("fs.db")).unwrap();
    assert!(
        replans(&plain) >= 5,
        "SQLite no longer plans by a bound LIMIT"
    );
}
