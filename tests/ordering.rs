//! Commit order: the database after a crash holds a state the operations passed through. The
//! server is killed (SIGKILL) at random points of editor-style saves (write a temporary, close,
//! rename over the original), in-place rewrites (open with O_TRUNC, write, close) and `git
//! commit`s; after each crash every file holds one whole version, never an empty or partial
//! one, and `git fsck` finds nothing missing.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::ops::Rng;
use common::{assert_consistent, fuse_or_skip, Mounted};

/// Files saved through a temporary and a rename.
const SAVED: usize = 6;
/// Files rewritten in place (truncated to zero, then written).
const REWRITTEN: usize = 3;

/// Version `v` of file `name`: a header naming both, repeated to a length that depends on
/// them, so any content can be checked on its own (a cut-off or empty file does not parse).
fn version(name: &str, v: u64) -> Vec<u8> {
    let line = format!("{name} version {v}\n");
    let reps = 1 + (v * 7919 + name.len() as u64 * 131) % 2500;
    line.repeat(reps as usize).into_bytes()
}

/// Whether `got` is one whole version of `name`.
fn is_whole_version(name: &str, got: &[u8]) -> bool {
    let text = String::from_utf8_lossy(got);
    let Some(first) = text.lines().next() else {
        return false;
    };
    let Some(v) = first
        .strip_prefix(&format!("{name} version "))
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return false;
    };
    version(name, v) == got
}

fn git(repo: &Path, args: &[&str]) -> std::io::Result<std::process::Output> {
    Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["-c", "core.fsync=none", "-c", "gc.auto=0"])
        .args(args)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.org")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.org")
        .stdin(Stdio::null())
        .output()
}

fn git_ok(repo: &Path, args: &[&str]) -> bool {
    git(repo, args).is_ok_and(|o| o.status.success())
}

fn saved(i: usize) -> String {
    format!("saved-{i}")
}

fn rewritten(i: usize) -> String {
    format!("rewritten-{i}")
}

/// One save of every file and one commit, with versions from `v`; stops at the first error
/// (the server is gone).
fn one_pass(root: &Path, repo: &Path, v: u64) -> std::io::Result<()> {
    for i in 0..SAVED {
        let name = saved(i);
        let tmp = root.join(format!(".{name}.tmp"));
        fs::write(&tmp, version(&name, v))?;
        fs::rename(&tmp, root.join(&name))?;
    }
    for i in 0..REWRITTEN {
        let name = rewritten(i);
        fs::write(root.join(&name), version(&name, v))?;
    }
    fs::write(repo.join("tracked"), version("tracked", v))?;
    let add = git(repo, &["add", "-A"])?;
    let commit = git(repo, &["commit", "-q", "-m", &format!("version {v}")])?;
    if !add.status.success() || !commit.status.success() {
        return Err(std::io::Error::other("git failed"));
    }
    Ok(())
}

/// Every saved and rewritten file is one whole version, and the repository is intact.
fn check(root: &Path, repo: &Path, round: usize, seed: u64) {
    let names = (0..SAVED).map(saved).chain((0..REWRITTEN).map(rewritten));
    for name in names.chain(["repo/tracked".to_string()]) {
        let got = fs::read(root.join(&name)).unwrap_or_default();
        let base = name.rsplit('/').next().unwrap_or(&name);
        assert!(
            is_whole_version(base, &got),
            "round {round} (seed {seed}): {name} is not a whole version ({} bytes: {:?})",
            got.len(),
            String::from_utf8_lossy(&got[..got.len().min(40)])
        );
    }
    // A killed git leaves its lock files behind; a user removes them.
    for lock in ["index.lock", "HEAD.lock", "refs/heads/main.lock"] {
        let _ = fs::remove_file(repo.join(".git").join(lock));
    }
    let fsck = git(repo, &["fsck", "--full", "--no-dangling"]).expect("run git fsck");
    assert!(
        fsck.status.success() && fsck.stderr.is_empty() && fsck.stdout.is_empty(),
        "round {round} (seed {seed}): git fsck:\n{}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
}

/// 20 rounds of: saves and commits in a loop, SIGKILL of the server after a random delay,
/// remount, check. The group-commit window is far longer than the test and every namespace
/// operation commits at once, so an operation committed ahead of the data it depends on
/// shows up as an empty or stale file in the first rounds.
#[test]
fn saves_and_git_commits_survive_kill_9_in_order() {
    if !fuse_or_skip("saves_and_git_commits_survive_kill_9_in_order") {
        return;
    }
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut rng = Rng(seed);
    let mut m = Mounted::with_env(&[
        ("AGENTFS_BATCH_WINDOW_MS", "600000"),
        ("AGENTFS_BATCH_NAMESPACE_OPS", "1"),
    ]);
    // Everything lives below a directory of the mount, so a worker still running when the
    // mount is gone fails instead of writing into the empty mount point.
    let root: PathBuf = m.path("w");
    let repo = root.join("repo");
    fs::create_dir_all(&repo).unwrap();
    assert!(git_ok(&repo, &["init", "-q", "-b", "main"]), "git init");
    one_pass(&root, &repo, 0).expect("first pass");
    m.unmount();
    m.mount();
    let started = Instant::now();
    let mut next = 1u64;
    for round in 0..20 {
        let stop = Arc::new(AtomicBool::new(false));
        let worker = {
            let (root, repo, stop) = (root.clone(), repo.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut v = next;
                while !stop.load(Ordering::Relaxed) && one_pass(&root, &repo, v).is_ok() {
                    v += 1;
                }
                v
            })
        };
        std::thread::sleep(Duration::from_millis(30 + rng.below(700)));
        m.crash();
        stop.store(true, Ordering::Relaxed);
        next = worker.join().expect("worker") + 1;
        // (A crash may leave orphans, files the kernel still held: the mount reaps them.)
        m.mount();
        check(&root, &repo, round, seed);
    }
    m.unmount();
    assert_consistent(&m.db);
    eprintln!(
        "20 rounds, {next} versions, {:.1} s (seed {seed})",
        started.elapsed().as_secs_f64()
    );
}
