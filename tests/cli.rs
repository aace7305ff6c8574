//! The command line's answers to bad input: one line, a non-zero exit, no file changed.

mod common;

use std::fs;
use std::path::Path;

use common::{agentfs, fuse_or_skip, scratch_root, Mounted};

fn digest(p: &Path) -> Vec<u8> {
    fs::read(p).unwrap_or_default()
}

fn one_line_error(out: &std::process::Output, needle: &str) {
    assert!(!out.status.success(), "expected failure");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    assert!(err.contains(needle), "{err:?} should mention {needle:?}");
}

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(scratch_root()).unwrap()
}

#[test]
fn init_refuses_existing_file_and_bad_layout() {
    let d = scratch();
    let db = d.path().join("x.sqlite");
    assert!(agentfs(&["init", db.to_str().unwrap()]).status.success());
    let before = digest(&db);
    one_line_error(&agentfs(&["init", db.to_str().unwrap()]), "exists");
    assert_eq!(digest(&db), before);
    let db2 = d.path().join("y.sqlite");
    let out = agentfs(&["init", db2.to_str().unwrap(), "--chunk-size", "1000"]);
    assert!(!out.status.success());
    assert!(!db2.exists(), "no file left behind");
}

#[test]
fn not_a_sqlite_file_is_refused_unchanged() {
    let d = scratch();
    let db = d.path().join("junk.sqlite");
    fs::write(
        &db,
        b"this is not a database, just some text that is long enough",
    )
    .unwrap();
    let before = digest(&db);
    one_line_error(&agentfs(&["fs", db.to_str().unwrap(), "ls", "/"]), "not");
    one_line_error(&agentfs(&["integrity", db.to_str().unwrap()]), "not");
    let mnt = d.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    one_line_error(
        &agentfs(&["mount", db.to_str().unwrap(), mnt.to_str().unwrap()]),
        "not",
    );
    assert_eq!(digest(&db), before);
}

#[test]
fn old_and_unknown_schema_versions_name_migrate() {
    let d = scratch();
    let db = d.path().join("old.sqlite");
    assert!(agentfs(&["init", db.to_str().unwrap()]).status.success());
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch("PRAGMA user_version = 2").unwrap();
    }
    let before = digest(&db);
    one_line_error(
        &agentfs(&["fs", db.to_str().unwrap(), "ls", "/"]),
        "agentfs migrate",
    );
    assert_eq!(digest(&db), before);
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch("PRAGMA user_version = 999").unwrap();
    }
    let out = agentfs(&["fs", db.to_str().unwrap(), "ls", "/"]);
    one_line_error(&out, "unknown schema");
}

#[test]
fn mount_point_errors() {
    let d = scratch();
    let db = d.path().join("db.sqlite");
    let missing = d.path().join("nope");
    one_line_error(
        &agentfs(&["mount", db.to_str().unwrap(), missing.to_str().unwrap()]),
        "does not exist",
    );
    let file = d.path().join("file");
    fs::write(&file, b"").unwrap();
    one_line_error(
        &agentfs(&["mount", db.to_str().unwrap(), file.to_str().unwrap()]),
        "not a directory",
    );
    assert!(!db.exists(), "a refused mount creates no database");
}

#[test]
fn a_mount_point_that_is_a_mount_and_a_db_mounted_twice_are_refused() {
    if !fuse_or_skip("a_mount_point_that_is_a_mount_and_a_db_mounted_twice_are_refused") {
        return;
    }
    let m = Mounted::new();
    let other_db = m.dir.path().join("other.sqlite");
    one_line_error(
        &agentfs(&["mount", other_db.to_str().unwrap(), m.mnt.to_str().unwrap()]),
        "already a mount point",
    );
    let mnt2 = m.dir.path().join("mnt2");
    fs::create_dir(&mnt2).unwrap();
    let out = agentfs(&["mount", m.db.to_str().unwrap(), mnt2.to_str().unwrap()]);
    one_line_error(&out, &format!("pid {}", m.server_pid()));
    assert!(!common::is_mounted(&mnt2));
}

#[test]
fn background_mount_creates_the_db_and_umount_waits_for_the_server() {
    if !fuse_or_skip("background_mount_creates_the_db_and_umount_waits_for_the_server") {
        return;
    }
    let d = scratch();
    let db = d.path().join("new.sqlite");
    let mnt = d.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let out = agentfs(&["mount", db.to_str().unwrap(), mnt.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(common::is_mounted(&mnt), "live when mount returns");
    fs::write(mnt.join("hello"), b"world").unwrap();
    let out = agentfs(&["umount", mnt.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!common::is_mounted(&mnt));
    assert!(agentfs::sys::lock::holder_pid(&db).is_none(), "server gone");
    let out = agentfs(&["fs", db.to_str().unwrap(), "cat", "/hello"]);
    assert_eq!(out.stdout, b"world");
    common::assert_consistent(&db);
    // A second umount is an error; --force on a clean mount point is a no-op.
    assert!(!agentfs(&["umount", mnt.to_str().unwrap()]).status.success());
    assert!(agentfs(&["umount", "--force", mnt.to_str().unwrap()])
        .status
        .success());
}

#[test]
fn offline_fs_commands_round_trip() {
    let d = scratch();
    let db = d.path().join("db.sqlite");
    let dbs = db.to_str().unwrap();
    assert!(agentfs(&["init", dbs]).status.success());
    assert!(agentfs(&["fs", dbs, "mkdir", "/dir"]).status.success());
    let mut child = std::process::Command::new(common::bin())
        .args(["fs", dbs, "write", "/dir/f"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"payload").unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(agentfs(&["fs", dbs, "cat", "/dir/f"]).stdout, b"payload");
    assert_eq!(agentfs(&["fs", dbs, "ls", "/dir"]).stdout, b"f\n");
    let stat = String::from_utf8(agentfs(&["fs", dbs, "stat", "/dir/f"]).stdout).unwrap();
    assert!(stat.contains("size: 7"), "{stat}");
    one_line_error(&agentfs(&["fs", dbs, "rm", "/dir"]), "not empty");
    assert!(agentfs(&["fs", dbs, "rm", "/dir/f"]).status.success());
    assert!(agentfs(&["fs", dbs, "rm", "/dir"]).status.success());
    one_line_error(&agentfs(&["fs", dbs, "cat", "/dir/f"]), "No such file");
    common::assert_consistent(&db);
}

#[test]
fn invalid_knob_values_stop_with_one_line() {
    let out = std::process::Command::new(common::bin())
        .args(["status"])
        .env("AGENTFS_FUSE_THREADS", "0")
        .output()
        .unwrap();
    one_line_error(&out, "AGENTFS_FUSE_THREADS");
}
