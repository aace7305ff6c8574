//! A mount made by an ordinary user through fusermount3 (fd passing), used and unmounted by
//! that user. /dev/fuse is root-only on this kind of machine, so the test opens its mode for the
//! duration and restores it.

mod common;

use std::fs;
use std::os::unix::fs::{chown, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

use common::{fuse_or_skip, scratch_root, UnmountOnDrop};

const USER: u32 = 65534;

/// `program args` as the test user, for the caller to add to.
fn user_command(program: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .uid(USER)
        .gid(USER)
        .env_remove("XDG_RUNTIME_DIR");
    cmd
}

fn as_user(program: &str, args: &[&str]) -> Output {
    user_command(program, args).output().unwrap()
}

/// What the tests need: fusermount3 and a build tree other users can reach (a skip, or a
/// failure under AGENTFS_REQUIRE_FUSE, without them), /dev/fuse opened up while they run,
/// and a scratch directory owned by the user with `db.sqlite` and an empty `mnt/` in it.
struct UserScratch {
    _mode: common::DevFuseMode,
    dir: tempfile::TempDir,
    db: std::path::PathBuf,
    mnt: std::path::PathBuf,
}

fn user_scratch(test: &str) -> Option<UserScratch> {
    if !fuse_or_skip(test) {
        return None;
    }
    if Command::new("fusermount3").arg("-V").output().is_err() {
        assert!(
            !agentfs::knobs::get().require_fuse,
            "fusermount3 is required (validation/install-deps.sh)"
        );
        eprintln!("SKIP: {test}: fusermount3 not installed");
        return None;
    }
    let bin = common::bin();
    if !common::readable_by_all(&bin) {
        eprintln!(
            "SKIP: {test}: {} is not reachable by other users",
            bin.display()
        );
        assert!(
            !agentfs::knobs::get().require_fuse,
            "the build tree must be world-readable"
        );
        return None;
    }
    let mode = common::DevFuseMode::open_up();
    let dir = tempfile::tempdir_in(scratch_root()).unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    chown(dir.path(), Some(USER), Some(USER)).unwrap();
    let db = dir.path().join("db.sqlite");
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    chown(&mnt, Some(USER), Some(USER)).unwrap();
    Some(UserScratch {
        _mode: mode,
        dir,
        db,
        mnt,
    })
}

#[test]
fn an_ordinary_user_mounts_through_fusermount3() {
    let Some(UserScratch {
        db,
        mnt,
        _mode,
        dir: _dir,
    }) = user_scratch("an_ordinary_user_mounts_through_fusermount3")
    else {
        return;
    };
    let bin = common::bin();
    let bin_s = bin.to_str().unwrap();
    let (db_s, mnt_s) = (db.to_str().unwrap(), mnt.to_str().unwrap());

    let out = as_user(bin_s, &["mount", db_s, mnt_s]);
    assert!(
        out.status.success(),
        "user mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _cleanup = UnmountOnDrop(mnt.clone());
    assert!(common::is_mounted(&mnt));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("agentfs umount {mnt_s}")),
        "{said:?}"
    );
    // `status` lists the caller's own mounts; root sees other users' only with --all.
    let listed = |out: Output| String::from_utf8_lossy(&out.stdout).contains(mnt_s);
    assert!(listed(as_user(bin_s, &["status"])), "the owner sees it");
    assert!(!listed(common::agentfs(&["status"])), "root's own list");
    let all = common::agentfs(&["status", "--all"]);
    let text = String::from_utf8_lossy(&all.stdout);
    assert!(
        text.contains(mnt_s) && text.contains(&format!("user {USER}")),
        "{text}"
    );
    let script = format!(
        "echo hello > {mnt_s}/f && mkdir {mnt_s}/d && cat {mnt_s}/f && stat -c %u:%g {mnt_s}/f"
    );
    let out = as_user("sh", &["-c", &script]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "use as user: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text, format!("hello\n{USER}:{USER}\n"));
    let out = as_user(bin_s, &["umount", mnt_s]);
    assert!(
        out.status.success(),
        "user umount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!common::is_mounted(&mnt));
    // Nothing left running: the database lock is free.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while agentfs::sys::lock::holder_pid(&db).is_some() {
        assert!(std::time::Instant::now() < deadline, "server still running");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // A database its user cannot write mounts read-only, and says so.
    fs::set_permissions(&db, fs::Permissions::from_mode(0o444)).unwrap();
    let out = as_user(bin_s, &["mount", db_s, mnt_s]);
    assert!(
        out.status.success(),
        "read-only user mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("read-only"));
    let opts = common::mount_options(&mnt).unwrap_or_default();
    assert!(opts.split(',').any(|o| o == "ro"), "{opts}");
    let read = as_user("cat", &[mnt.join("f").to_str().unwrap()]);
    assert_eq!(read.stdout, b"hello\n");
    assert!(as_user(bin_s, &["umount", mnt_s]).status.success());
    // With --json the note is a warning object, as every line of ours on stderr.
    let out = as_user(bin_s, &["--json", "mount", db_s, mnt_s]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let warned = common::world::warnings(&out);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0]["message"]
            .as_str()
            .unwrap()
            .ends_with("mounting it read-only"),
        "{warned:?}"
    );
    assert_eq!(warned[0]["path"], db_s, "{warned:?}");
    assert!(as_user(bin_s, &["umount", mnt_s]).status.success());
    common::force_cleanup(&mnt);
    common::assert_consistent(&db);
}

/// An ordinary user's mount (fusermount3) watches for other processes' changes as root's does:
/// commits to tables outside the filesystem (Litestream's own, while it replicates; `agentfs
/// kv`) leave the kernel's caches alone, and a file written by `agentfs fs` is seen. Told by
/// the server's log, which names each invalidation.
#[test]
fn an_ordinary_users_mount_invalidates_only_for_changes_to_its_files() {
    let Some(UserScratch {
        db,
        mnt,
        dir,
        _mode,
    }) = user_scratch("an_ordinary_users_mount_invalidates_only_for_changes_to_its_files")
    else {
        return;
    };
    let bin = common::bin();
    let log = dir.path().join("server.log");
    let bin_s = bin.to_str().unwrap();
    let (db_s, mnt_s) = (db.to_str().unwrap(), mnt.to_str().unwrap());
    assert!(as_user(bin_s, &["init", db_s]).status.success());
    let mut server = Command::new(&bin)
        .args(["mount", db_s, mnt_s, "-f"])
        .env("AGENTFS_LOG", "info")
        .env("AGENTFS_EXTERNAL_POLL_MS", "100")
        .env_remove("XDG_RUNTIME_DIR")
        .stderr(fs::File::create(&log).unwrap())
        .uid(USER)
        .gid(USER)
        .spawn()
        .unwrap();
    let _cleanup = UnmountOnDrop(mnt.clone());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !common::is_mounted(&mnt) {
        assert!(
            std::time::Instant::now() < deadline,
            "the user's mount did not appear"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let invalidations = || {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("database changed by another process")
            .count()
    };
    // Files through the mount, then another process of the same user commits to tables that
    // are not the filesystem's, a poll interval apart.
    let script = format!(
        "import os, sqlite3, time
for i in range(20):
    with open('{mnt_s}/f%d' % i, 'w') as f: f.write('x')
c = sqlite3.connect('{db_s}', timeout=10)
c.execute('CREATE TABLE IF NOT EXISTS _litestream_seq (id INTEGER PRIMARY KEY, seq INTEGER)')
c.commit()
for n in range(5):
    c.execute('INSERT OR REPLACE INTO _litestream_seq (id, seq) VALUES (1, ?)', (n,))
    c.commit()
    time.sleep(0.4)
"
    );
    let out = as_user("python3", &["-c", &script]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(as_user(bin_s, &["kv", db_s, "set", "k", "1"])
        .status
        .success());
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(
        invalidations(),
        0,
        "commits to other tables made the server invalidate: {}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    // The control: a change to the files is seen and invalidates.
    let write = format!("printf new | {bin_s} fs {db_s} write /f0");
    assert!(as_user("sh", &["-c", &write]).status.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let read = as_user("cat", &[mnt.join("f0").to_str().unwrap()]);
        // The server logs an invalidation just after it dropped its own caches.
        if read.stdout == b"new" && invalidations() >= 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a change by `agentfs fs` was not seen ({:?}) or invalidated nothing ({})",
            String::from_utf8_lossy(&read.stdout),
            invalidations()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(as_user(bin_s, &["umount", mnt_s]).status.success());
    assert!(server.wait().unwrap().success(), "the user's server failed");
    common::force_cleanup(&mnt);
    common::assert_consistent(&db);
}

/// An ordinary user's mount keeps what a long write and in-place overwrites stored, with the
/// WAL machinery at small sizes so it all runs as that user: checkpoints beside the writer and
/// by the writer itself, writeback starts of the -wal, 4 KiB patches inside stored chunks
/// (incremental blob I/O). The bytes read back after a remount, the -wal is the user's, and
/// the database is consistent.
#[test]
fn an_ordinary_users_mount_keeps_long_writes_and_overwrites_in_place() {
    let test = "an_ordinary_users_mount_keeps_long_writes_and_overwrites_in_place";
    let Some(UserScratch {
        db,
        mnt,
        _mode,
        dir,
    }) = user_scratch(test)
    else {
        return;
    };
    let bin = common::bin();
    let bin_s = bin.to_str().unwrap();
    let (db_s, mnt_s) = (db.to_str().unwrap(), mnt.to_str().unwrap());
    let mount = || {
        user_mount(
            bin_s,
            db_s,
            mnt_s,
            &[
                ("AGENTFS_WAL_CHECKPOINT_PAGES", "64"),
                ("AGENTFS_WAL_WRITEBACK_KIB", "256"),
            ],
        )
    };
    mount();
    let _cleanup = UnmountOnDrop(mnt.clone());
    let exp = dir.path().join("expected");
    let exp_s = exp.to_str().unwrap();
    let big = format!("{mnt_s}/big");
    let mut script = format!(
        "set -e; head -c 8388608 /dev/urandom > {exp_s}; cat {exp_s} > {big}; sync {big}; \
         cd {dir}; ",
        dir = dir.path().display()
    );
    for block in [0, 3, 17, 100, 511, 1000, 2047] {
        script.push_str(&format!(
            "head -c 4096 /dev/urandom > patch; \
             dd if=patch of={exp_s} bs=4096 seek={block} conv=notrunc status=none; \
             dd if=patch of={big} bs=4096 seek={block} conv=notrunc status=none; "
        ));
    }
    script.push_str(&format!("sync {big}"));
    let out = as_user("sh", &["-c", &script]);
    assert!(
        out.status.success(),
        "writes as the user: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    use std::os::unix::fs::MetadataExt;
    let wal = fs::metadata(format!("{db_s}-wal")).expect("the mount's -wal");
    assert_eq!(wal.uid(), USER, "the -wal belongs to the user");
    assert!(as_user(bin_s, &["umount", mnt_s]).status.success());
    mount();
    let out = as_user("cmp", &[exp_s, &big]);
    assert!(
        out.status.success(),
        "read back after a remount: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(as_user(bin_s, &["umount", mnt_s]).status.success());
    common::force_cleanup(&mnt);
    common::assert_consistent(&db);
}

/// Mount `db` at `mnt` as the test user, with `env` added to its environment.
fn user_mount(bin: &str, db: &str, mnt: &str, env: &[(&str, &str)]) {
    let out = user_command(bin, &["mount", db, mnt])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "user mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An ordinary user's mount is served over the ring when the kernel offers it: its requests
/// arrive on the ring, a large file reads back intact after its cached pages were dropped,
/// with the large READs handed to workers, and the ring's buffers hold only the pages used.
#[test]
fn an_ordinary_users_ring_mount_reads_large_files_back() {
    let test = "an_ordinary_users_ring_mount_reads_large_files_back";
    let Some(UserScratch {
        db,
        mnt,
        _mode,
        dir,
    }) = user_scratch(test)
    else {
        return;
    };
    let Some(_param) = common::UringParam::set("Y") else {
        assert!(
            !agentfs::knobs::get().require_fuse,
            "cannot set enable_uring"
        );
        eprintln!("SKIP {test}: enable_uring is not writable");
        return;
    };
    let bin = common::bin();
    let bin_s = bin.to_str().unwrap();
    let (db_s, mnt_s) = (db.to_str().unwrap(), mnt.to_str().unwrap());
    user_mount(bin_s, db_s, mnt_s, &[("AGENTFS_FUSE_URING", "1")]);
    let _cleanup = UnmountOnDrop(mnt.clone());
    // The user's server, as the user's `agentfs status --json` shows it.
    let record = || {
        let out = as_user(bin_s, &["status", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["mounts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["mount_point"] == mnt_s)
            .cloned()
            .unwrap_or_else(|| panic!("the user's server is not in its status: {v}"))
    };
    let count = |v: &serde_json::Value, k: &str| v["requests"][k].as_u64().unwrap_or(0);
    // The record's counters are published on a tick: read until two reads agree.
    let settled = || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut last = record();
        loop {
            std::thread::sleep(std::time::Duration::from_millis(1500));
            let now = record();
            if now["requests"] == last["requests"] && count(&now, "ring") > 0 {
                return now;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "counters never settled: {now}"
            );
            last = now;
        }
    };
    let fresh = record();
    let mem = |k: &str| fresh["memory"][k].as_u64().unwrap_or(0);
    assert!(
        mem("rss") > 0 && mem("rss") < mem("request_buffers"),
        "a fresh server's resident set is below its request buffers' size: {fresh}"
    );
    let exp = dir.path().join("expected");
    let exp_s = exp.to_str().unwrap();
    let big = format!("{mnt_s}/big");
    let out = as_user(
        "sh",
        &[
            "-c",
            &format!(
                "set -e; head -c 16777216 /dev/urandom > {exp_s}; cat {exp_s} > {big}; sync {big}"
            ),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = settled();
    assert_eq!(before["transport"], "io-uring", "{before}");
    // Drop the file's cached pages (only its owner may open it), so the read goes to the server.
    let out = as_user(
        "python3",
        &[
            "-c",
            "import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); \
             os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)",
            &big,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = as_user("cmp", &[exp_s, &big]);
    assert!(
        out.status.success(),
        "read back: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let after = settled();
    assert!(count(&after, "ring") > count(&before, "ring"), "{after}");
    let handed = count(&after, "worker") - count(&before, "worker");
    assert!(
        handed >= 8,
        "16 MiB read back, {handed} requests handed to workers"
    );
    assert!(as_user(bin_s, &["umount", mnt_s]).status.success());
    common::force_cleanup(&mnt);
    common::assert_consistent(&db);
}

/// `tar -x` and `rm -rf` of a tree on an ordinary user's mount: the caches answer most of the
/// unlinks and rmdirs before their statements run (the listings they keep follow every name
/// the unpacking made), and after the unmount the database holds nothing but its root.
#[test]
fn an_ordinary_users_unpacked_tree_is_removed_for_real() {
    let Some(UserScratch {
        db,
        mnt,
        _mode,
        dir,
    }) = user_scratch("an_ordinary_users_unpacked_tree_is_removed_for_real")
    else {
        return;
    };
    let bin = common::bin();
    let bin_s = bin.to_str().unwrap();
    let (db_s, mnt_s) = (db.to_str().unwrap(), mnt.to_str().unwrap());
    let tar = dir.path().join("tree.tar");
    let tar_s = tar.to_str().unwrap();
    user_mount(bin_s, db_s, mnt_s, &[]);
    let _cleanup = UnmountOnDrop(mnt.clone());
    let script = format!(
        "set -e; cd {mnt_s}; for d in a a/b a/b/c e; do mkdir -p src/$d; \
         for i in 1 2 3 4 5 6; do echo $d$i > src/$d/f$i; chmod 640 src/$d/f$i; done; done; \
         ln src/a/f1 src/e/link; tar -cf {tar_s} src; rm -rf src; \
         for n in 1 2 3; do mkdir x$n; tar -xf {tar_s} -C x$n; done; \
         test \"$(cat x2/src/a/b/f3)\" = a/b3; \
         rm -rf x1 x2 x3; ls -A"
    );
    let out = as_user("sh", &["-c", &script]);
    assert!(
        out.status.success(),
        "tar and rm -rf as the user: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "",
        "the mount is empty"
    );
    let out = as_user(bin_s, &["umount", mnt_s]);
    assert!(
        out.status.success(),
        "user umount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c = rusqlite::Connection::open(&db).unwrap();
    let count = |sql: &str| c.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(count("SELECT count(*) FROM fs_dentry"), 0, "no name left");
    assert_eq!(count("SELECT count(*) FROM fs_inode"), 1, "only the root");
    drop(c);
    common::assert_consistent(&db);
}
