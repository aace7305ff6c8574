//! The command line's answers to bad input: one line, a non-zero exit, no file changed.

mod common;

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{agentfs, fuse_or_skip, mount_options, scratch_root, Mounted, UnmountOnDrop};

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
    let _cleanup = UnmountOnDrop(mnt.clone());
    assert!(common::is_mounted(&mnt), "live when mount returns");
    // One line: where, which server, how to stop it.
    let said = String::from_utf8_lossy(&out.stdout);
    let canon = fs::canonicalize(&mnt).unwrap();
    let pid = agentfs::sys::lock::holder_pid(&db).expect("server holds the database");
    assert_eq!(said.lines().count(), 1, "{said:?}");
    assert!(
        said.contains(&format!("mounted at {}", canon.display()))
            && said.contains(&format!("pid {pid}"))
            && said.contains(&format!("agentfs umount {}", canon.display())),
        "{said:?}"
    );
    fs::write(mnt.join("hello"), b"world").unwrap();
    let out = agentfs(&["umount", mnt.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!common::is_mounted(&mnt));
    assert!(agentfs::sys::lock::holder_pid(&db).is_none(), "server gone");
    // One portable file: the server's last connection folded the WAL in and removed it.
    for sidecar in ["-wal", "-shm"] {
        let mut p = db.clone().into_os_string();
        p.push(sidecar);
        assert!(!Path::new(&p).exists(), "{p:?} left after a clean unmount");
    }
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
    fs_write(&db, "/dir/f", b"payload");
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
    // The server's status record (how umount finds its pid) is written just after the mount
    // appears: stop the server only once it is there.
    let pid = m.server_pid();
    wait_until("the server's status record is written", || {
        agentfs::sys::registry::live().iter().any(|r| r.pid == pid)
    });
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

/// `agentfs fs DB write PATH` with `bytes` on standard input.
fn fs_write(db: &Path, path: &str, bytes: &[u8]) {
    let mut child = Command::new(common::bin())
        .args(["fs", db.to_str().unwrap(), "write", path])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    assert!(child.wait().unwrap().success(), "fs write {path}");
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A database whose middle page is overwritten with junk; /keep, written first and small,
/// lies in an early page and stays readable.
fn damaged_db(db: &Path) {
    assert!(agentfs(&["init", db.to_str().unwrap()]).status.success());
    fs_write(db, "/keep", b"rescue me");
    fs_write(db, "/big", &vec![7u8; 4 << 20]);
    let c = rusqlite::Connection::open(db).unwrap();
    c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(c);
    let len = fs::metadata(db).unwrap().len();
    let mut f = fs::OpenOptions::new().write(true).open(db).unwrap();
    f.seek(SeekFrom::Start(len / 2 / 4096 * 4096)).unwrap();
    f.write_all(&[0xa5; 4096]).unwrap();
    f.sync_all().unwrap();
    let c = rusqlite::Connection::open(db).unwrap();
    let qc: String = c
        .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
        .unwrap();
    assert_ne!(qc, "ok", "SQLite sees the damage");
}

#[test]
fn mount_refuses_a_damaged_database_and_ro_rescues_its_files() {
    if !fuse_or_skip("mount_refuses_a_damaged_database_and_ro_rescues_its_files") {
        return;
    }
    let mut m = Mounted::unmounted();
    damaged_db(&m.db);
    let out = agentfs(&["mount", m.db.to_str().unwrap(), m.mnt.to_str().unwrap()]);
    one_line_error(&out, "db_corrupt");
    one_line_error(&out, "agentfs fsck");
    assert!(
        !common::is_mounted(&m.mnt),
        "a refused mount leaves nothing"
    );
    m.mount_with(&["-o", "ro"]);
    assert!(
        mount_options(&m.mnt).is_some_and(|o| o.split(',').any(|x| x == "ro")),
        "{:?}",
        mount_options(&m.mnt)
    );
    assert_eq!(fs::read(m.path("keep")).unwrap(), b"rescue me");
    m.unmount();
}

#[test]
fn offline_errors_are_one_plain_line() {
    let d = scratch();
    let db = d.path().join("damaged.sqlite");
    assert!(agentfs(&["init", db.to_str().unwrap()]).status.success());
    fs_write(&db, "/f", b"x");
    // Junk over the root page of fs_dentry: every path lookup fails.
    let c = rusqlite::Connection::open(&db).unwrap();
    let (root, size): (i64, i64) = c
        .query_row(
            "SELECT rootpage, (SELECT page_size FROM pragma_page_size)
             FROM sqlite_master WHERE name = 'fs_dentry'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    drop(c);
    let mut f = fs::OpenOptions::new().write(true).open(&db).unwrap();
    f.seek(SeekFrom::Start(((root - 1) * size) as u64)).unwrap();
    f.write_all(&vec![0xa5; size as usize]).unwrap();
    drop(f);
    let out = Command::new(common::bin())
        .args(["fs", db.to_str().unwrap(), "cat", "/f"])
        .env_remove("AGENTFS_LOG")
        .output()
        .unwrap();
    one_line_error(&out, "/f");
    assert!(
        !out.stderr.contains(&0x1b),
        "no colour codes in {:?}",
        out.stderr
    );
}

/// Removes the immutable attribute however the test ends (so the scratch dir can go).
struct Thaw(PathBuf);

impl Drop for Thaw {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

#[test]
fn an_immutable_database_mounts_read_only_and_says_so() {
    if !fuse_or_skip("an_immutable_database_mounts_read_only_and_says_so") {
        return;
    }
    let m = Mounted::unmounted();
    let (db, mnt) = (m.db.to_str().unwrap(), m.mnt.to_str().unwrap());
    assert!(agentfs(&["init", db]).status.success());
    fs_write(&m.db, "/f", b"frozen");
    let _thaw = Thaw(m.db.clone());
    match Command::new("chattr").arg("+i").arg(&m.db).output() {
        Ok(o) if o.status.success() => {}
        _ => {
            eprintln!("SKIP: chattr +i does not work on this filesystem");
            return;
        }
    }
    let out = agentfs(&["mount", db, mnt]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _cleanup = UnmountOnDrop(m.mnt.clone());
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(note.contains("read-only"), "says so: {note:?}");
    let opts = mount_options(&m.mnt).unwrap_or_default();
    assert!(opts.split(',').any(|o| o == "ro"), "{opts}");
    assert_eq!(fs::read(m.path("f")).unwrap(), b"frozen");
    let err = fs::write(m.path("g"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    assert!(agentfs(&["umount", mnt]).status.success());
}

#[test]
fn a_mount_point_with_entries_needs_nonempty() {
    if !fuse_or_skip("a_mount_point_with_entries_needs_nonempty") {
        return;
    }
    let help = String::from_utf8_lossy(&agentfs(&["mount", "--help"]).stdout).into_owned();
    assert!(
        help.contains("empty") && help.contains("nonempty"),
        "{help}"
    );
    let mut m = Mounted::unmounted();
    fs::write(m.path("hidden"), b"under the mount").unwrap();
    let out = agentfs(&["mount", m.db.to_str().unwrap(), m.mnt.to_str().unwrap()]);
    one_line_error(&out, "not empty");
    assert!(!common::is_mounted(&m.mnt));
    assert!(!m.db.exists(), "a refused mount creates no database");
    m.mount_with(&["-o", "nonempty"]);
    assert!(!m.path("hidden").exists(), "the mount covers the directory");
    m.unmount();
    assert_eq!(fs::read(m.path("hidden")).unwrap(), b"under the mount");
}

#[test]
fn offline_rm_while_mounted_keeps_an_open_file_until_its_close() {
    if !fuse_or_skip("offline_rm_while_mounted_keeps_an_open_file_until_its_close") {
        return;
    }
    let mut m = Mounted::new();
    {
        let mut f = fs::File::create(m.path("held")).unwrap();
        f.write_all(b"still readable").unwrap();
        f.sync_all().unwrap();
    }
    let f = fs::File::open(m.path("held")).unwrap();
    let out = agentfs(&["fs", m.db.to_str().unwrap(), "rm", "/held"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until("the name is gone from the mount", || {
        !m.path("held").exists()
    });
    let mut buf = [0u8; 64];
    let n = f.read_at(&mut buf, 0).unwrap();
    assert_eq!(
        &buf[..n],
        b"still readable",
        "the open file keeps its bytes"
    );
    assert_eq!(common::orphans(&m.db), 1, "kept as an orphan while open");
    drop(f);
    wait_until("the server reaps the orphan", || {
        common::orphans(&m.db) == 0
    });
    m.unmount();
    common::assert_consistent(&m.db);
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let d = scratch();
    let db = d.path().join("db.sqlite");
    let dbs = db.to_str().unwrap();
    assert!(agentfs(&["init", dbs]).status.success());
    fs_write(&db, "/big", &vec![1u8; 4 << 20]);
    assert!(agentfs(&["kv", dbs, "set", "k", "1"]).status.success());
    let verbs: [&[&str]; 7] = [
        &["fs", dbs, "stat", "/big"],
        &["fs", dbs, "ls", "/"],
        &["fs", dbs, "cat", "/big"],
        &["kv", dbs, "list"],
        &["integrity", dbs],
        &["knobs"],
        &["status"],
    ];
    for args in verbs {
        let mut child = Command::new(common::bin())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
            "{args:?}: {:?} {err}",
            out.status
        );
        assert!(err.is_empty(), "{args:?}: {err}");
    }
}
