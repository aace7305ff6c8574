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

/// Requests the server answered (both transports), once its counters settled.
fn served(m: &Mounted) -> u64 {
    common::served(m.server_pid())
}

/// `times` commits by another connection to tables that are not the filesystem's (those
/// Litestream keeps in a database it replicates), each followed by a few poll intervals.
fn commit_elsewhere(db: &Path, times: u32) {
    let foreign = rusqlite::Connection::open(db).unwrap();
    foreign.busy_timeout(Duration::from_secs(10)).unwrap();
    foreign
        .execute_batch(
            "CREATE TABLE IF NOT EXISTS _litestream_seq (id INTEGER PRIMARY KEY, seq INTEGER);
             CREATE TABLE IF NOT EXISTS _litestream_lock (id INTEGER);",
        )
        .unwrap();
    for n in 0..times {
        foreign
            .execute(
                "INSERT INTO _litestream_seq (id, seq) VALUES (1, ?1)
                 ON CONFLICT(id) DO UPDATE SET seq = excluded.seq",
                [n],
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(400));
    }
}

/// Commits by another process that leave the filesystem's tables alone (what Litestream writes
/// into a database it replicates: its `_litestream_seq` and `_litestream_lock` tables; an
/// `agentfs kv set`) do not make the server drop the kernel's caches: an fstat of each of 100
/// open files costs no request afterwards. The control in the same mount: a file written by
/// `agentfs fs` makes the server invalidate, and the same fstats go to the server again. (The
/// files stay open so that a drop_caches by another program cannot evict them.)
#[test]
fn commits_that_leave_the_files_alone_keep_the_kernel_caches() {
    if !fuse_or_skip("commits_that_leave_the_files_alone_keep_the_kernel_caches") {
        return;
    }
    let mut m = Mounted::with_env(&LONG_TTL);
    let dir = m.path("d");
    std::fs::create_dir(&dir).unwrap();
    let files: Vec<std::fs::File> = (0..100)
        .map(|i| {
            let p = dir.join(format!("f{i}"));
            std::fs::write(&p, b"x").unwrap();
            std::fs::File::open(&p).unwrap()
        })
        .collect();
    let look = |from: usize| {
        for f in &files[from..] {
            assert_eq!(f.metadata().unwrap().len(), 1);
        }
    };
    look(0);
    look(0);

    let before = served(&m);
    commit_elsewhere(&m.db, 5);
    let kv = Command::new(common::bin())
        .arg("kv")
        .arg(&m.db)
        .args(["set", "k", "1"])
        .output()
        .unwrap();
    assert!(kv.status.success(), "agentfs kv set: {kv:?}");
    // Polls of AGENTFS_EXTERNAL_POLL_MS=100 see it.
    std::thread::sleep(Duration::from_millis(400));
    look(0);
    let kept = served(&m) - before;
    assert!(
        kept < 10,
        "fstats after commits to other tables cost {kept} requests: the kernel's caches were dropped"
    );

    // The control: a change to the files is still seen, and costs the kernel its caches.
    let before = served(&m);
    offline(&m.db, &["write", "/d/f0"], b"yy");
    let seen = eventually(|| files[0].metadata().map(|md| md.len()).ok() == Some(2));
    assert!(seen.is_some(), "a change by `agentfs fs` was not seen");
    look(1);
    let after_change = served(&m) - before;
    assert!(
        after_change >= 100,
        "only {after_change} requests after an external change: nothing was invalidated"
    );
    drop(files);
    m.unmount();
    common::assert_consistent(&m.db);
}

/// A read-only mount watches on a connection of its own, where every commit is another
/// process's: a change to the files shows, a commit to another table does not cost the
/// kernel its caches.
#[test]
fn a_read_only_mount_sees_changes_to_the_files_only() {
    if !fuse_or_skip("a_read_only_mount_sees_changes_to_the_files_only") {
        return;
    }
    let mut m = Mounted::unmounted_with_env(&LONG_TTL);
    let init = common::agentfs(&["init", m.db.to_str().unwrap()]);
    assert!(init.status.success(), "agentfs init: {init:?}");
    offline(&m.db, &["write", "/f"], b"old");
    m.mount_with(&["-o", "ro"]);
    let f = std::fs::File::open(m.path("f")).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 3);
    assert_eq!(f.metadata().unwrap().len(), 3);
    let before = served(&m);
    commit_elsewhere(&m.db, 3);
    assert_eq!(f.metadata().unwrap().len(), 3);
    let kept = served(&m) - before;
    assert_eq!(
        kept, 0,
        "an fstat after commits to another table cost requests"
    );
    offline(&m.db, &["write", "/f"], b"new content");
    let seen = eventually(|| f.metadata().map(|md| md.len()).ok() == Some(11));
    assert!(
        seen.is_some(),
        "a read-only mount did not see a change to its files"
    );
    drop(f);
    m.unmount();
}

/// Writers mutate their own files in one shared directory (truncate to a growing size,
/// rename between two names, recreate, mkdir/rmdir) while readers stat and list everything
/// without pause, filling the server caches with values that race the mutations. Kernel
/// timeouts are 0 and the writeback cache is off, so every stat, lookup and listing is
/// answered by the server. Checks: each writer sees its own mutation at once (stat, lookup of
/// both names, the listing), and a reader never sees a size older than the last one a writer
/// had published before the reader's stat began.
#[test]
fn server_caches_never_serve_stale_state_after_a_mutation() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    if !fuse_or_skip("server_caches_never_serve_stale_state_after_a_mutation") {
        return;
    }
    let mut m = Mounted::with_env(&[
        ("AGENTFS_FUSE_ATTR_TTL_MS", "0"),
        ("AGENTFS_FUSE_ENTRY_TTL_MS", "0"),
        ("AGENTFS_FUSE_WRITEBACK_CACHE", "0"),
        ("AGENTFS_EXTERNAL_POLL_MS", "0"),
    ]);
    const WRITERS: usize = 3;
    const ROUNDS: u64 = 150;
    let dir = m.path("shared");
    std::fs::create_dir(&dir).unwrap();
    // Per writer: (file generation << 32) | the size it last set and returned from. A
    // recreated file starts a new generation (and may be smaller).
    let published: Arc<Vec<AtomicU64>> =
        Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let name = |w: usize, side: bool| format!("w{w}_{}", if side { "b" } else { "a" });
    let listing = |d: &Path| -> Vec<String> {
        std::fs::read_dir(d)
            .map(|it| {
                it.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };

    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (dir, published, stop) = (dir.clone(), published.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut checked = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let _ = listing(&dir);
                    for w in 0..WRITERS {
                        let before = published[w].load(Ordering::SeqCst);
                        // The file is under one of two names; a rename may move it between
                        // the two stats, so take the larger size seen.
                        let seen = [false, true]
                            .iter()
                            .filter_map(|s| std::fs::metadata(dir.join(name(w, *s))).ok())
                            .map(|md| md.len())
                            .max();
                        let after = published[w].load(Ordering::SeqCst);
                        let floor = before & 0xffff_ffff;
                        if before >> 32 != after >> 32 {
                            continue;
                        }
                        if let Some(size) = seen {
                            assert!(
                                size >= floor,
                                "writer {w}: a reader saw size {size} after {floor} was published"
                            );
                            checked += 1;
                        }
                    }
                }
                checked
            })
        })
        .collect();

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (dir, published) = (dir.clone(), published.clone());
            std::thread::spawn(move || {
                let mut side = false;
                let mut size = 0u64;
                let mut generation = 0u64;
                std::fs::write(dir.join(name(w, side)), b"").unwrap();
                let sub = dir.join(format!("d{w}"));
                for round in 1..=ROUNDS {
                    size += 1 + round % 7;
                    let cur = dir.join(name(w, side));
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&cur)
                        .unwrap()
                        .set_len(size)
                        .unwrap();
                    published[w].store(generation << 32 | size, Ordering::SeqCst);
                    assert_eq!(std::fs::metadata(&cur).unwrap().len(), size, "own truncate");
                    if round % 3 == 0 {
                        let next = dir.join(name(w, !side));
                        std::fs::rename(&cur, &next).unwrap();
                        side = !side;
                        assert!(std::fs::metadata(&cur).is_err(), "old name still resolves");
                        assert_eq!(std::fs::metadata(&next).unwrap().len(), size);
                        let names = listing(&dir);
                        assert!(names.contains(&name(w, side)), "new name not listed");
                        assert!(!names.contains(&name(w, !side)), "old name still listed");
                    }
                    if round % 5 == 0 {
                        std::fs::create_dir(&sub).unwrap();
                        assert!(std::fs::metadata(&sub).unwrap().is_dir());
                        assert!(listing(&dir).contains(&format!("d{w}")));
                        std::fs::remove_dir(&sub).unwrap();
                        assert!(std::fs::metadata(&sub).is_err(), "removed dir resolves");
                        assert!(!listing(&dir).contains(&format!("d{w}")));
                    }
                    if round % 11 == 0 {
                        // Recreate: a new inode under the same name, smaller than before.
                        let cur = dir.join(name(w, side));
                        generation += 1;
                        published[w].store(generation << 32, Ordering::SeqCst);
                        std::fs::remove_file(&cur).unwrap();
                        assert!(std::fs::metadata(&cur).is_err(), "unlinked name resolves");
                        std::fs::write(&cur, b"").unwrap();
                        size = 0;
                        assert_eq!(std::fs::metadata(&cur).unwrap().len(), 0);
                    }
                }
            })
        })
        .collect();
    for t in writers {
        t.join().expect("a writer saw stale state");
    }
    stop.store(true, Ordering::Relaxed);
    let checked: u64 = readers
        .into_iter()
        .map(|t| t.join().expect("a reader saw stale state"))
        .sum();
    assert!(checked > 0, "readers observed nothing");
    m.unmount();
    common::assert_consistent(&m.db);
}
