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

/// Run `agentfs ARGS`, giving up (and failing) after `limit`.
fn agentfs_within(args: &[&str], limit: std::time::Duration) -> std::process::Output {
    let mut child = std::process::Command::new(common::bin())
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    if common::wait_timeout(&mut child, limit).is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("agentfs {args:?} did not return within {limit:?}");
    }
    child.wait_with_output().unwrap()
}

/// Stop the server of `m` (SIGSTOP) with a caller stuck waiting for it inside the mount, as a
/// hung server leaves things. Returns the caller's thread (its lookup's errno once it ends).
fn stop_with_a_stuck_caller(m: &Mounted) -> std::thread::JoinHandle<Option<i32>> {
    // SAFETY: signals a child process this test started.
    assert_eq!(
        unsafe { libc::kill(m.server_pid() as i32, libc::SIGSTOP) },
        0
    );
    let mnt = m.mnt.clone();
    let stuck = std::thread::spawn(move || {
        fs::metadata(mnt.join("no-such-name"))
            .err()
            .and_then(|e| e.raw_os_error())
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    stuck
}

fn resume(pid: u32) {
    // SAFETY: signals a child process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
}

/// `umount --force` aborts the connection of a stopped server and detaches the mount without
/// waiting for it, says what it did, and exits non-zero because the server has not finished;
/// continued, the server commits what it acknowledged and exits cleanly.
#[test]
fn umount_force_detaches_a_stopped_server_and_says_so() {
    if !fuse_or_skip("umount_force_detaches_a_stopped_server_and_says_so") {
        return;
    }
    let mut m = Mounted::new();
    let mut f = fs::File::create(m.path("kept")).unwrap();
    std::io::Write::write_all(&mut f, b"synced before the stop").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let pid = m.server_pid();
    let stuck = stop_with_a_stuck_caller(&m);
    let started = std::time::Instant::now();
    let out = agentfs_within(
        &["umount", "--force", m.mnt.to_str().unwrap()],
        std::time::Duration::from_secs(30),
    );
    let took = started.elapsed();
    resume(pid);
    eprintln!("umount --force of a stopped server took {took:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!common::is_mounted(&m.mnt), "the mount is gone");
    assert!(
        stdout.contains("aborted FUSE connection") && stdout.contains("detached"),
        "reports what it did: {stdout}"
    );
    one_line_error(&out, &format!("server pid {pid} is stopped"));
    assert!(
        stuck.join().unwrap().is_some(),
        "the stuck caller got an error"
    );
    assert!(
        m.wait_exit().success(),
        "the continued server exits cleanly"
    );
    m.mount();
    assert_eq!(fs::read(m.path("kept")).unwrap(), b"synced before the stop");
    m.unmount();
}

/// A plain `umount` of a mount whose server is stopped says the server is not answering and
/// points to --force, instead of blaming open files; the mount stays.
#[test]
fn plain_umount_of_a_stopped_server_says_it_is_not_answering() {
    if !fuse_or_skip("plain_umount_of_a_stopped_server_says_it_is_not_answering") {
        return;
    }
    let mut m = Mounted::new();
    let pid = m.server_pid();
    let stuck = stop_with_a_stuck_caller(&m);
    let out = agentfs_within(
        &["umount", m.mnt.to_str().unwrap()],
        std::time::Duration::from_secs(30),
    );
    resume(pid);
    one_line_error(&out, "not answering");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("pid {pid}")) && err.contains("--force"),
        "{err}"
    );
    assert!(common::is_mounted(&m.mnt), "still mounted");
    assert_eq!(
        stuck.join().unwrap(),
        Some(libc::ENOENT),
        "answered once continued"
    );
    m.unmount();
}
