//! A commit that fails after the work it carried was acknowledged (SPEC.md "Durability", "A
//! failed commit"): the failure is sticky until the unmount, the kernel forgets what the lost
//! operations changed, `agentfs umount` exits non-zero saying what was lost, and nothing
//! reported successful is missing from the database except the lost window. Failures are
//! injected with AGENTFS_FAULT_COMMIT: while its trigger file exists every COMMIT fails (EIO).

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{assert_consistent, fuse_or_skip, Mounted};

/// A mount whose commits fail while `trigger` exists.
struct Faulty {
    m: Mounted,
    trigger: PathBuf,
    _dir: tempfile::TempDir,
}

impl Faulty {
    /// `extra`: more knobs. The namespace batch stays open for `window_ms`, and the gap after a
    /// batch is off, so an operation is acknowledged before the commit that loses it.
    fn new(window_ms: u64, extra: &[(&str, &str)]) -> Faulty {
        let dir = tempfile::tempdir_in(common::scratch_root()).unwrap();
        let trigger = dir.path().join("fail-commits");
        let window = window_ms.to_string();
        let mut env = vec![
            ("AGENTFS_FAULT_COMMIT", trigger.to_str().unwrap()),
            ("AGENTFS_BATCH_WINDOW_MS", window.as_str()),
            ("AGENTFS_BATCH_NAMESPACE_GAP_MS", "0"),
        ];
        env.extend_from_slice(extra);
        let m = Mounted::with_env(&env);
        Faulty {
            m,
            trigger,
            _dir: dir,
        }
    }

    fn fail_commits(&self, on: bool) {
        if on {
            fs::write(&self.trigger, b"").unwrap();
        } else {
            let _ = fs::remove_file(&self.trigger);
        }
    }
}

fn errno(r: std::io::Result<()>) -> Option<i32> {
    r.err().map(|e| e.raw_os_error().unwrap_or(-1))
}

fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// Poll `cond` for up to 5 s (the server tells the kernel from a background thread).
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_lost_commit_is_sticky_and_umount_says_what_was_lost() {
    if !fuse_or_skip("a_lost_commit_is_sticky_and_umount_says_what_was_lost") {
        return;
    }
    let mut f = Faulty::new(300, &[]);
    let m = &f.m;
    fs::write(m.path("kept"), b"kept").unwrap();
    fs::File::open(m.path("kept")).unwrap().sync_all().unwrap();
    fsync_dir(&m.mnt).unwrap();
    f.fail_commits(true);
    // Acknowledged (answered) while its batch is open; the batch's commit fails.
    fs::write(m.path("lost"), b"lost").unwrap();
    fs::create_dir(m.path("lostdir")).unwrap();
    let first = errno(fs::File::open(m.path("lost")).and_then(|f| f.sync_all()));
    assert_eq!(first, Some(libc::EIO), "the fsync that met the failure");
    // Sticky: every later barrier reports it, and every change is refused, also after the
    // cause is gone; reads go on.
    f.fail_commits(false);
    let m = &f.m;
    assert_eq!(
        errno(fs::File::open(m.path("kept")).and_then(|f| f.sync_all())),
        Some(libc::EIO),
        "a later fsync of another file"
    );
    assert_eq!(
        errno(fsync_dir(&m.mnt)),
        Some(libc::EIO),
        "a directory fsync"
    );
    assert_eq!(errno(fs::create_dir(m.path("after"))), Some(libc::EIO));
    assert_eq!(errno(fs::remove_file(m.path("kept"))), Some(libc::EIO));
    assert_eq!(fs::read(m.path("kept")).unwrap(), b"kept");
    // The kernel was told: the lost names are gone from its caches too.
    eventually("the lost file still shows", || !m.path("lost").exists());
    eventually("the lost directory still shows", || {
        !m.path("lostdir").exists()
    });
    let status = common::settled_record(m.server_pid());
    assert!(
        status.lost.contains("EIO") || status.lost.contains("Input/output"),
        "{status:?}"
    );
    let (out, server) = f.m.unmount_reporting();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "umount after a lost commit exited 0");
    assert!(
        said.contains("acknowledged operations") && said.contains("failed"),
        "umount does not say what was lost: {said}"
    );
    assert!(!server.success(), "the server exited 0 after a lost commit");
    assert_consistent(&f.m.db);
    // A remount starts clean: what was committed before is there, the lost window is not.
    f.m.mount();
    assert_eq!(fs::read(f.m.path("kept")).unwrap(), b"kept");
    assert!(!f.m.path("lost").exists() && !f.m.path("lostdir").exists());
    fs::write(f.m.path("again"), b"works").unwrap();
    f.m.unmount();
}

#[test]
fn a_name_whose_removal_was_lost_is_not_hidden_by_the_kernel_cache() {
    if !fuse_or_skip("a_name_whose_removal_was_lost_is_not_hidden_by_the_kernel_cache") {
        return;
    }
    // Ten minutes of kernel caching for names, attributes and failed lookups: without the
    // server's invalidations every answer below would come from the kernel's cache.
    let long = "600000";
    let mut f = Faulty::new(
        300,
        &[
            ("AGENTFS_FUSE_ENTRY_TTL_MS", long),
            ("AGENTFS_FUSE_ATTR_TTL_MS", long),
            ("AGENTFS_FUSE_NEGATIVE_TTL_MS", long),
        ],
    );
    let m = &f.m;
    fs::write(m.path("victim"), b"still here").unwrap();
    // Its bytes reach the server now: the kernel drops the dirty pages of a file it unlinks.
    fs::File::open(m.path("victim"))
        .unwrap()
        .sync_all()
        .unwrap();
    fs::create_dir(m.path("dir")).unwrap();
    fs::write(m.path("dir/inner"), b"inner").unwrap();
    fs::File::open(m.path("dir/inner"))
        .unwrap()
        .sync_all()
        .unwrap();
    fsync_dir(&m.mnt).unwrap();
    f.fail_commits(true);
    fs::remove_file(m.path("victim")).unwrap();
    fs::rename(m.path("dir/inner"), m.path("moved")).unwrap();
    fs::write(m.path("new"), b"").unwrap();
    // The kernel now caches: victim and dir/inner absent, moved and new present.
    assert!(!m.path("victim").exists() && !m.path("dir/inner").exists());
    assert!(m.path("moved").exists() && m.path("new").exists());
    assert_eq!(errno(fsync_dir(&m.mnt)), Some(libc::EIO));
    f.fail_commits(false);
    eventually("a removed name whose removal was lost stays hidden", || {
        fs::read(m.path("victim")).ok().as_deref() == Some(&b"still here"[..])
    });
    eventually("the rename's source stays hidden", || {
        m.path("dir/inner").exists()
    });
    eventually("the rename's target still shows", || {
        !m.path("moved").exists()
    });
    eventually("a lost create still shows", || !m.path("new").exists());
    let (out, _) = f.m.unmount_reporting();
    assert!(!out.status.success());
}

/// An unlink or rmdir the server's caches can answer is acknowledged before its statements
/// run (`AGENTFS_BATCH_UNLINK_QUEUE`), on a plain mount and on an overlay one; when they fail
/// afterwards, the loss is as loud as a lost commit: sticky, the name back in the kernel's
/// view, umount non-zero.
#[test]
fn a_removal_that_fails_after_its_reply_is_lost_loudly() {
    if !fuse_or_skip("a_removal_that_fails_after_its_reply_is_lost_loudly") {
        return;
    }
    for (overlay, rmdir) in [(false, false), (true, false), (false, true), (true, true)] {
        let mut m = Mounted::unmounted();
        if overlay {
            let base = m.dir.path().join("base");
            fs::create_dir_all(base.join("dir")).unwrap();
            fs::write(base.join("dir/from-base"), b"base").unwrap();
            common::init_overlay(&m.db, &base);
        } else {
            m.mount();
            m.unmount();
        }
        // Removing this one name fails inside SQLite, whenever it is tried.
        rusqlite::Connection::open(&m.db)
            .unwrap()
            .execute_batch(
                "CREATE TRIGGER boom BEFORE DELETE ON fs_dentry WHEN OLD.name = 'doomed'
                 BEGIN SELECT RAISE(ABORT, 'boom'); END;",
            )
            .unwrap();
        m.mount();
        let dir = m.path("dir");
        fs::create_dir_all(&dir).unwrap();
        let doomed = dir.join("doomed");
        let what = format!("overlay {overlay}, rmdir {rmdir}");
        fs::write(dir.join("other"), b"").unwrap();
        if rmdir {
            fs::create_dir(&doomed).unwrap();
            fs::remove_dir(&doomed).expect("acknowledged before it ran");
        } else {
            fs::write(&doomed, b"").unwrap();
            fs::remove_file(&doomed).expect("acknowledged before it ran");
        }
        assert!(
            errno(fsync_dir(&m.mnt)).is_some(),
            "{what}: the barrier met the loss"
        );
        assert!(
            errno(fs::remove_file(dir.join("other"))).is_some(),
            "{what}: sticky: later changes are refused"
        );
        eventually("the name whose removal was lost stays hidden", || {
            doomed.exists()
        });
        let (out, server) = m.unmount_reporting();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{what}: umount after a lost removal exited 0"
        );
        assert!(said.contains("acknowledged operation"), "{what}: {said}");
        assert!(!server.success());
    }
}

/// What the test believes the tree holds: path -> file contents (None: a directory).
type Tree = BTreeMap<String, Option<Vec<u8>>>;

fn walk(root: &Path, rel: &str, out: &mut Tree) {
    for e in fs::read_dir(root.join(rel)).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        let path = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        if e.file_type().unwrap().is_dir() {
            out.insert(path.clone(), None);
            walk(root, &path, out);
        } else {
            out.insert(path.clone(), Some(fs::read(root.join(&path)).unwrap()));
        }
    }
}

/// xorshift64*: reproducible randomness without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// One random operation on `tree` through the mount: its outcome, the tree after it (if it
/// succeeds), and whether it is a barrier (an fsync).
fn random_op(
    rng: &mut Rng,
    mnt: &Path,
    tree: &Tree,
    serial: usize,
) -> (std::io::Result<()>, Tree, bool) {
    let files: Vec<&String> = tree
        .iter()
        .filter(|(_, v)| v.is_some())
        .map(|(k, _)| k)
        .collect();
    let dirs: Vec<&String> = tree
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k)
        .collect();
    let mut next = tree.clone();
    let in_dir = |rng: &mut Rng, name: String| match rng.below(dirs.len() as u64 + 1) {
        0 => name,
        i => format!("{}/{name}", dirs[i as usize - 1]),
    };
    let op = rng.below(6);
    let barrier = op < 2 || op == 5 || files.is_empty() && op < 4;
    let r = match op {
        // An editor-style new file: written, fsynced.
        0 | 1 => {
            let p = in_dir(rng, format!("f{serial}"));
            let data = format!("contents of {p} #{serial}").repeat(1 + rng.below(300) as usize);
            next.insert(p.clone(), Some(data.clone().into_bytes()));
            (|| {
                let mut f = fs::File::create(mnt.join(&p))?;
                f.write_all(data.as_bytes())?;
                f.sync_all()
            })()
        }
        2 if !files.is_empty() => {
            let from = files[rng.below(files.len() as u64) as usize].clone();
            let to = in_dir(rng, format!("r{serial}"));
            let v = next.remove(&from).unwrap();
            next.insert(to.clone(), v);
            fs::rename(mnt.join(from), mnt.join(to))
        }
        3 if !files.is_empty() => {
            let p = files[rng.below(files.len() as u64) as usize].clone();
            next.remove(&p);
            fs::remove_file(mnt.join(p))
        }
        4 => {
            let p = in_dir(rng, format!("d{serial}"));
            next.insert(p.clone(), None);
            fs::create_dir(mnt.join(p))
        }
        _ => fsync_dir(mnt),
    };
    (r, next, barrier)
}

#[test]
fn random_commit_failures_lose_nothing_reported_successful_but_the_lost_window() {
    if !fuse_or_skip("random_commit_failures_lose_nothing_reported_successful_but_the_lost_window")
    {
        return;
    }
    let mut f = Faulty::new(20, &[]);
    let mut serial = 0;
    for round in 0..8u64 {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((round + 1) * 0x1000_0001));
        let mut actual = Tree::new();
        walk(&f.m.mnt, "", &mut actual);
        // states[i]: the tree after the first i successful operations; `synced`: the index
        // of the state the last successful barrier covered.
        let mut states = vec![actual];
        let mut synced = 0;
        let mut failed = false;
        let mut touched_by_failed = Vec::<String>::new();
        let fail_at = 5 + rng.below(30) as usize;
        for i in 0..50 {
            if i == fail_at {
                f.fail_commits(true);
            }
            serial += 1;
            let cur = states.last().unwrap().clone();
            let (r, next, barrier) = random_op(&mut rng, &f.m.mnt, &cur, serial);
            match r {
                Ok(()) => {
                    assert!(
                        !failed,
                        "round {round}: an operation succeeded after a failure"
                    );
                    states.push(next);
                    // A successful fsync (file or directory) covers everything before it.
                    if barrier {
                        synced = states.len() - 1;
                    }
                }
                Err(e) => {
                    // EIO, or ENOENT/ENOTDIR from the kernel once it forgot the lost names.
                    let code = e.raw_os_error().unwrap_or(0);
                    assert!(
                        [libc::EIO, libc::ENOENT, libc::ENOTDIR].contains(&code),
                        "round {round}: {e}"
                    );
                    assert!(
                        i >= fail_at,
                        "round {round}: a failure before any fault: {e}"
                    );
                    if !failed {
                        // The first failing operation may have half-happened (a create whose
                        // fsync failed): its names are exempt.
                        touched_by_failed = diff_names(&cur, &next);
                    }
                    failed = true;
                }
            }
        }
        if !failed {
            // The fault came late: give the next commit something to lose.
            serial += 1;
            let p = format!("late{serial}");
            if fs::create_dir(f.m.mnt.join(&p)).is_ok() {
                let mut next = states.last().unwrap().clone();
                next.insert(p, None);
                states.push(next);
            }
        }
        assert_eq!(
            errno(fsync_dir(&f.m.mnt)),
            Some(libc::EIO),
            "round {round}: a barrier after the failure succeeded"
        );
        f.fail_commits(false);
        let (out, server) = f.m.unmount_reporting();
        assert!(
            !out.status.success() && !server.success(),
            "round {round}: the unmount did not report the lost commit"
        );
        // (A reap whose own commit failed may leave an orphan, as a crash does: the remount
        // reaps it, and the consistency check runs after the last clean unmount.)
        f.m.mount();
        let mut got = Tree::new();
        walk(&f.m.mnt, "", &mut got);
        let strip = |t: &Tree| -> Tree {
            t.iter()
                .filter(|(k, _)| {
                    !touched_by_failed
                        .iter()
                        .any(|n| *k == n || k.starts_with(&format!("{n}/")))
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        let got_s = strip(&got);
        // The database holds a state the operations passed through, at or after the last
        // successful barrier: nothing reported successful before it is missing.
        let found = states[synced..].iter().position(|s| strip(s) == got_s);
        assert!(
            found.is_some(),
            "round {round}: after remount the tree is no state between the last barrier \
             (state {synced}) and the last success (state {}):\n got {:?}\n synced {:?}",
            states.len() - 1,
            got_s.keys().collect::<Vec<_>>(),
            strip(&states[synced]).keys().collect::<Vec<_>>()
        );
    }
    f.m.unmount();
    assert_consistent(&f.m.db);
}

/// Paths present in one tree and not the other, or different.
fn diff_names(a: &Tree, b: &Tree) -> Vec<String> {
    let mut out: Vec<String> = a
        .keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect();
    out.dedup();
    out
}

/// Detaches a mount this test made when the test ends, passing or failing.
struct Detach(PathBuf);

impl Drop for Detach {
    fn drop(&mut self) {
        common::force_cleanup(&self.0);
    }
}

#[test]
fn a_background_server_logs_the_loss_where_status_says() {
    if !fuse_or_skip("a_background_server_logs_the_loss_where_status_says") {
        return;
    }
    let dir = tempfile::tempdir_in(common::scratch_root()).unwrap();
    let db = dir.path().join("db.sqlite");
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let mnt = fs::canonicalize(&mnt).unwrap();
    let trigger = dir.path().join("fail-commits");
    let out = std::process::Command::new(common::bin())
        .args(["mount", db.to_str().unwrap(), mnt.to_str().unwrap()])
        .env("AGENTFS_FAULT_COMMIT", &trigger)
        .env("AGENTFS_BATCH_WINDOW_MS", "300")
        .env("AGENTFS_BATCH_NAMESPACE_GAP_MS", "0")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _detach = Detach(mnt.clone());
    fs::write(&trigger, b"").unwrap();
    fs::write(mnt.join("lost"), b"lost").unwrap();
    assert_eq!(errno(fsync_dir(&mnt)), Some(libc::EIO));
    // `agentfs status` names the log, and shows the failure once the record is rewritten.
    let mine = mnt.display().to_string();
    let mut log = None;
    eventually("agentfs status shows no failure", || {
        let out = common::agentfs(&["status"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        // The server's detail lines (memory, log, failure) follow its row, indented.
        let detail: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.contains(&mine))
            .skip(1)
            .take_while(|l| l.starts_with(' '))
            .map(str::trim)
            .collect();
        log = detail
            .iter()
            .find_map(|l| l.strip_prefix("log: "))
            .map(PathBuf::from);
        detail.iter().any(|l| l.starts_with("FAILED: "))
    });
    let log = log.expect("agentfs status names no log");
    let text = fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("a commit to the database failed"),
        "the log says nothing of the loss: {text}"
    );
    let out = common::agentfs(&["umount", mnt.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "umount exited 0");
    assert!(
        said.contains(&log.display().to_string()),
        "umount does not name the log: {said}"
    );
    fs::remove_file(&trigger).unwrap();
    assert_consistent(&db);
}
