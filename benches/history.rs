//! History costs on a delta of 10,000 changed files, beside git on the same tree.
//!
//! Measures, once each (these are minutes-scale end-to-end operations, not micro-benchmarks):
//! a cold snapshot of the delta, a snapshot after 10 more changes, the same after the file
//! cache is emptied (what the cache saves), and a restore of the 10,000-file state; then
//! `git add -A && git commit` of the same tree cold and after the same 10 changes.
//!
//! Then the freeze time of automatic checkpoints: a sandbox (`agentfs run`) copies 10,000
//! files into its project and asks for checkpoints with `agentfs checkpoint` (first, nothing
//! changed, one file changed); each reports how long its sandbox stayed frozen (from the
//! write that froze the cgroup to the write that thawed it), beside the supervisor's resident
//! set (server and watcher) after it. Needs root and /dev/fuse; skipped otherwise.
//!
//! Run: `cargo bench --bench history`. Prints one line per step: time and bytes added.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use agentfs::history::{History, Ignore, SnapOptions};
use agentfs::store::{Caller, InitOptions, Ino, Store};

const CALLER: Caller = Caller { uid: 0, gid: 0 };
const DIRS: usize = 100;
const PER_DIR: usize = 100;
const CHANGED: usize = 10;

fn content(i: usize, round: usize) -> Vec<u8> {
    let line = format!("file {i} round {round}: some source text that varies per file\n");
    line.repeat(20 + i % 60).into_bytes()
}

fn dir_size(p: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(p).expect("read_dir").flatten() {
        let m = e.metadata().expect("metadata");
        n += if m.is_dir() {
            dir_size(&e.path())
        } else {
            m.len()
        };
    }
    n
}

fn report(what: &str, d: Duration, bytes: i64, extra: &str) {
    println!(
        "{what:<44} {:>9.1} ms {:>12} bytes added  {extra}",
        d.as_secs_f64() * 1000.0,
        bytes
    );
}

fn git(tree: &Path, args: &[&str]) -> bool {
    Command::new("git")
        .args(["-C", tree.to_str().expect("utf8")])
        .args(args)
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@example.invalid")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@example.invalid")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn main() {
    // `cargo bench` passes --bench; nothing else is understood.
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(&tree).expect("tree");
    let db = dir.path().join("delta.db");
    let opts = InitOptions::default();
    Store::create(&db, &opts).expect("create");

    // The delta (a plain database: a snapshot reads an overlay's upper layer the same way):
    // 10,000 new files in 100 directories, and the same tree on disk for git.
    let t = Instant::now();
    let mut inos: Vec<Ino> = Vec::new();
    {
        let store = Store::open(&db, false).expect("open");
        for d in 0..DIRS {
            let name = format!("d{d}");
            let dino = store
                .mkdir(Ino::ROOT, name.as_bytes(), 0o755, CALLER)
                .expect("mkdir")
                .ino;
            std::fs::create_dir(tree.join(&name)).expect("mkdir");
            for f in 0..PER_DIR {
                let i = d * PER_DIR + f;
                let fname = format!("f{f}.txt");
                let ino = store
                    .mknod(dino, fname.as_bytes(), libc::S_IFREG | 0o644, 0, CALLER)
                    .expect("mknod")
                    .ino;
                let data = content(i, 0);
                store.write(ino, 0, &data).expect("write");
                std::fs::write(tree.join(&name).join(&fname), &data).expect("write");
                inos.push(ino);
            }
        }
        store.sync().expect("sync");
    }
    println!(
        "made a delta of {} files ({} bytes of content) in {:.1} s",
        inos.len(),
        dir_size(&tree),
        t.elapsed().as_secs_f64()
    );

    let ignore = Ignore::default();
    let mut h = History::open(&dir.path().join("store")).expect("history");
    let usage = |h: &mut History| h.usage().expect("usage").1 as i64;

    let before = usage(&mut h);
    let t = Instant::now();
    let cold = h
        .snapshot(&db, &SnapOptions::manual("cold", &ignore))
        .expect("snap");
    report(
        "snapshot, 10,000 changed files (cold)",
        t.elapsed(),
        usage(&mut h) - before,
        &format!("{} files read", cold.files_hashed),
    );

    let change = |round: usize| {
        let store = Store::open(&db, false).expect("open");
        for (k, ino) in inos.iter().take(CHANGED).enumerate() {
            let data = content(k, round);
            store.write(*ino, 0, &data).expect("write");
            let path = tree
                .join(format!("d{}", k / PER_DIR))
                .join(format!("f{}.txt", k % PER_DIR));
            std::fs::write(path, &data).expect("write");
        }
        store.sync().expect("sync");
    };

    change(1);
    let before = usage(&mut h);
    let t = Instant::now();
    let inc = h
        .snapshot(&db, &SnapOptions::manual("10 more", &ignore))
        .expect("snap");
    report(
        "snapshot after 10 more changes",
        t.elapsed(),
        usage(&mut h) - before,
        &format!(
            "{} files read, {} unchanged",
            inc.files_hashed, inc.files_cached
        ),
    );

    // The same step without the file cache: every file is read and hashed again.
    change(2);
    {
        let c = rusqlite::Connection::open(h.db_path()).expect("open history");
        c.execute("DELETE FROM file_cache", [])
            .expect("clear cache");
    }
    let before = usage(&mut h);
    let t = Instant::now();
    let nocache = h
        .snapshot(&db, &SnapOptions::manual("no cache", &ignore))
        .expect("snap");
    report(
        "snapshot after 10 changes, file cache emptied",
        t.elapsed(),
        usage(&mut h) - before,
        &format!("{} files read", nocache.files_hashed),
    );

    let target = hex(&cold.commit.expect("commit"));
    let t = Instant::now();
    let r = h.restore(&db, &target, &ignore).expect("restore");
    report(
        "restore of the 10,000-file state",
        t.elapsed(),
        0,
        &format!("{} files written", r.files),
    );

    if !git(&tree, &["init", "-q"]) {
        println!("git not available: no comparison");
        return;
    }
    let git_size = |tree: &Path| dir_size(&tree.join(".git")) as i64;
    let before = git_size(&tree);
    let t = Instant::now();
    assert!(git(&tree, &["add", "-A"]) && git(&tree, &["commit", "-qm", "cold"]));
    report(
        "git add -A && git commit (cold)",
        t.elapsed(),
        git_size(&tree) - before,
        "",
    );
    for (k, _) in inos.iter().take(CHANGED).enumerate() {
        let path = tree
            .join(format!("d{}", k / PER_DIR))
            .join(format!("f{}.txt", k % PER_DIR));
        std::fs::write(path, content(k, 3)).expect("write");
    }
    let before = git_size(&tree);
    let t = Instant::now();
    assert!(git(&tree, &["add", "-A"]) && git(&tree, &["commit", "-qm", "10 more"]));
    report(
        "git add -A && git commit after 10 changes",
        t.elapsed(),
        git_size(&tree) - before,
        "",
    );
    freeze(dir.path(), &tree);
}

/// A figure (kB) of `pid`'s /proc status, 0 when it is gone.
fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            let l = t.lines().find(|l| l.starts_with(key))?;
            l.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Freeze time of checkpoints of a sandbox whose delta holds the 10,000 files of `tree`.
fn freeze(scratch: &Path, tree: &Path) {
    use std::io::Write as _;
    if !agentfs::sys::ids::is_root() || !Path::new("/dev/fuse").exists() {
        println!("freeze time: needs root and /dev/fuse, skipped");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_agentfs");
    let home = scratch.join("home");
    std::fs::create_dir_all(&home).expect("home");
    let agentfs = |args: &[&str]| {
        let mut c = Command::new(bin);
        c.args(args)
            .env("HOME", &home)
            .env_remove("AGENTFS_PROJECTS_DIR")
            .env("AGENTFS_CHECKPOINT_IDLE_MS", "0");
        c
    };
    let src = tree.to_str().expect("utf8");
    let made = agentfs(&["init", "freeze", "--source", src])
        .stdout(std::process::Stdio::null())
        .status();
    assert!(matches!(made, Ok(s) if s.success()), "agentfs init");
    // `tree` is the project's base; the copy makes 10,000 changed files in its delta.
    let inside = "/tmp/agentfs";
    let script = format!(
        "cd {src} && mkdir copy && cp -r d* copy/ && {inside} checkpoint --json && \
         {inside} checkpoint --json && echo more >> copy/d0/f0.txt && \
         {inside} checkpoint --json && read _"
    );
    let bind = format!("{bin}:{inside}");
    let mut child = agentfs(&[
        "run",
        "freeze",
        "--ro-bind",
        &bind,
        "--",
        "sh",
        "-c",
        &script,
    ])
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .spawn()
    .expect("agentfs run");
    let supervisor = child.id();
    let out = child.stdout.take().expect("stdout");
    let steps = [
        "checkpoint freeze, 10,000 new files (first)",
        "checkpoint freeze, nothing changed",
        "checkpoint freeze, one file changed",
    ];
    // Each `checkpoint --json` prints one JSON object (over several lines).
    let mut replies = serde_json::Deserializer::from_reader(out).into_iter::<serde_json::Value>();
    for step in steps {
        let Some(Ok(v)) = replies.next() else {
            println!("{step}: the sandbox ended early");
            break;
        };
        let ms = v["frozen_ms"].as_f64();
        let rss = status_kib(supervisor, "VmRSS:") as f64 / 1024.0;
        let hwm = status_kib(supervisor, "VmHWM:") as f64 / 1024.0;
        match ms {
            Some(ms) => println!(
                "{step:<44} {ms:>9.1} ms frozen  supervisor RSS {rss:.1} MiB (peak {hwm:.1})"
            ),
            None => println!("{step:<44} not frozen (no cgroup)  supervisor RSS {rss:.1} MiB"),
        }
    }
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"\n");
    }
    let status = child.wait().expect("wait");
    assert!(status.success(), "agentfs run: {status}");
}

fn hex(h: &[u8; 32]) -> String {
    agentfs::history::object::hex(h)
}
