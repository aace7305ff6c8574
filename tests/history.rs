//! History of a project's delta: snapshots, restore and undo compared through a real mount,
//! dedup, gc, SIGKILLed snapshots, and the refusals of a restore under a live sandbox.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use agentfs::history::object::{hash_of, hex, CommitKind};
use agentfs::history::{History, Ignore, SnapOptions};
use common::ops::snapshot;
use common::{bin, fuse_or_skip, Mounted};
use serde_json::Value;

/// A project `p` under a projects root of its own (`AGENTFS_PROJECTS_DIR`), whose delta is
/// `Mounted`'s database.
struct Project {
    m: Mounted,
    name: String,
    root: std::path::PathBuf,
}

impl Project {
    fn new(make_base: impl FnOnce(&Path)) -> Project {
        let mut m = Mounted::unmounted();
        let root = m.dir.path().join("projects");
        let base = m.dir.path().join("base");
        fs::create_dir(&base).unwrap();
        make_base(&base);
        let name = "p".to_string();
        let out = Command::new(bin())
            .args(["init", &name, "--source", s(&base)])
            .env("AGENTFS_PROJECTS_DIR", &root)
            .output()
            .expect("run agentfs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        m.db = root.join(&name).join("delta.db");
        Project { m, name, root }
    }

    fn dir(&self) -> std::path::PathBuf {
        self.root.join(&self.name)
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(bin())
            .args(args)
            .env("AGENTFS_PROJECTS_DIR", &self.root)
            .stdin(Stdio::null())
            .output()
            .expect("run agentfs")
    }

    /// `agentfs VERB NAME ARGS... --json`, which must succeed.
    fn json(&self, verb: &str, args: &[&str]) -> Value {
        let mut all = vec![verb, self.name.as_str()];
        all.extend_from_slice(args);
        all.push("--json");
        let out = self.run(&all);
        assert!(
            out.status.success(),
            "{all:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    }

    fn history(&self) -> History {
        History::open(&self.dir().join("store")).unwrap()
    }

    fn objects(&self, kind: i64) -> i64 {
        let c = rusqlite::Connection::open(self.dir().join("store/history.db")).unwrap();
        c.query_row(
            "SELECT count(*) FROM objects WHERE kind = ?1",
            [kind],
            |r| r.get(0),
        )
        .unwrap()
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8")
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) {
    let path = std::ffi::CString::new(s(p)).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: NUL-terminated strings and a buffer of value.len() bytes.
    let rc = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "setxattr {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

fn base_tree(b: &Path) {
    fs::write(b.join("a.txt"), "base a\n").unwrap();
    fs::write(b.join("gone.txt"), "deleted in the first state\n").unwrap();
    fs::create_dir(b.join("sub")).unwrap();
    fs::write(b.join("sub/b.txt"), "base b\n").unwrap();
    std::os::unix::fs::symlink("a.txt", b.join("link")).unwrap();
}

/// The tree through the mount without ignored build output.
fn view(mnt: &Path) -> std::collections::BTreeMap<PathBuf, common::ops::Node> {
    let mut t = snapshot(mnt);
    t.retain(|p, _| !p.starts_with("target"));
    t
}

#[test]
fn snap_change_restore_undo_cycles_match_the_mounted_tree() {
    if !fuse_or_skip("snap_change_restore_undo_cycles_match_the_mounted_tree") {
        return;
    }
    let mut p = Project::new(base_tree);
    let mnt = p.m.mnt.clone();

    // State one: a new file with an attribute and odd mode, a changed base file, a deleted
    // base file, a new directory and a new symlink.
    p.m.mount();
    fs::write(mnt.join("new.txt"), "one\n").unwrap();
    chmod(&mnt.join("new.txt"), 0o640);
    set_xattr(&mnt.join("new.txt"), "user.k", b"v1");
    fs::write(mnt.join("a.txt"), "changed a\n").unwrap();
    fs::remove_file(mnt.join("gone.txt")).unwrap();
    fs::create_dir(mnt.join("nd")).unwrap();
    fs::write(mnt.join("nd/deep.bin"), vec![7u8; 100_000]).unwrap();
    std::os::unix::fs::symlink("nd/deep.bin", mnt.join("ln2")).unwrap();
    let one = view(&mnt);
    p.m.unmount();
    let s1 = p.json("snap", &["one", "-m", "first state"]);
    assert_eq!(s1["whiteouts"], 1);

    // State two: edits on top, a base file under a directory deleted, build output that is
    // ignored.
    p.m.mount();
    fs::write(mnt.join("new.txt"), "two two\n").unwrap();
    set_xattr(&mnt.join("new.txt"), "user.k", b"v2");
    chmod(&mnt.join("a.txt"), 0o600);
    fs::remove_file(mnt.join("sub/b.txt")).unwrap();
    fs::remove_file(mnt.join("nd/deep.bin")).unwrap();
    fs::remove_dir(mnt.join("nd")).unwrap();
    fs::remove_file(mnt.join("link")).unwrap();
    fs::create_dir(mnt.join("target")).unwrap();
    fs::write(mnt.join("target/out.o"), "build output").unwrap();
    let two = view(&mnt);
    assert_ne!(one, two);
    p.m.unmount();
    let s2 = p.json("snap", &[]);
    assert!(s2["ignored"].as_u64().unwrap() >= 1, "{s2}");

    let diff = p.json("diff", &["one", "HEAD"]);
    let lines: BTreeSet<String> = diff
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            format!(
                "{} {}",
                c["change"].as_str().unwrap(),
                c["path"].as_str().unwrap()
            )
        })
        .collect();
    for want in [
        "M /new.txt",
        "M /a.txt",
        "D /nd",
        "D /nd/deep.bin",
        "D /sub/b.txt",
        "D /link",
    ] {
        assert!(lines.contains(want), "{want} missing from {lines:?}");
    }
    assert!(!lines.iter().any(|l| l.contains("target")), "{lines:?}");

    // restore one, undo (back to two), undo (back to one): each compared through the mount.
    let steps: [(&str, &[&str], &std::collections::BTreeMap<_, _>); 3] = [
        ("restore", &["one"], &one),
        ("undo", &[], &two),
        ("undo", &[], &one),
    ];
    for (verb, args, want) in steps {
        let r = p.json(verb, args);
        assert!(r["saved"].is_null(), "{verb}: nothing unsaved, yet {r}");
        common::assert_consistent(&p.m.db);
        p.m.mount();
        assert_eq!(&view(&mnt), want, "after {verb} {args:?}");
        // Ignored output survives a restore.
        assert_eq!(fs::read(mnt.join("target/out.o")).unwrap(), b"build output");
        p.m.unmount();
    }

    // A snapshot right after a restore reads no file again and finds the restored state.
    let again = p.json("snap", &["-m", "after"]);
    assert_eq!(again["files_hashed"], 0, "{again}");
    assert_eq!(again["tree"], s1["tree"]);

    // The log shows every commit, newest first; nothing was lost.
    let log = p.json("log", &[]);
    let kinds: Vec<&str> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["manual", "restore", "restore", "restore", "manual", "manual"]
    );
    assert_eq!(log[5]["tags"][0], "one");
    assert_eq!(log[0]["head"], true);
    let list = p.json("list", &[]);
    assert_eq!(list.as_array().unwrap().len(), 6);
    let gc = p.json("gc", &["--dry-run"]);
    assert_eq!(gc["count"], 0, "{gc}");
    assert_eq!(
        p.json("gc", &["--check"])["findings"],
        serde_json::json!([])
    );

    // Unsaved changes are saved before a restore, and undo takes them back.
    p.m.mount();
    fs::write(mnt.join("unsaved.txt"), "work in progress").unwrap();
    p.m.unmount();
    let r = p.json("undo", &[]);
    assert!(r["saved"].is_string(), "{r}");
    p.m.mount();
    assert_eq!(view(&mnt), one);
    p.m.unmount();
    let r = p.json("undo", &[]);
    assert!(r["saved"].is_null());
    p.m.mount();
    assert_eq!(
        fs::read(mnt.join("unsaved.txt")).unwrap(),
        b"work in progress"
    );
    p.m.unmount();
}

#[test]
fn hard_links_come_back_as_one_file_with_its_names() {
    if !fuse_or_skip("hard_links_come_back_as_one_file_with_its_names") {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let mut p = Project::new(base_tree);
    let mnt = p.m.mnt.clone();
    p.m.mount();
    fs::write(mnt.join("z.txt"), "shared\n").unwrap();
    fs::hard_link(mnt.join("z.txt"), mnt.join("sub/a.txt")).unwrap();
    fs::hard_link(mnt.join("z.txt"), mnt.join("b.txt")).unwrap();
    p.m.unmount();
    p.json("snap", &["linked"]);
    // Break the links: one name goes, another gets contents of its own.
    p.m.mount();
    fs::remove_file(mnt.join("b.txt")).unwrap();
    fs::remove_file(mnt.join("sub/a.txt")).unwrap();
    fs::write(mnt.join("sub/a.txt"), "apart\n").unwrap();
    p.m.unmount();
    p.json("snap", &[]);
    p.json("restore", &["linked"]);
    common::assert_consistent(&p.m.db);
    p.m.mount();
    let names = ["z.txt", "sub/a.txt", "b.txt"];
    let st: Vec<fs::Metadata> = names
        .iter()
        .map(|n| fs::metadata(mnt.join(n)).unwrap())
        .collect();
    for (n, m) in names.iter().zip(&st) {
        assert_eq!(m.ino(), st[0].ino(), "{n} is another file");
        assert_eq!(m.nlink(), 3, "{n}");
        assert_eq!(fs::read(mnt.join(n)).unwrap(), b"shared\n", "{n}");
    }
    // One file: a write through one name is read through the others.
    fs::write(mnt.join("b.txt"), "written through b\n").unwrap();
    assert_eq!(
        fs::read(mnt.join("sub/a.txt")).unwrap(),
        b"written through b\n"
    );
    p.m.unmount();
    // The restored state snapshots as the state it came from.
    p.json("restore", &["linked"]);
    let again = p.json("snap", &[]);
    let linked = p.json("log", &[]);
    let tagged = linked
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["tags"][0] == "linked")
        .unwrap();
    assert_eq!(again["tree"], tagged["tree"], "{again} {tagged}");
    assert_eq!(
        p.json("gc", &["--check"])["findings"],
        serde_json::json!([])
    );
}

#[test]
fn two_snapshots_sharing_1000_files_store_them_once() {
    if !fuse_or_skip("two_snapshots_sharing_1000_files_store_them_once") {
        return;
    }
    let mut p = Project::new(|_| {});
    let mnt = p.m.mnt.clone();
    p.m.mount();
    fs::create_dir(mnt.join("d")).unwrap();
    for i in 0..1000 {
        fs::write(mnt.join(format!("d/f{i}")), format!("file {i}\n")).unwrap();
    }
    fs::write(mnt.join("x"), "x1").unwrap();
    p.m.unmount();
    let first = p.json("snap", &[]);
    assert_eq!(first["files_hashed"], 1001);
    let blobs = p.objects(1);
    assert_eq!(blobs, 1001);

    p.m.mount();
    fs::write(mnt.join("x"), "x2").unwrap();
    p.m.unmount();
    let second = p.json("snap", &[]);
    // Only the changed file is read; one new blob, the root tree and the commit are added.
    assert_eq!(second["files_hashed"], 1, "{second}");
    assert_eq!(second["files_cached"], 1000, "{second}");
    assert_eq!(p.objects(1), blobs + 1);
    assert_eq!(second["objects_added"], 3, "{second}");
    assert_eq!(
        p.objects(2),
        3,
        "root trees of two states and one shared d/"
    );
}

#[test]
fn gc_deletes_exactly_the_unreachable_objects_and_dry_run_lists_them() {
    let p = Project::new(|b| fs::write(b.join("base.txt"), "b").unwrap());
    let db = p.m.db.clone();
    let put = |path: &str, data: &str| {
        let mut c = Command::new(bin())
            .args(["fs", s(&db), "write", path])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        c.stdin.take().unwrap().write_all(data.as_bytes()).unwrap();
        assert!(c.wait().unwrap().success());
    };
    let ignore = Ignore::none();
    let mut h = p.history();
    put("/shared.txt", "shared");
    put("/t.txt", "tagged");
    let tagged = h
        .snapshot(
            &db,
            &SnapOptions {
                tag: Some("t1"),
                ..SnapOptions::manual("", &ignore)
            },
        )
        .unwrap();
    put("/t.txt", "head");
    let head = h.snapshot(&db, &SnapOptions::manual("", &ignore)).unwrap();
    // Two detached commits: one with a file nothing else has, one sharing HEAD's files.
    let shared_only = h
        .snapshot(
            &db,
            &SnapOptions {
                detached: true,
                ..SnapOptions::manual("d1", &ignore)
            },
        )
        .unwrap();
    put("/only-detached.txt", "unique bytes");
    let detached = h
        .snapshot(
            &db,
            &SnapOptions {
                detached: true,
                ..SnapOptions::manual("d2", &ignore)
            },
        )
        .unwrap();
    assert_eq!(h.head().unwrap(), head.commit);

    let mut want: BTreeSet<String> = BTreeSet::new();
    want.insert(hex(&shared_only.commit.unwrap()));
    want.insert(hex(&detached.commit.unwrap()));
    want.insert(hex(&detached.tree));
    want.insert(hex(&hash_of(b"unique bytes")));
    assert_eq!(
        shared_only.tree, head.tree,
        "same state as HEAD: its tree stays"
    );

    let listed = |v: &Value| -> BTreeSet<String> {
        v["objects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["hash"].as_str().unwrap().to_string())
            .collect()
    };
    let dry = p.json("gc", &["--dry-run"]);
    assert_eq!(listed(&dry), want);
    assert_eq!(
        p.json("gc", &["--dry-run"]),
        dry,
        "a dry run changes nothing"
    );
    let real = p.json("gc", &[]);
    assert_eq!(listed(&real), want);
    assert_eq!(real["bytes"], dry["bytes"]);
    assert_eq!(real["dangling"], serde_json::json!([]));
    assert_eq!(p.json("gc", &["--dry-run"])["count"], 0);
    assert!(h.check().unwrap().is_empty());
    // Everything a tag or HEAD reaches is still whole.
    assert_eq!(h.resolve("t1").unwrap(), tagged.commit.unwrap());
    let r = h.restore(&db, "t1", &ignore).unwrap();
    assert_eq!(r.target, tagged.commit.unwrap());
    let out = p.run(&["fs", s(&db), "cat", "/t.txt"]);
    assert_eq!(out.stdout, b"tagged");
    assert!(
        p.run(&["fs", s(&db), "cat", "/only-detached.txt"])
            .status
            .code()
            != Some(0)
    );
    assert_eq!(h.log().unwrap()[0].commit.kind, CommitKind::Restore);
}

#[test]
fn sigkilled_snapshots_leave_a_sound_store() {
    if !fuse_or_skip("sigkilled_snapshots_leave_a_sound_store") {
        return;
    }
    let mut p = Project::new(|_| {});
    let mnt = p.m.mnt.clone();
    // Snapshots are taken while the delta is mounted (a read-only cut beside the server).
    p.m.mount();
    fs::create_dir(mnt.join("w")).unwrap();
    let write_round = |round: u64| {
        for i in 0..300 {
            let data = format!("round {round} file {i} {}", "x".repeat(3000));
            fs::write(mnt.join(format!("w/f{i}")), data).unwrap();
        }
        let f = fs::File::open(mnt.join("w")).unwrap();
        nix_syncfs(&f);
    };
    write_round(0);
    let t = Instant::now();
    let full = p.run(&["snap", &p.name]);
    assert!(full.status.success());
    let span = t.elapsed().as_micros().max(1000) as u64;
    let mut seed = std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15;
    let mut killed = 0;
    for round in 1..=20 {
        write_round(round);
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let delay = (seed >> 33) % (span + span / 4);
        let mut child = Command::new(bin())
            .args(["snap", &p.name])
            .env("AGENTFS_PROJECTS_DIR", &p.root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(delay));
        if child.try_wait().unwrap().is_none() {
            killed += 1;
        }
        let _ = child.kill();
        let _ = child.wait();
        let check = p.json("gc", &["--check"]);
        assert_eq!(check["findings"], serde_json::json!([]), "round {round}");
        let dry = p.json("gc", &["--dry-run"]);
        assert_eq!(dry["dangling"], serde_json::json!([]), "round {round}");
        let log = p.json("log", &[]);
        assert!(!log.as_array().unwrap().is_empty());
    }
    eprintln!("sigkilled {killed} of 20 snapshots while running");
    // The store still takes snapshots, and the last one is whole.
    let last = p.json("snap", &["final"]);
    assert!(last["commit"].is_string());
    p.m.unmount();
}

fn nix_syncfs(f: &fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor owned by `f`.
    assert_eq!(unsafe { libc::syncfs(f.as_raw_fd()) }, 0);
}

#[test]
fn restore_refuses_while_a_sandbox_or_a_server_holds_the_delta() {
    if !fuse_or_skip("restore_refuses_while_a_sandbox_or_a_server_holds_the_delta") {
        return;
    }
    let mut p = Project::new(|_| {});
    p.json("snap", &["t"]);
    let live = p.dir().join("live.json");
    // Refused with one named line and exit 4 (a conflict with the present state), and nothing changed: the same history.
    let before = p.json("log", &[]);
    let one_line = |out: &Output| {
        assert_eq!(out.status.code(), Some(4));
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("agentfs: sandbox_live: "), "{err}");
        assert!(out.stdout.is_empty());
    };
    let marker = |sup: u32, pid1: u32, started: u64| {
        format!(
            "{{\"supervisor\": {sup}, \"pid1\": {pid1}, \"server\": {sup}, \"started\": {started}, \"source\": \"/\"}}"
        )
    };
    // A marker whose processes run, as a sandbox's do: this test as the supervisor and, as
    // pid 1, the first process of a pid namespace of its own, both started before the marker.
    let mut init = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "sleep", "1000"])
        .spawn()
        .unwrap();
    let children = format!("/proc/{0}/task/{0}/children", init.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid1: u32 = loop {
        let text = fs::read_to_string(&children).unwrap_or_default();
        if let Some(pid) = text.split_whitespace().next() {
            break pid.parse().unwrap();
        }
        assert!(Instant::now() < deadline, "unshare started no child");
        std::thread::sleep(Duration::from_millis(10));
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    fs::write(&live, marker(std::process::id(), pid1, now + 1)).unwrap();
    one_line(&p.run(&["restore", &p.name, "t"]));
    one_line(&p.run(&["undo", &p.name]));
    assert_eq!(p.json("log", &[]), before);
    let _ = init.kill();
    let _ = init.wait();
    // A live.json left by a sandbox that is gone does not block.
    fs::write(&live, marker(999_999_999, 999_999_999, now)).unwrap();
    assert!(p.run(&["restore", &p.name, "t"]).status.success());
    fs::remove_file(&live).unwrap();
    p.m.mount();
    let before = p.json("log", &[]);
    one_line(&p.run(&["restore", &p.name, "t"]));
    one_line(&p.run(&["undo", &p.name]));
    assert_eq!(p.json("log", &[]), before);
    // Snapshots, logs and diffs work while mounted.
    p.json("snap", &[]);
    p.json("diff", &["t", "HEAD"]);
    p.m.unmount();
    // Bad input: one named line each.
    for (args, needle) in [
        (vec!["restore", p.name.as_str(), "nope"], "unknown_ref"),
        (vec!["snap", p.name.as_str(), "t"], "tag_exists"),
        (vec!["snap", p.name.as_str(), "HEAD"], "bad_tag"),
        (vec!["snap", "no-such-project-here"], "no_project"),
    ] {
        let out = p.run(&args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(needle) && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
    // The delta-against-base diff keeps its one-argument form.
    assert!(p.run(&["diff", s(&p.m.db)]).status.success());
    assert!(!p.run(&["diff", s(&p.m.db), "t"]).status.success());
}

/// The kernel's writeback cache stamps times from a clock that moves once per tick, so a
/// rewrite of the same size just after a snapshot can leave size, mtime and ctime as they
/// were. A file whose times are not older than the snapshot is not trusted by the next one.
#[test]
fn a_rewrite_that_leaves_the_times_as_they_were_is_read_again() {
    use agentfs::store::{Caller, InitOptions, Ino, SetAttr, Store, TimeSet, Timespec};
    let dir = tempfile::tempdir_in(common::scratch_root()).unwrap();
    let db = dir.path().join("delta.db");
    Store::create(&db, &InitOptions::default()).unwrap();
    let store = Store::open(&db, false).unwrap();
    // As under the writeback cache: WRITE leaves the times to the kernel.
    store.set_kernel_owns_write_times(true);
    let caller = Caller { uid: 0, gid: 0 };
    let ino = store
        .mknod(Ino::ROOT, b"f", libc::S_IFREG | 0o644, 0, caller)
        .unwrap()
        .ino;
    store.write(ino, 0, b"one").unwrap();
    // Stamped at the snapshot's own instant at the latest: here, deterministically, later.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let later = Timespec {
        sec: now.as_secs() as i64 + 3600,
        nsec: 0,
    };
    let set = SetAttr {
        mtime: Some(TimeSet::At(later)),
        ctime: Some(later),
        ..SetAttr::default()
    };
    store.setattr(ino, &set).unwrap();
    store.sync().unwrap();
    let ignore = Ignore::default();
    let mut h = History::open(&dir.path().join("store")).unwrap();
    let first = h
        .snapshot(&db, &SnapOptions::manual("one", &ignore))
        .unwrap();
    store.write(ino, 0, b"two").unwrap();
    store.sync().unwrap();
    let attr = store.getattr(ino).unwrap();
    assert_eq!((attr.mtime, attr.ctime), (later, later), "the times stayed");
    let second = h
        .snapshot(&db, &SnapOptions::manual("two", &ignore))
        .unwrap();
    assert_eq!(second.files_hashed, 1, "the file was read again");
    assert_ne!(first.tree, second.tree, "the new bytes are recorded");
}
