//! Namespace batching: operations share one open transaction, each atomic on its own; a lost
//! batch is a sticky failure and tells the caches.

use super::*;

/// A store whose batch only ends at a barrier (or the op budget), whatever the knobs say.
fn batched() -> Db {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fs.db");
    Store::create(&path, &InitOptions::default()).unwrap();
    let ns = NamespaceBatch {
        window: std::time::Duration::from_secs(3600),
        ops: 1_000_000,
        gap: std::time::Duration::ZERO,
    };
    let store = Store::open_with(
        &path,
        false,
        None,
        Some(ns),
        crate::cache::CacheConfig::from_knobs(crate::knobs::get()),
    )
    .unwrap();
    Db { dir, store }
}

/// Whether a second connection (another process) sees `name` in the root.
fn committed(db: &Db, name: &str) -> bool {
    let c = rusqlite::Connection::open(db.path()).unwrap();
    c.query_row(
        "SELECT count(*) FROM fs_dentry WHERE parent_ino = 1 AND CAST(name AS BLOB) = CAST(?1 AS BLOB)",
        [name],
        |r| r.get::<_, i64>(0),
    )
    .unwrap()
        > 0
}

#[test]
fn operations_are_visible_at_once_and_committed_by_the_barrier() {
    let db = batched();
    let d = db.dir(Ino::ROOT, "d");
    let f = db.file(d, "f");
    db.write(f, 0, b"hello").unwrap();
    db.rename(
        d,
        b"f",
        Ino::ROOT,
        b"g",
        RenameFlags::default(),
        &NoReferences,
    )
    .unwrap();
    assert_eq!(db.lookup(Ino::ROOT, b"g").unwrap().ino, f);
    assert_eq!(db.read(f, 0, 10).unwrap(), b"hello");
    assert_eq!(db.readdir(d, 0, 10).unwrap().len(), 2, ". and ..");
    assert!(
        !committed(&db, "d") && !committed(&db, "g"),
        "nothing committed yet"
    );
    db.sync().unwrap();
    assert!(committed(&db, "d") && committed(&db, "g"));
}

#[test]
fn a_failed_operation_leaves_nothing_and_the_batch_goes_on() {
    let db = batched();
    db.dir(Ino::ROOT, "d");
    // A mkdir over an existing name and an rmdir of a missing one fail inside the batch.
    assert_eq!(
        db.mkdir(Ino::ROOT, b"d", 0o755, ME).unwrap_err(),
        Errno::EEXIST
    );
    assert_eq!(
        db.rmdir(Ino::ROOT, b"missing", &NoReferences).unwrap_err(),
        Errno::ENOENT
    );
    db.file(Ino::ROOT, "f");
    db.sync().unwrap();
    assert!(committed(&db, "d") && committed(&db, "f"));
    db.assert_clean();
}

#[test]
fn the_op_budget_commits_without_a_barrier() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fs.db");
    Store::create(&path, &InitOptions::default()).unwrap();
    let ns = NamespaceBatch {
        window: std::time::Duration::from_secs(3600),
        ops: 3,
        gap: std::time::Duration::ZERO,
    };
    let db = Db {
        store: Store::open_with(
            &path,
            false,
            None,
            Some(ns),
            crate::cache::CacheConfig::from_knobs(crate::knobs::get()),
        )
        .unwrap(),
        dir,
    };
    db.file(Ino::ROOT, "a");
    db.file(Ino::ROOT, "b");
    assert!(!committed(&db, "a"));
    db.file(Ino::ROOT, "c");
    assert!(
        committed(&db, "a") && committed(&db, "c"),
        "third op commits"
    );
}

#[test]
fn a_failed_commit_loses_the_window_is_sticky_and_drops_the_caches() {
    let db = batched();
    db.file(Ino::ROOT, "kept");
    // Every new inode from now on adds a row that breaks a deferred foreign key: checked
    // only at COMMIT, which then fails.
    db.raw()
        .execute_batch(
            "CREATE TABLE boom_parent(id INTEGER PRIMARY KEY);
             CREATE TABLE boom_child(p INTEGER REFERENCES boom_parent(id)
                 DEFERRABLE INITIALLY DEFERRED);
             CREATE TRIGGER boom AFTER INSERT ON fs_inode BEGIN
                 INSERT INTO boom_child VALUES (NEW.ino);
             END;",
        )
        .unwrap();
    db.writer_pragma("foreign_keys", "ON").unwrap();
    let x = db.file(Ino::ROOT, "x");
    db.unlink(Ino::ROOT, b"kept", &NoReferences).unwrap();
    assert_eq!(db.lookup(Ino::ROOT, b"x").unwrap().ino, x, "acknowledged");
    let e = db.sync().unwrap_err();
    // The lookups below would be answered from the server caches if they were not dropped.
    // The whole window is gone, nothing else.
    assert_eq!(db.lookup(Ino::ROOT, b"x").unwrap_err(), Errno::ENOENT);
    assert!(
        db.lookup(Ino::ROOT, b"kept").is_ok(),
        "the unlink was lost too"
    );
    // Sticky: every later barrier reports it, every later change is refused with it, even
    // when the cause is gone; reads go on.
    assert_eq!(db.sync(), Err(e));
    assert_eq!(db.fsync(Ino::ROOT), Err(e));
    assert_eq!(db.file_err(Ino::ROOT, "y"), Some(e));
    db.raw().execute_batch("DROP TRIGGER boom").unwrap();
    assert_eq!(db.file_err(Ino::ROOT, "z"), Some(e));
    assert!(db.lookup(Ino::ROOT, b"z").is_err());
    assert_eq!(db.sync(), Err(e));
    let what = db.failure().summary().unwrap();
    assert!(what.contains("2 acknowledged operations"), "{what}");
    db.assert_clean();
}

/// A kernel's references as the server counts them: unlinks may run after their reply.
fn kernel_refs() -> crate::dispatch::LookupRefs {
    crate::dispatch::LookupRefs::default()
}

#[test]
fn a_removal_the_caches_can_answer_is_acknowledged_before_its_statements_run() {
    for rmdir in [false, true] {
        let db = batched();
        let x = match rmdir {
            false => db.file(Ino::ROOT, "x"),
            true => db.dir(Ino::ROOT, "x"),
        };
        db.sync().unwrap();
        // From now on deleting a name fails inside SQLite: a removal that ran before its
        // reply would report it.
        db.raw()
            .execute_batch(
                "CREATE TRIGGER boom BEFORE DELETE ON fs_dentry BEGIN SELECT RAISE(ABORT, 'boom'); END;",
            )
            .unwrap();
        let refs = kernel_refs();
        let answer = match rmdir {
            false => db.unlink(Ino::ROOT, b"x", &refs).map(|_| ()),
            true => db.rmdir(Ino::ROOT, b"x", &refs),
        };
        assert_eq!(answer, Ok(()), "rmdir {rmdir}: acknowledged");
        // It ran, failed and was lost: sticky, counted, and the caches let go of the change.
        let e = db.sync().unwrap_err();
        assert_eq!(db.sync(), Err(e));
        assert_eq!(
            db.lookup(Ino::ROOT, b"x").unwrap().ino,
            x,
            "rmdir {rmdir}: the name is back"
        );
        let what = db.failure().summary().unwrap();
        assert!(what.contains("1 acknowledged operation"), "{what}");
    }
}

#[test]
fn a_later_unlink_runs_in_order_before_anything_that_follows_it() {
    let db = batched();
    let refs = kernel_refs();
    let f = db.file(Ino::ROOT, "f");
    let open = db.file(Ino::ROOT, "open");
    refs.add(open, 1);
    let twice = db.file(Ino::ROOT, "one");
    db.link(twice, Ino::ROOT, b"two").unwrap();
    db.getattr(twice).unwrap();
    db.unlink(Ino::ROOT, b"f", &refs).unwrap();
    db.unlink(Ino::ROOT, b"open", &refs).unwrap();
    assert_eq!(
        db.unlink(Ino::ROOT, b"one", &refs),
        Ok(Some(twice)),
        "keeps a name"
    );
    assert_eq!(db.lookup(Ino::ROOT, b"two").unwrap().nlink, 1);
    // The same names again: each create sees its name gone first.
    assert_eq!(db.lookup(Ino::ROOT, b"f").unwrap_err(), Errno::ENOENT);
    let g = db.file(Ino::ROOT, "f");
    assert_ne!(g, f);
    assert_eq!(
        db.getattr(open).unwrap().nlink,
        0,
        "an orphan while referenced"
    );
    db.sync().unwrap();
    assert!(committed(&db, "f") && !committed(&db, "open"));
    let rows = |ino: Ino| {
        db.q(&format!(
            "SELECT count(*) FROM fs_inode WHERE ino = {}",
            ino.0
        ))
    };
    assert_eq!(rows(f), 0, "unreferenced: its rows went with its name");
    assert_eq!(rows(open), 1, "referenced: kept until its last FORGET");
    assert!(refs.forget(open, 1).orphan_released);
    db.reap(&[open]).unwrap();
    assert_eq!(rows(open), 0);
    db.assert_clean();
}

#[test]
fn a_later_unlink_leaves_a_name_another_process_gave_to_another_file() {
    let db = batched();
    let refs = kernel_refs();
    let f = db.file(Ino::ROOT, "f");
    db.sync().unwrap();
    // Another process replaces the name; this server's caches still say `f`.
    let c = db.raw();
    c.execute_batch(
        "INSERT INTO fs_inode (mode, nlink, atime, mtime, ctime) VALUES (33188, 1, 0, 0, 0);
         UPDATE fs_dentry SET ino = last_insert_rowid() WHERE parent_ino = 1 AND name = 'f';",
    )
    .unwrap();
    let named = "SELECT ino FROM fs_dentry WHERE parent_ino = 1 AND name = 'f'";
    let other = db.q(named);
    assert_ne!(other, f.0 as i64);
    c.execute("UPDATE fs_inode SET nlink = 0 WHERE ino = ?1", [f.0 as i64])
        .unwrap();
    db.unlink(Ino::ROOT, b"f", &refs).unwrap();
    db.sync().unwrap();
    assert_eq!(db.q(named), other, "the other file keeps the name");
}

/// `rm -rf` of a fresh tree: every unlink and rmdir is answered from the caches (a new
/// directory's listing is known, and follows the names created and removed in it), and the
/// statements run in order, each directory's entries before the directory.
#[test]
fn a_later_rmdir_runs_after_the_unlinks_queued_before_it() {
    let db = batched();
    let refs = kernel_refs();
    let d = db.dir(Ino::ROOT, "d");
    let s = db.dir(d, "s");
    for name in ["a", "b"] {
        db.file(d, name);
        db.file(s, name);
    }
    db.unlink(d, b"a", &refs).unwrap();
    assert_eq!(
        db.rmdir(Ino::ROOT, b"d", &refs),
        Err(Errno::ENOTEMPTY),
        "the listing still has b and s"
    );
    assert_eq!(db.rmdir(d, b"s", &refs), Err(Errno::ENOTEMPTY));
    for (p, name) in [(s, "a"), (s, "b"), (d, "b")] {
        db.unlink(p, name.as_bytes(), &refs).unwrap();
    }
    db.rmdir(d, b"s", &refs).unwrap();
    db.rmdir(Ino::ROOT, b"d", &refs).unwrap();
    assert_eq!(db.lookup(Ino::ROOT, b"d").unwrap_err(), Errno::ENOENT);
    let root = db.readdir(Ino::ROOT, 0, 100).unwrap();
    assert!(root.iter().all(|e| e.name != b"d"), "gone from the listing");
    assert_eq!(
        db.getattr(Ino::ROOT).unwrap().nlink,
        2,
        "the root lost a subdirectory"
    );
    db.sync().unwrap();
    assert!(!committed(&db, "d"));
    assert_eq!(db.q("SELECT count(*) FROM fs_dentry"), 0);
    assert_eq!(db.q("SELECT count(*) FROM fs_inode"), 1, "only the root");
    db.assert_clean();
}

#[test]
fn a_later_rmdir_leaves_a_directory_another_process_put_an_entry_into() {
    let db = batched();
    let refs = kernel_refs();
    let d = db.dir(Ino::ROOT, "d");
    db.sync().unwrap();
    // Another process puts a file into `d`; this server's caches still say it is empty.
    db.raw()
        .execute_batch(&format!(
            "INSERT INTO fs_inode (mode, nlink, atime, mtime, ctime) VALUES (33188, 1, 0, 0, 0);
             INSERT INTO fs_dentry (name, parent_ino, ino) VALUES ('theirs', {}, last_insert_rowid());",
            d.0
        ))
        .unwrap();
    db.rmdir(Ino::ROOT, b"d", &refs).unwrap();
    db.sync().unwrap();
    assert!(committed(&db, "d"), "the directory stays, with their file");
    assert_eq!(
        db.q(&format!(
            "SELECT count(*) FROM fs_dentry WHERE parent_ino = {}",
            d.0
        )),
        1
    );
    assert!(db.failure().check().is_ok(), "not a failure of this server");
}
