//! The database-lifecycle tools: migrate (in place and by copy) from every older format,
//! integrity (one injected violation per rule), fsck, backup/materialize, and kv/tools —
//! the last ones also against a live mount under write load.

mod common;
mod fixtures;

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{agentfs, fuse_or_skip, scratch_root, Mounted};
use fixtures::{Old, ALL};
use rusqlite::Connection;

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(scratch_root()).unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed ({:?}):\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn one_line_error(out: &Output, needle: &str) {
    assert!(!out.status.success(), "expected failure");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    assert!(err.contains(needle), "{err:?} should mention {needle:?}");
}

fn cat(db: &Path, path: &str) -> Vec<u8> {
    let out = agentfs(&["fs", s(db), "cat", path]);
    assert!(
        out.status.success(),
        "cat {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn stat_field(db: &Path, path: &str, field: &str) -> String {
    let out = ok(&agentfs(&["fs", s(db), "stat", path]));
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}: ")))
        .unwrap_or_else(|| panic!("no {field} in {out}"))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

fn query<T: rusqlite::types::FromSql>(db: &Path, sql: &str) -> T {
    let c = Connection::open(db).unwrap();
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// The logical content every fixture holds must read back the same after migration.
fn assert_fixture_content(db: &Path, v: Old) {
    common::assert_consistent(db);
    for (path, bytes) in fixtures::files() {
        assert_eq!(cat(db, path), bytes, "{v:?} {path}");
    }
    assert_eq!(stat_field(db, "/dir/a.txt", "ino"), "3");
    assert_eq!(stat_field(db, "/big.bin", "ino"), "4");
    assert_eq!(stat_field(db, "/hard", "nlink"), "2");
    assert_eq!(stat_field(db, "/big.bin", "mode"), "100600");
    assert_eq!(stat_field(db, "/big.bin", "uid"), "1000");
    let out = ok(&agentfs(&["fs", s(db), "stat", "/big.bin"]));
    assert!(out.contains("mtime: 1700000001."), "{out}");
    let ls = ok(&agentfs(&["fs", s(db), "ls", "/"]));
    for name in ["dir/", "big.bin", "sparse.bin", "link", "hard", "empty"] {
        assert!(ls.lines().any(|l| l == name), "{name} missing in {ls}");
    }
    assert_eq!(
        ok(&agentfs(&["kv", s(db), "get", "session:state"])).trim(),
        "{\"step\":3}"
    );
    let kv: i64 = query(db, "SELECT count(*) FROM kv_store");
    assert_eq!(kv, 2);
    let calls = ok(&agentfs(&["tools", s(db), "stats", "--json"]));
    let stats: serde_json::Value = serde_json::from_str(&calls).unwrap();
    assert_eq!(stats.as_array().unwrap().len(), 2, "{calls}");
    let target: String = query(db, "SELECT target FROM fs_symlink WHERE ino = 6");
    assert_eq!(target, "dir/a.txt");
    if v >= Old::V02 {
        let n: i64 = query(
            db,
            "SELECT count(*) FROM fs_whiteout WHERE (path = '/gone' AND parent_path = '/')
               OR (path = '/dir/old' AND parent_path = '/dir')",
        );
        assert_eq!(n, 2);
    }
    if v >= Old::V03 {
        let b: i64 = query(db, "SELECT base_ino FROM fs_origin WHERE delta_ino = 4");
        assert_eq!(b, 987654);
    }
    if v == Old::V04 {
        let p: String = query(
            db,
            "SELECT parent_path FROM fs_whiteout WHERE path = '/a/b/c'",
        );
        assert_eq!(p, "/a/b");
        let base: String = query(
            db,
            "SELECT value FROM fs_overlay_config WHERE key = 'base_path'",
        );
        assert_eq!(base, "/srv/base");
        let nsec: i64 = query(db, "SELECT mtime_nsec FROM fs_inode WHERE ino = 4");
        assert_eq!(nsec, 123456789);
        assert_eq!(stat_field(db, "/fifo", "mode"), "10600");
    }
}

fn fixture(dir: &Path, v: Old) -> PathBuf {
    let db = dir.join(format!("{v:?}.db"));
    fixtures::build(&db, v);
    db
}

#[test]
fn old_formats_are_refused_by_open_paths() {
    let d = scratch();
    for v in ALL {
        let db = fixture(d.path(), v);
        let before = fs::read(&db).unwrap();
        one_line_error(&agentfs(&["fs", s(&db), "ls", "/"]), "agentfs migrate");
        one_line_error(&agentfs(&["kv", s(&db), "list"]), "agentfs migrate");
        assert_eq!(fs::read(&db).unwrap(), before);
    }
}

#[test]
fn migrate_in_place_from_every_old_format() {
    let d = scratch();
    for v in ALL {
        let db = fixture(d.path(), v);
        // A dry run reports steps and leaves the file alone.
        let before = fs::read(&db).unwrap();
        let dry = ok(&agentfs(&["migrate", s(&db), "--dry-run"]));
        assert!(dry.contains("would migrate"), "{dry}");
        assert!(dry.contains("user_version"), "{dry}");
        assert_eq!(
            fs::read(&db).unwrap(),
            before,
            "{v:?}: dry run changed the file"
        );

        let out = ok(&agentfs(&["migrate", s(&db)]));
        assert!(out.contains("migrated"), "{out}");
        let uv: i64 = query(&db, "PRAGMA user_version");
        assert_eq!(uv, 5);
        // The recorded chunk size is kept; the defaulted inline threshold never exceeds it.
        let cs: String = query(&db, "SELECT value FROM fs_config WHERE key = 'chunk_size'");
        assert_eq!(cs, v.chunk_size().to_string(), "{v:?}");
        let it: String = query(
            &db,
            "SELECT value FROM fs_config WHERE key = 'inline_threshold'",
        );
        assert_eq!(it, v.chunk_size().min(4096).to_string(), "{v:?}");
        assert_fixture_content(&db, v);
        // Idempotent: a second run has nothing to do.
        let again = ok(&agentfs(&["migrate", s(&db)]));
        assert!(again.contains("nothing to do"), "{again}");
        // The migrated database is writable through the store.
        let mut child = std::process::Command::new(common::bin())
            .args(["fs", s(&db), "write", "/dir/new.txt"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"new").unwrap();
        assert!(child.wait().unwrap().success());
        assert_eq!(cat(&db, "/dir/new.txt"), b"new");
        common::assert_consistent(&db);
    }
}

#[test]
fn migrate_by_copy_from_every_old_format() {
    let d = scratch();
    for v in ALL {
        let db = fixture(d.path(), v);
        let before = fs::read(&db).unwrap();
        let target = d.path().join(format!("{v:?}-new.db"));
        let out = ok(&agentfs(&[
            "migrate",
            s(&db),
            "--copy",
            s(&target),
            "--verify",
        ]));
        assert!(out.contains("verified"), "{out}");
        assert_eq!(fs::read(&db).unwrap(), before, "{v:?}: source modified");
        let cs: String = query(
            &target,
            "SELECT value FROM fs_config WHERE key = 'chunk_size'",
        );
        assert_eq!(cs, "65536");
        // Small dense files became inline; the sparse file kept its hole.
        let kind: i64 = query(&target, "SELECT storage_kind FROM fs_inode WHERE ino = 3");
        assert_eq!(kind, 1);
        let kind: i64 = query(&target, "SELECT storage_kind FROM fs_inode WHERE ino = 7");
        assert_eq!(kind, 1);
        let rows: i64 = query(&target, "SELECT count(*) FROM fs_data WHERE ino = 4");
        assert_eq!(rows, 2, "100 000 bytes in 64 KiB chunks");
        let stored: i64 = query(
            &target,
            "SELECT coalesce(sum(length(data)), 0) FROM fs_data WHERE ino = 5",
        );
        assert!(stored < 50_000, "hole kept: {stored} bytes stored");
        assert_fixture_content(&target, v);
        // The main file alone is enough.
        let alone = d.path().join(format!("{v:?}-alone"));
        fs::create_dir(&alone).unwrap();
        let copy = alone.join("only.db");
        fs::copy(&target, &copy).unwrap();
        assert_fixture_content(&copy, v);
        // An existing target is refused unless overwriting is asked for.
        one_line_error(
            &agentfs(&["migrate", s(&db), "--copy", s(&target)]),
            "already exists",
        );
        ok(&agentfs(&[
            "migrate",
            s(&db),
            "--copy",
            s(&target),
            "--overwrite-target",
            "--verify",
        ]));
        assert_fixture_content(&target, v);
        let leftovers: Vec<_> = fs::read_dir(d.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".agentfs-"))
            .collect();
        assert!(leftovers.is_empty(), "staging files left: {leftovers:?}");
    }
}

/// A fresh v0.5 database with a few files, KV rows and tool calls.
fn populated(dir: &Path) -> PathBuf {
    let db = dir.join("v05.db");
    ok(&agentfs(&["init", s(&db), "--chunk-size", "4096"]));
    for (path, data) in [("/a", vec![7u8; 10_000]), ("/b", b"small".to_vec())] {
        let mut child = std::process::Command::new(common::bin())
            .args(["fs", s(&db), "write", path])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&data).unwrap();
        assert!(child.wait().unwrap().success());
    }
    ok(&agentfs(&["kv", s(&db), "set", "k", "[1,2]"]));
    ok(&agentfs(&[
        "tools",
        s(&db),
        "record",
        "t",
        "--result",
        "{}",
        "--started",
        "10",
        "--completed",
        "12",
    ]));
    common::assert_consistent(&db);
    db
}

fn integrity_json(db: &Path, extra: &[&str]) -> (i32, Vec<(String, String)>) {
    let mut args = vec!["integrity", s(db), "--json"];
    args.extend_from_slice(extra);
    let out = agentfs(&args);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let list = v["findings"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| {
                    (
                        f["rule"].as_str().unwrap().to_string(),
                        f["detail"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    (out.status.code().unwrap(), list)
}

#[test]
fn integrity_names_each_injected_violation() {
    let cases: &[(&str, &str)] = &[
        (
            "tool_call_outcome",
            "INSERT INTO tool_calls (name, result, error, started_at, completed_at, duration_ms)
             VALUES ('x', '1', 'e', 1, 1, 0)",
        ),
        (
            "tool_call_duration",
            "INSERT INTO tool_calls (name, result, started_at, completed_at, duration_ms)
             VALUES ('x', '1', 1, 3, 5)",
        ),
        (
            "tool_call_json",
            "INSERT INTO tool_calls (name, parameters, result, started_at, completed_at, duration_ms)
             VALUES ('x', '{bad', '1', 1, 1, 0)",
        ),
        ("kv_json", "INSERT INTO kv_store (key, value) VALUES ('bad', 'not json')"),
        ("origin_inode", "INSERT INTO fs_origin VALUES (999, 5)"),
        (
            "partial_origin_inode",
            "INSERT INTO fs_partial_origin (delta_ino, base_ino, base_path, base_size, created_at)
             VALUES (1, 5, '/x', 0, 0)",
        ),
        ("chunk_override", "INSERT INTO fs_chunk_override VALUES (2, 0)"),
        ("nlink", "UPDATE fs_inode SET nlink = 5 WHERE ino = 2"),
        ("data_inode", "INSERT INTO fs_data VALUES (777, 0, x'00')"),
        ("whiteout_parent", "INSERT INTO fs_whiteout VALUES ('/a/b', '/', 0)"),
        (
            "base_seen",
            &format!(
                "{}; INSERT INTO fs_base_seen VALUES ('/a', 1, 33188, 0, 0, 0, 0, 0, 'XYZ'),
                   ('rel', 1, 33188, 0, 0, 0, 0, 0, NULL)",
                agentfs::store::overlay::BASE_SEEN_DDL
            ),
        ),
    ];
    let d = scratch();
    let clean = populated(d.path());
    assert_eq!(integrity_json(&clean, &[]), (0, vec![]));
    for (rule, sql) in cases {
        let db = d.path().join(format!("{rule}.db"));
        ok(&agentfs(&["backup", s(&clean), s(&db)]));
        Connection::open(&db).unwrap().execute_batch(sql).unwrap();
        let (code, found) = integrity_json(&db, &[]);
        assert_eq!(code, 1, "{rule}");
        assert!(
            !found.is_empty() && found.iter().all(|(r, _)| r == rule),
            "{rule}: {found:?}"
        );
    }
    // Exit 2 when the database cannot be checked.
    let junk = d.path().join("junk.db");
    fs::write(&junk, b"not a database at all, not at all, no").unwrap();
    assert_eq!(agentfs(&["integrity", s(&junk)]).status.code(), Some(2));
}

#[test]
fn integrity_detects_sqlite_level_damage() {
    let d = scratch();
    let db = populated(d.path());
    let c = Connection::open(&db).unwrap();
    // An index entry the table does not have: integrity_check reports it.
    c.execute_batch(
        "PRAGMA wal_checkpoint(TRUNCATE);
         CREATE TABLE t (x); CREATE INDEX t_x ON t(x);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
           INSERT INTO t SELECT i FROM n;
         PRAGMA writable_schema = ON;
         UPDATE sqlite_schema SET sql = 'CREATE INDEX t_x ON t(x DESC)' WHERE name = 't_x';
         PRAGMA writable_schema = OFF;",
    )
    .unwrap();
    drop(c);
    let (code, found) = integrity_json(&db, &[]);
    assert_eq!(code, 1);
    assert!(
        found.iter().any(|(r, _)| r == "sqlite_integrity"),
        "{found:?}"
    );
}

/// Give inode `ino` of `db` a partial-origin row over `base` (fingerprint of the file now) and
/// override chunk 1 (which holds 4096 bytes of 0xEE).
fn make_partial(db: &Path, ino: i64, base: &Path) {
    use std::os::unix::fs::MetadataExt;
    // Recorded base paths are canonical.
    let base = &fs::canonicalize(base).unwrap();
    let md = fs::metadata(base).unwrap();
    let c = Connection::open(db).unwrap();
    c.execute(
        "INSERT INTO fs_partial_origin (delta_ino, base_ino, base_path, base_size,
            base_fingerprint_size, base_mtime, base_mtime_nsec, base_ctime, base_ctime_nsec, created_at)
         VALUES (?1, ?2, ?3, ?4, ?4, ?5, ?6, ?7, ?8, 0)",
        rusqlite::params![
            ino,
            md.ino() as i64,
            s(base),
            md.len() as i64,
            md.mtime(),
            md.mtime_nsec(),
            md.ctime(),
            md.ctime_nsec()
        ],
    )
    .unwrap();
    c.execute_batch(&format!(
        "DELETE FROM fs_data WHERE ino = {ino} AND chunk_index != 1;
         UPDATE fs_data SET data = x'{}' WHERE ino = {ino} AND chunk_index = 1;
         INSERT INTO fs_chunk_override VALUES ({ino}, 1);",
        "EE".repeat(4096)
    ))
    .unwrap();
}

/// A populated database in `dir` whose file /a is layered over a new base file at `base`
/// (10,000 bytes of pattern 5).
fn populated_partial(dir: &Path, base: &Path) -> std::path::PathBuf {
    let db = populated(dir);
    let ino: i64 = query(&db, "SELECT ino FROM fs_dentry WHERE name = 'a'");
    fs::write(base, fixtures::pattern(10_000, 5)).unwrap();
    make_partial(&db, ino, base);
    db
}

#[test]
fn partial_origin_backup_materialize_and_base_checks() {
    let d = scratch();
    let base = d.path().join("base-a");
    let db = populated_partial(d.path(), &base);
    let base_bytes = fixtures::pattern(10_000, 5);
    assert_eq!(integrity_json(&db, &["--check-base"]).0, 0);
    let (code, found) = integrity_json(&db, &["--require-portable"]);
    assert_eq!(code, 1);
    assert!(found.iter().all(|(r, _)| r == "not_portable"), "{found:?}");

    let out = d.path().join("b.db");
    one_line_error(&agentfs(&["backup", s(&db), s(&out)]), "materialize");
    assert!(!out.exists());
    let m = d.path().join("m.db");
    ok(&agentfs(&[
        "materialize",
        s(&db),
        "--output",
        s(&m),
        "--verify",
    ]));
    let mut want = base_bytes.clone();
    want[4096..8192].fill(0xEE);
    assert_eq!(cat(&m, "/a"), want);
    assert_eq!(integrity_json(&m, &["--require-portable"]), (0, vec![]));
    ok(&agentfs(&[
        "backup",
        s(&db),
        s(&out),
        "--materialize",
        "--verify",
    ]));
    assert_eq!(cat(&out, "/a"), want);

    // A drifted base is detected and refused.
    fs::write(&base, fixtures::pattern(10_001, 5)).unwrap();
    base_refused(&db, &d.path().join("m2.db"), "changed");
}

/// `integrity --check-base` reports the partial-origin file of `db`, and materializing it
/// into `out` fails with one line containing `why` and leaves nothing.
fn base_refused(db: &Path, out: &Path, why: &str) {
    let (code, found) = integrity_json(db, &["--check-base"]);
    assert_eq!(code, 1, "the base was accepted: {found:?}");
    assert!(
        found.iter().all(|(r, _)| r == "base_fingerprint"),
        "{found:?}"
    );
    one_line_error(&agentfs(&["materialize", s(db), "--output", s(out)]), why);
    assert!(!out.exists());
}

/// A recorded base path is canonical: once one of its directories is a symlink (here to the
/// very same directory, moved), the base is not followed there but reported and refused.
#[test]
fn partial_origin_base_behind_a_symlinked_directory_is_refused() {
    let d = scratch();
    let dir = d.path().join("basedir");
    fs::create_dir(&dir).unwrap();
    let db = populated_partial(d.path(), &dir.join("base-a"));
    assert_eq!(integrity_json(&db, &["--check-base"]).0, 0);
    let moved = d.path().join("moved");
    fs::rename(&dir, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &dir).unwrap();
    base_refused(&db, &d.path().join("m.db"), "symbolic links");
}

#[test]
fn fsck_reports_then_repairs_idempotently() {
    let d = scratch();
    let db = populated(d.path());
    let a_before = cat(&db, "/a");
    Connection::open(&db)
        .unwrap()
        .execute_batch(
            "UPDATE fs_inode SET nlink = 3 WHERE ino = (SELECT ino FROM fs_dentry WHERE name = 'a');
             INSERT INTO fs_inode (mode, nlink, size, atime, mtime, ctime) VALUES (33188, 0, 3, 0, 0, 0);
             INSERT INTO fs_inode (mode, nlink, size, atime, mtime, ctime) VALUES (33188, 1, 0, 0, 0, 0);
             INSERT INTO fs_data VALUES (4242, 0, x'01');
             INSERT INTO fs_xattr VALUES (4242, 'user.x', x'01');
             INSERT INTO fs_symlink VALUES (4242, 'nowhere');
             INSERT INTO fs_origin VALUES (4242, 1);
             INSERT INTO fs_dentry (name, parent_ino, ino) VALUES ('ghost', 1, 4343);
             INSERT INTO fs_whiteout VALUES ('/x/y', '/', 0);",
        )
        .unwrap();
    let before = fs::read(&db).unwrap();
    let report = agentfs(&["fsck", s(&db), "--json"]);
    assert_eq!(report.status.code(), Some(1));
    assert_eq!(
        fs::read(&db).unwrap(),
        before,
        "fsck without --repair changed the file"
    );
    let v: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    let rules: Vec<&str> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rule"].as_str().unwrap())
        .collect();
    for r in [
        "nlink",
        "orphan",
        "data_inode",
        "xattr_inode",
        "symlink_row",
        "origin_inode",
        "dentry_inode",
        "whiteout_parent",
    ] {
        assert!(rules.contains(&r), "{r} not in {rules:?}");
    }
    let fixed = ok(&agentfs(&["fsck", s(&db), "--repair"]));
    assert!(fixed.contains("repaired"), "{fixed}");
    common::assert_consistent(&db);
    assert_eq!(cat(&db, "/a"), a_before);
    let again = ok(&agentfs(&["fsck", s(&db), "--repair", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(v["findings"].as_array().unwrap().len(), 0, "{again}");
    assert_eq!(v["repaired"].as_array().unwrap().len(), 0, "{again}");
}

#[test]
fn kv_and_tools_refuse_bad_input() {
    let d = scratch();
    let db = populated(d.path());
    one_line_error(
        &agentfs(&["kv", s(&db), "set", "k", "{oops"]),
        "not valid JSON",
    );
    one_line_error(&agentfs(&["kv", s(&db), "get", "missing"]), "no such key");
    one_line_error(
        &agentfs(&["kv", s(&db), "delete", "missing"]),
        "no such key",
    );
    one_line_error(
        &agentfs(&["tools", s(&db), "record", "t", "--result", "{x"]),
        "not valid JSON",
    );
    one_line_error(
        &agentfs(&[
            "tools",
            s(&db),
            "record",
            "t",
            "--parameters",
            "[",
            "--error",
            "e",
        ]),
        "not valid JSON",
    );
    one_line_error(
        &agentfs(&[
            "tools",
            s(&db),
            "record",
            "t",
            "--error",
            "e",
            "--started",
            "10",
            "--completed",
            "5",
        ]),
        "before",
    );
    assert!(!agentfs(&["tools", s(&db), "record", "t"]).status.success());
    // Upsert keeps created_at and refreshes updated_at.
    Connection::open(&db)
        .unwrap()
        .execute_batch("UPDATE kv_store SET created_at = 1, updated_at = 1 WHERE key = 'k'")
        .unwrap();
    ok(&agentfs(&["kv", s(&db), "set", "k", "\"v2\""]));
    let list: serde_json::Value =
        serde_json::from_str(&ok(&agentfs(&["kv", s(&db), "list", "--json"]))).unwrap();
    assert_eq!(list[0]["value"], "v2");
    assert_eq!(list[0]["created_at"], 1);
    assert!(list[0]["updated_at"].as_i64().unwrap() > 1);
    assert_eq!(integrity_json(&db, &[]), (0, vec![]));
}

#[test]
fn kv_tools_and_backup_against_a_live_mount_under_write_load() {
    if !fuse_or_skip("kv_tools_and_backup_against_a_live_mount_under_write_load") {
        return;
    }
    let m = Mounted::new();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let mnt = m.mnt.clone();
        std::thread::spawn(move || {
            let dir = mnt.join("load");
            fs::create_dir(&dir).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let data = fixtures::pattern(20_000 + (n as usize % 7) * 1000, n as u8);
                fs::write(dir.join(format!("f{}", n % 50)), &data).unwrap();
                n += 1;
            }
            n
        })
    };
    let db = m.db.clone();
    // Key/value and tool calls while the server writes.
    for i in 0..20 {
        ok(&agentfs(&[
            "kv",
            s(&db),
            "set",
            &format!("k{i}"),
            &format!("{{\"i\":{i}}}"),
        ]));
        ok(&agentfs(&[
            "tools",
            s(&db),
            "record",
            "write_file",
            "--parameters",
            &format!("{{\"n\":{i}}}"),
            "--result",
            "true",
            "--started",
            "100",
            "--completed",
            "101",
        ]));
    }
    ok(&agentfs(&[
        "tools",
        s(&db),
        "record",
        "shell",
        "--error",
        "exit 1",
    ]));
    assert_eq!(
        ok(&agentfs(&["kv", s(&db), "get", "k7"])).trim(),
        "{\"i\":7}"
    );
    let list: serde_json::Value =
        serde_json::from_str(&ok(&agentfs(&["kv", s(&db), "list", "--json"]))).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 20);
    let calls: serde_json::Value = serde_json::from_str(&ok(&agentfs(&[
        "tools",
        s(&db),
        "list",
        "--name",
        "write_file",
        "--json",
    ])))
    .unwrap();
    assert_eq!(calls.as_array().unwrap().len(), 20);
    assert_eq!(calls[0]["duration_ms"], 1000);
    let stats: serde_json::Value =
        serde_json::from_str(&ok(&agentfs(&["tools", s(&db), "stats", "--json"]))).unwrap();
    assert_eq!(stats[0]["name"], "write_file");
    assert_eq!(stats[0]["total_calls"], 20);
    assert_eq!(stats[1]["failed"], 1);
    ok(&agentfs(&["kv", s(&db), "delete", "k0"]));

    // Files made durable by a barrier before the backup must be in it.
    let mut expected = Vec::new();
    for i in 0..5 {
        let p = m.mnt.join(format!("before-{i}"));
        let data = fixtures::pattern(70_000 + i * 100, 40 + i as u8);
        let mut f = fs::File::create(&p).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        expected.push((format!("/before-{i}"), data));
    }
    let out = m.dir.path().join("backup.db");
    let b = ok(&agentfs(&["backup", s(&db), s(&out), "--verify"]));
    assert!(b.contains("verified"), "{b}");
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(written > 0);
    // The backup is a single main file: no -wal next to it.
    let mut wal = out.as_os_str().to_os_string();
    wal.push("-wal");
    assert!(!PathBuf::from(wal).exists());
    let moved = m.dir.path().join("alone");
    fs::create_dir(&moved).unwrap();
    let copy = moved.join("copy.db");
    fs::copy(&out, &copy).unwrap();
    let (code, found) = integrity_json(&copy, &[]);
    assert!(
        code == 0 || found.iter().all(|(r, _)| r == "orphan"),
        "{found:?}"
    );
    for (path, data) in &expected {
        assert_eq!(&cat(&copy, path), data, "{path}");
    }
    assert_eq!(
        ok(&agentfs(&["kv", s(&copy), "get", "k19"])).trim(),
        "{\"i\":19}"
    );
    drop(m);
}
