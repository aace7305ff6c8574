//! Server-side caches and external changes, through a real mount.
//!
//! * Another process writing the mounted database (`agentfs fs DB write|rm|mkdir`) is seen by
//!   the mount well before the kernel's own attribute and entry timeouts (set to 60 s here), so
//!   only the server's invalidation notifications can explain it.
//! * Mutations through the mount are never answered from a stale server cache: readers and
//!   writers race on one directory and every observation is checked against a model.

mod common;

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{fuse_or_skip, Mounted};

/// Kernel timeouts long enough that only a notification can make the kernel ask again.
const LONG_TTL: [(&str, &str); 3] = [
    ("AGENTFS_FUSE_ATTR_TTL_MS", "60000"),
    ("AGENTFS_FUSE_ENTRY_TTL_MS", "60000"),
    ("AGENTFS_EXTERNAL_POLL_MS", "100"),
];

/// How long a change may take to show: many poll intervals, far below the 60 s timeouts.
const SEEN_WITHIN: Duration = Duration::from_secs(10);

/// `agentfs fs DB <args>` with `input` on stdin, from a second process while mounted.
fn offline(db: &Path, args: &[&str], input: &[u8]) {
    let mut child = Command::new(common::bin())
        .arg("fs")
        .arg(db)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("agentfs fs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .expect("feed stdin");
    let st = child.wait().expect("wait");
    assert!(st.success(), "agentfs fs {args:?} failed: {st}");
}

/// Wait until `f` holds; how long it took, or None after SEEN_WITHIN.
fn eventually(f: impl Fn() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < SEEN_WITHIN {
        if f() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// `pin`: keep `f` open throughout, so the kernel cannot evict its inode and only an
/// invalidation can refresh it (write-through only: under the writeback cache an open file
/// keeps the kernel's size, see kernel-notes).
fn external_changes(test: &str, extra: &[(&str, &str)], pin: bool) {
    if !fuse_or_skip(test) {
        return;
    }
    let env: Vec<(&str, &str)> = LONG_TTL.iter().chain(extra).copied().collect();
    let mut m = Mounted::with_env(&env);
    let f = m.path("f");
    let gone = m.path("gone");
    std::fs::write(&f, b"old").unwrap();
    std::fs::write(&gone, b"doomed").unwrap();
    std::fs::create_dir(m.path("d")).unwrap();
    // Let the kernel cache all of it: attributes, names, the page cache, the listing.
    assert_eq!(std::fs::read(&f).unwrap(), b"old");
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 3);
    assert!(std::fs::metadata(&gone).is_ok());
    assert!(std::fs::metadata(m.path("new")).is_err());
    let names = |dir: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&m.mnt), ["d", "f", "gone"]);
    // Let writeback reach the database before the other process writes; close the file (an
    // open file keeps the kernel's inode, and under the writeback cache its size).
    let held = std::fs::File::open(&f).unwrap();
    held.sync_all().unwrap();
    let held = pin.then_some(held);

    let new_content = b"new content, longer than before";
    offline(&m.db, &["write", "/f"], new_content);
    let t = eventually(|| std::fs::metadata(&f).map(|md| md.len()).ok() == Some(31));
    assert!(
        t.is_some(),
        "the new size was not seen within {SEEN_WITHIN:?}"
    );
    assert_eq!(
        std::fs::read(&f).unwrap(),
        new_content,
        "the new content must replace the cached pages"
    );

    // Warm the kernel's and the server's caches again with what is about to change.
    assert_eq!(names(&m.mnt), ["d", "f", "gone"]);
    assert!(std::fs::metadata(&gone).is_ok());
    assert!(std::fs::metadata(m.path("new")).is_err());
    assert!(names(&m.path("d")).is_empty());
    offline(&m.db, &["write", "/new"], b"hello");
    offline(&m.db, &["rm", "/gone"], b"");
    offline(&m.db, &["mkdir", "/d/sub"], b"");
    let seen = eventually(|| {
        names(&m.mnt) == ["d", "f", "new"]
            && std::fs::read(m.path("new")).ok().as_deref() == Some(b"hello".as_slice())
            && std::fs::metadata(&gone).is_err()
            && names(&m.path("d")) == ["sub"]
    });
    assert!(
        seen.is_some(),
        "names created and removed by another process were not seen: {:?}, gone stat {:?}",
        names(&m.mnt),
        std::fs::metadata(&gone).map(|md| md.len())
    );
    drop(held);
    m.unmount();
    common::assert_consistent(&m.db);
}

#[test]
fn external_changes_are_seen_before_the_kernel_timeouts() {
    external_changes(
        "external_changes_are_seen_before_the_kernel_timeouts",
        &[],
        false,
    );
}

#[test]
fn external_changes_are_seen_write_through() {
    external_changes(
        "external_changes_are_seen_write_through",
        &[("AGENTFS_FUSE_WRITEBACK_CACHE", "0")],
        true,
    );
}

#[test]
fn external_changes_are_missed_without_the_watcher() {
    // The control: with polling off the kernel keeps its cached size for the whole timeout,
    // which is what makes the tests above able to fail. Write-through, and the file stays open
    // so nothing (not even a global drop_caches by another program) can evict the inode.
    if !fuse_or_skip("external_changes_are_missed_without_the_watcher") {
        return;
    }
    let mut m = Mounted::with_env(&[
        ("AGENTFS_FUSE_ATTR_TTL_MS", "60000"),
        ("AGENTFS_FUSE_ENTRY_TTL_MS", "60000"),
        ("AGENTFS_FUSE_WRITEBACK_CACHE", "0"),
        ("AGENTFS_EXTERNAL_POLL_MS", "0"),
    ]);
    let f = m.path("f");
    std::fs::write(&f, b"old").unwrap();
    let pin = std::fs::File::open(&f).unwrap();
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 3);
    offline(&m.db, &["write", "/f"], b"new content");
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 3, "kernel cache kept");
    drop(pin);
    m.unmount();
}
