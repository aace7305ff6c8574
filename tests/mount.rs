//! Mount tests: a real kernel mount driven through std::fs and libc.

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::{assert_consistent, fuse_or_skip, Mounted};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn files_survive_unmount_and_remount() {
    if !fuse_or_skip("files_survive_unmount_and_remount") {
        return;
    }
    let mut m = Mounted::new();
    let sizes = [0usize, 1, 4095, 4096, 4097, 65535, 65536, 65537, 300_000];
    fs::create_dir_all(m.path("a/b/c")).unwrap();
    for (i, &n) in sizes.iter().enumerate() {
        fs::write(m.path(&format!("a/b/f{n}")), pattern(n, i as u8)).unwrap();
    }
    std::os::unix::fs::symlink("b/f4096", m.path("a/link")).unwrap();
    fs::hard_link(m.path("a/b/f1"), m.path("a/c-hard")).unwrap();
    fs::set_permissions(m.path("a/b/f1"), fs::Permissions::from_mode(0o600)).unwrap();
    m.unmount();
    assert_consistent(&m.db);
    m.mount();
    for (i, &n) in sizes.iter().enumerate() {
        let got = fs::read(m.path(&format!("a/b/f{n}"))).unwrap();
        assert_eq!(got.len(), n, "size of f{n}");
        assert!(got == pattern(n, i as u8), "content of f{n}");
    }
    assert_eq!(
        fs::read_link(m.path("a/link")).unwrap().to_str(),
        Some("b/f4096")
    );
    assert_eq!(fs::read(m.path("a/link")).unwrap().len(), 4096);
    let meta = fs::metadata(m.path("a/c-hard")).unwrap();
    assert_eq!(meta.nlink(), 2);
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert_eq!(meta.ino(), fs::metadata(m.path("a/b/f1")).unwrap().ino());
    m.unmount();
    assert_consistent(&m.db);
}

#[test]
fn unlinked_open_file_lives_until_closed() {
    if !fuse_or_skip("unlinked_open_file_lives_until_closed") {
        return;
    }
    let mut m = Mounted::new();
    let p = m.path("victim");
    let mut f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    f.write_all(&pattern(100_000, 3)).unwrap();
    fs::remove_file(&p).unwrap();
    assert!(!p.exists());
    f.write_all(b"tail").unwrap();
    f.sync_all().unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back.len(), 100_004);
    assert_eq!(&back[..100_000], &pattern(100_000, 3)[..]);
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    drop(f);
    m.unmount();
    // After the last reference went, nothing of the inode is left in the database.
    let conn = rusqlite::Connection::open(&m.db).unwrap();
    let inodes: i64 = conn
        .query_row("SELECT count(*) FROM fs_inode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(inodes, 1, "only the root inode remains");
    let chunks: i64 = conn
        .query_row("SELECT count(*) FROM fs_data", [], |r| r.get(0))
        .unwrap();
    assert_eq!(chunks, 0);
    drop(conn);
    assert_consistent(&m.db);
}

#[test]
fn rename_flags_reach_the_filesystem() {
    if !fuse_or_skip("rename_flags_reach_the_filesystem") {
        return;
    }
    let m = Mounted::new();
    fs::write(m.path("x"), b"x").unwrap();
    fs::create_dir(m.path("d")).unwrap();
    let c = |p: &std::path::Path| std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    let renameat2 = |a: &std::path::Path, b: &std::path::Path, flags: u32| -> i32 {
        let (a, b) = (c(a), c(b));
        // SAFETY: valid C strings; AT_FDCWD.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                flags,
            )
        };
        if rc == 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap()
        }
    };
    assert_eq!(
        renameat2(&m.path("x"), &m.path("d"), libc::RENAME_NOREPLACE),
        libc::EEXIST
    );
    assert_eq!(
        renameat2(&m.path("x"), &m.path("d"), libc::RENAME_EXCHANGE),
        0
    );
    assert!(m.path("x").is_dir());
    assert_eq!(fs::read(m.path("d")).unwrap(), b"x");
    assert_eq!(
        renameat2(&m.path("x"), &m.path("nope"), libc::RENAME_EXCHANGE),
        libc::ENOENT
    );
    assert_eq!(
        renameat2(
            &m.path("x"),
            &m.path("d"),
            libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE
        ),
        libc::EINVAL
    );
    assert_eq!(
        renameat2(&m.path("d"), &m.path("e"), libc::RENAME_NOREPLACE),
        0
    );
    assert_eq!(fs::read(m.path("e")).unwrap(), b"x");
}

#[test]
fn names_longer_than_255_bytes_are_refused() {
    if !fuse_or_skip("names_longer_than_255_bytes_are_refused") {
        return;
    }
    let m = Mounted::new();
    let ok = "a".repeat(255);
    let long = "a".repeat(256);
    fs::write(m.path(&ok), b"1").unwrap();
    let err = fs::write(m.path(&long), b"1").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENAMETOOLONG));
    let err = fs::metadata(m.path(&long)).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENAMETOOLONG));
}

#[test]
fn source_and_type_in_the_mount_table() {
    if !fuse_or_skip("source_and_type_in_the_mount_table") {
        return;
    }
    let m = Mounted::new();
    let canon = fs::canonicalize(&m.mnt).unwrap();
    let entry = agentfs::sys::mounts::find(&canon).expect("mounted");
    assert_eq!(entry.source, "agentfs");
    assert_eq!(entry.fstype, "fuse.agentfs");
    let status = common::agentfs(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains(&m.server_pid().to_string()),
        "status lists the server: {text}"
    );
    assert!(
        text.contains(canon.to_str().unwrap()),
        "status lists the mount: {text}"
    );
}

#[test]
fn sigterm_unmounts_cleanly_and_checkpoints() {
    if !fuse_or_skip("sigterm_unmounts_cleanly_and_checkpoints") {
        return;
    }
    let mut m = Mounted::new();
    fs::write(m.path("kept"), pattern(70_000, 9)).unwrap();
    let pid = m.server_pid() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = m.wait_exit();
    assert!(status.success(), "server exit after SIGTERM: {status}");
    assert!(!common::is_mounted(&m.mnt), "SIGTERM unmounted");
    for sidecar in ["sqlite-wal", "sqlite-shm"] {
        let p = m.db.with_extension(sidecar);
        assert!(!p.exists(), "{} left after a clean unmount", p.display());
    }
    assert_consistent(&m.db);
    m.mount();
    assert_eq!(fs::read(m.path("kept")).unwrap(), pattern(70_000, 9));
}

/// Committed state as another process reading the database file sees it: whether the
/// directory entry `name` exists.
fn committed_entry(db: &std::path::Path, name: &str) -> bool {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    c.query_row(
        "SELECT count(*) FROM fs_dentry WHERE CAST(name AS BLOB) = CAST(?1 AS BLOB)",
        [name],
        |r| r.get::<_, i64>(0),
    )
    .unwrap()
        > 0
}

fn run(cmd: &str, args: &[&std::path::Path]) -> std::process::Output {
    std::process::Command::new(cmd).args(args).output().unwrap()
}

#[test]
fn operations_in_an_open_batch_are_visible_at_once_and_a_crash_loses_only_them() {
    if !fuse_or_skip("operations_in_an_open_batch_are_visible_at_once_and_a_crash_loses_only_them")
    {
        return;
    }
    // A window that never ends during the test, and no kernel caching of names or
    // attributes, so every stat, listing and open from another process asks the server.
    let mut m = Mounted::with_env(&[
        ("AGENTFS_BATCH_NAMESPACE", "1"),
        ("AGENTFS_BATCH_WINDOW_MS", "600000"),
        ("AGENTFS_BATCH_NAMESPACE_GAP_MS", "0"),
        ("AGENTFS_FUSE_ENTRY_TTL_MS", "0"),
        ("AGENTFS_FUSE_ATTR_TTL_MS", "0"),
    ]);
    fs::create_dir(m.path("d")).unwrap();
    let mut kept = fs::File::create(m.path("d/kept")).unwrap();
    kept.write_all(b"durable").unwrap();
    kept.sync_all().unwrap();
    drop(kept);
    assert!(committed_entry(&m.db, "kept"), "fsync commits the batch");

    fs::write(m.path("d/new"), b"fresh").unwrap();
    fs::rename(m.path("d/new"), m.path("d/renamed")).unwrap();
    fs::create_dir(m.path("d/sub")).unwrap();
    std::os::unix::fs::symlink("renamed", m.path("d/link")).unwrap();
    fs::write(m.path("d/gone"), b"x").unwrap();
    fs::remove_file(m.path("d/gone")).unwrap();
    // Not committed yet: a reader of the database file does not see them...
    for name in ["renamed", "sub", "link"] {
        assert!(!committed_entry(&m.db, name), "{name} committed early");
    }
    // ...but every process using the mount does, at once.
    let d = m.path("d");
    let ls = run("ls", &[&d]);
    assert!(ls.status.success());
    let names = String::from_utf8_lossy(&ls.stdout).to_string();
    let mut listed: Vec<&str> = names.lines().collect();
    listed.sort_unstable();
    assert_eq!(listed, ["kept", "link", "renamed", "sub"]);
    assert!(run("stat", &[&m.path("d/renamed")]).status.success());
    assert!(!run("stat", &[&m.path("d/new")]).status.success());
    assert!(!run("stat", &[&m.path("d/gone")]).status.success());
    assert_eq!(run("cat", &[&m.path("d/link")]).stdout, b"fresh");
    assert_eq!(run("readlink", &[&m.path("d/link")]).stdout, b"renamed\n");
    assert!(run("test", &[std::path::Path::new("-d"), &m.path("d/sub")])
        .status
        .success());
    // A failed operation inside the batch leaves nothing behind and the batch goes on.
    assert!(fs::create_dir(m.path("d/sub")).is_err());
    assert!(run("stat", &[&m.path("d/renamed")]).status.success());

    // A crash loses the open window, never what a barrier covered.
    m.crash();
    assert_consistent(&m.db);
    m.mount();
    assert_eq!(fs::read(m.path("d/kept")).unwrap(), b"durable");
    for name in ["renamed", "sub", "link", "new"] {
        assert!(!m.path(&format!("d/{name}")).exists(), "{name} survived");
    }
    m.unmount();
    assert_consistent(&m.db);
}

/// `mv` from another filesystem sets modes by writing an access ACL; a plain ACL must become
/// the mode (it did stay 0700 before), and an ACL with named entries is kept.
#[test]
fn access_acls_set_the_mode() {
    if !fuse_or_skip("access_acls_set_the_mode") {
        return;
    }
    let m = Mounted::new();
    let outside = tempfile::tempdir().unwrap();
    let src = outside.path().join("tree");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("sub/f"), b"x").unwrap();
    fs::set_permissions(src.join("sub"), fs::Permissions::from_mode(0o751)).unwrap();
    fs::set_permissions(src.join("sub/f"), fs::Permissions::from_mode(0o640)).unwrap();
    let st = std::process::Command::new("mv")
        .arg(&src)
        .arg(m.path("moved"))
        .status()
        .unwrap();
    assert!(st.success());
    let mode = |p: &str| fs::symlink_metadata(m.path(p)).unwrap().mode() & 0o7777;
    assert_eq!(mode("moved/sub"), 0o751);
    assert_eq!(mode("moved/sub/f"), 0o640);
    // user::rw- user:1000:r-- group::r-- mask::r-- other::--- (version 2, 8-byte entries).
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 6u16, u32::MAX),
        (2, 4, 1000),
        (4, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&id.to_le_bytes());
    }
    let path = std::ffi::CString::new(m.path("moved/sub/f").into_os_string().into_encoded_bytes())
        .unwrap();
    // SAFETY: valid C strings and buffer for the duration of the call.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            acl.as_ptr().cast(),
            acl.len(),
            0,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(mode("moved/sub/f"), 0o640);
    let mut buf = [0u8; 256];
    // SAFETY: as above.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert_eq!(n as usize, acl.len(), "an extended ACL is kept");
}

/// 2,000 write(2)s of 4 KiB into one file, then fsync.
fn small_writes(path: &std::path::Path) {
    let mut f = fs::File::create(path).unwrap();
    let block = [7u8; 4096];
    for _ in 0..2000 {
        f.write_all(&block).unwrap();
    }
    f.sync_all().unwrap();
}

/// With FUSE_HANDLE_KILLPRIV_V2 the server clears set-id bits itself, so the kernel stops
/// asking for security.capability before each write(2): with the writeback cache on
/// 2,000 small writes cost a handful of requests (a GETXATTR again after each attribute
/// refresh, every second at most), against one per call when the kill switch hands the job
/// back to the kernel.
#[test]
fn small_writes_cost_no_request_each() {
    if !fuse_or_skip("small_writes_cost_no_request_each") {
        return;
    }
    for (killpriv, bound) in [("1", 0..200u64), ("0", 2000..u64::MAX)] {
        let mut m = Mounted::with_env(&[
            ("AGENTFS_FUSE_KILLPRIV_V2", killpriv),
            ("AGENTFS_FUSE_WRITEBACK_CACHE", "1"),
        ]);
        let pid = m.server_pid();
        let before = common::served(pid);
        small_writes(&m.path("f"));
        let spent = common::served(pid) - before;
        assert!(
            bound.contains(&spent),
            "AGENTFS_FUSE_KILLPRIV_V2={killpriv}: 2,000 writes cost {spent} requests"
        );
        assert_eq!(fs::metadata(m.path("f")).unwrap().len(), 2000 * 4096);
        m.unmount();
    }
}

/// Under the kernel's writeback cache every close(2) marks the file's st_blocks stale, so the
/// first stat after it is a GETATTR whatever the attribute timeout; write-through (the
/// default) keeps the attributes the CREATE reply gave. 200 empty files created, closed and
/// then stat'ed: no request per file by default, one per file with the cache on. (A file
/// written through is asked for again either way: each WRITE makes its size and times stale.)
#[test]
fn stat_after_create_costs_no_request_per_file_by_default() {
    if !fuse_or_skip("stat_after_create_costs_no_request_per_file_by_default") {
        return;
    }
    for (cache, bound) in [("0", 0..20u64), ("1", 200..u64::MAX)] {
        let mut m = Mounted::with_env(&[("AGENTFS_FUSE_WRITEBACK_CACHE", cache)]);
        let dir = m.path("d");
        fs::create_dir(&dir).unwrap();
        for i in 0..200 {
            fs::File::create(dir.join(format!("f{i}"))).unwrap();
        }
        let pid = m.server_pid();
        let before = common::served(pid);
        for i in 0..200 {
            assert_eq!(fs::metadata(dir.join(format!("f{i}"))).unwrap().len(), 0);
        }
        let spent = common::served(pid) - before;
        assert!(
            bound.contains(&spent),
            "AGENTFS_FUSE_WRITEBACK_CACHE={cache}: 200 stats after create cost {spent} requests"
        );
        m.unmount();
    }
}

/// Directories open without OPENDIR by default, so the kernel serves ten listings of an
/// unchanged directory from its own cache; with `AGENTFS_FUSE_NOOPENDIR=0` they are ten rounds
/// of requests. After a change, the next listing is the server's again.
#[test]
fn the_kernel_caches_listings_of_unchanged_directories() {
    if !fuse_or_skip("the_kernel_caches_listings_of_unchanged_directories") {
        return;
    }
    for (knob, bound) in [("1", 0..10), ("0", 20..u64::MAX)] {
        let mut m = Mounted::with_env(&[("AGENTFS_FUSE_NOOPENDIR", knob)]);
        let dir = m.path("d");
        fs::create_dir(&dir).unwrap();
        for i in 0..10 {
            fs::write(dir.join(format!("f{i}")), b"x").unwrap();
        }
        let list = || fs::read_dir(&dir).unwrap().count();
        assert_eq!(list(), 10);
        let pid = m.server_pid();
        let before = common::served(pid);
        for _ in 0..10 {
            assert_eq!(list(), 10);
        }
        let spent = common::served(pid) - before;
        assert!(
            bound.contains(&spent),
            "AGENTFS_FUSE_NOOPENDIR={knob}: ten listings cost {spent} requests"
        );
        fs::remove_file(dir.join("f3")).unwrap();
        assert_eq!(list(), 9, "the listing after a change");
        m.unmount();
    }
}

/// The mount's readahead is raised to `AGENTFS_FUSE_READAHEAD_KIB` (1 MiB by default), so a
/// cold sequential read of 16 MiB takes about 16 READs; the kernel's own 128 KiB (the knob at
/// 0) takes about 128.
#[test]
fn sequential_reads_come_in_large_requests() {
    use std::os::fd::AsRawFd;
    if !fuse_or_skip("sequential_reads_come_in_large_requests") {
        return;
    }
    for (kib, want_ra, bound) in [("1024", 1024, 0..48u64), ("0", 128, 100..400)] {
        let mut m = Mounted::with_env(&[("AGENTFS_FUSE_READAHEAD_KIB", kib)]);
        // The mount appears before INIT is answered, and the server sets the readahead after
        // that; its first status record comes after both, so wait for the record, then look.
        let pid = m.server_pid();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !agentfs::sys::registry::live().iter().any(|r| r.pid == pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "server {pid} wrote no status record"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let entry = agentfs::sys::mounts::find(&fs::canonicalize(&m.mnt).unwrap()).unwrap();
        let ra = fs::read_to_string(format!(
            "/sys/class/bdi/{}:{}/read_ahead_kb",
            entry.major, entry.minor
        ))
        .unwrap();
        assert_eq!(
            ra.trim(),
            want_ra.to_string(),
            "read_ahead_kb with knob {kib}"
        );
        let data = pattern(16 << 20, 3);
        let mut f = fs::File::create(m.path("big")).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        // SAFETY: fadvise on a descriptor this test owns; it only drops clean cached pages.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
        drop(f);
        let before = common::served(pid);
        let mut back = Vec::new();
        fs::File::open(m.path("big"))
            .unwrap()
            .read_to_end(&mut back)
            .unwrap();
        let spent = common::served(pid) - before;
        assert!(back == data, "content read back");
        assert!(
            bound.contains(&spent),
            "knob {kib}: a cold 16 MiB read cost {spent} requests"
        );
        m.unmount();
    }
}
