//! The verbs through a real sandbox launch: statuses, the prompt, the environment, writes that
//! land in the delta only, the policy's read-only remainder, masks.

mod common;

use std::fs;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::world::{err, launched, user_can_run, World, USER};

/// The launch itself did not fail (whatever the command's status).
fn started(o: &Output) {
    assert!(
        !err(o).contains("agentfs: ") || o.status.code() != Some(125),
        "the launch failed: {}",
        err(o)
    );
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Every mount line of the host that mentions `path`.
fn host_mounts_of(path: &Path) -> Vec<String> {
    let needle = path.to_string_lossy().into_owned();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&needle))
        .map(str::to_string)
        .collect()
}

fn exit_statuses(w: &World) {
    let src = w.source("proj");
    let src_s = src.to_str().unwrap();
    let first = w.af(&["quick", src_s, "--", "true"]);
    started(&first);
    assert_eq!(first.status.code(), Some(0), "{}", err(&first));
    for (script, want) in [
        ("exit 0", 0),
        ("exit 3", 3),
        ("kill -INT $$", 130),
        ("kill -KILL $$", 137),
        ("sleep 1000 & exit 4", 4),
    ] {
        let o = w.af(&["run", "proj", "--", "sh", "-c", script]);
        assert_eq!(o.status.code(), Some(want), "{script}: {}", err(&o));
    }
    let o = w.af(&["exec", "proj", "--", "sh", "-c", "exit 5"]);
    assert_eq!(o.status.code(), Some(5), "{}", err(&o));
    // The suite's backend (AGENTFS_MOUNT_BACKEND) reached the launches, as root and as the user.
    let o = w.af(&["status", "proj", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["projects"][0]["backend"], common::backend(), "{v}");
    assert_eq!(
        v["projects"][0]["last_run"]["backend"],
        common::backend(),
        "{v}"
    );
    assert!(
        host_mounts_of(&src).is_empty(),
        "{:?}",
        host_mounts_of(&src)
    );
}

#[test]
fn exit_statuses_propagate_and_nothing_stays_mounted() {
    exit_statuses(&World::new(None));
}

#[test]
fn exit_statuses_as_an_ordinary_user() {
    let test = "exit_statuses_as_an_ordinary_user";
    if user_can_run(test) {
        exit_statuses(&World::new(Some(USER)));
    }
}

#[test]
fn writes_land_in_the_delta_and_the_host_tree_is_untouched() {
    let w = World::new(None);
    let src = w.source("app");
    fs::create_dir(src.join("sub")).unwrap();
    let before = common::tree_listing(&src);
    let script = "echo new > new.txt && rm README && echo x >> sub/f && cat new.txt && pwd";
    let o = w.af(&["quick", src.to_str().unwrap(), "--", "sh", "-c", script]);
    started(&o);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(stdout(&o), format!("new\n{}\n", src.display()));
    assert_eq!(common::tree_listing(&src), before, "the host tree changed");
    // By its database: the name `app` is also the source directory in the world's cwd.
    let db = w.root().join("app/delta.db");
    let d = w.af(&["diff", db.to_str().unwrap(), "--name-only"]);
    let mut names: Vec<String> = stdout(&d).lines().map(str::to_string).collect();
    names.sort();
    assert_eq!(names, vec!["/README", "/new.txt", "/sub/f"]);
    // A second run sees the first one's work.
    let o = w.af(&[
        "run",
        "app",
        "--",
        "sh",
        "-c",
        "cat new.txt; test ! -e README",
    ]);
    assert_eq!(stdout(&o), "new\n", "{}", err(&o));
    let i = w.af(&["integrity", db.to_str().unwrap()]);
    assert!(i.status.success(), "{}", err(&i));
}

#[test]
fn the_shell_prompt_is_prefixed() {
    let w = World::new(None);
    let src = w.source("shellproj");
    fs::write(w.home.join(".bashrc"), "PS1='mine$ '\n").unwrap();
    let mut c = w.command(
        &common::bin(),
        &["quick", src.to_str().unwrap(), "--home", "full-ro"],
    );
    let mut child = c
        .env("SHELL", "/bin/bash")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let _ = input.write_all(b"echo \"P=$PS1 S=$AGENTFS_SANDBOX\"\nexit 7\n");
    drop(input);
    let o = child.wait_with_output().unwrap();
    started(&o);
    assert!(
        stdout(&o).contains("P=[shellproj] mine$  S=shellproj"),
        "{}{}",
        stdout(&o),
        err(&o)
    );
    assert_eq!(o.status.code(), Some(7));
}

/// Drives `agentfs run` on a pseudo-terminal: argv[1:] is the command, the environment passes
/// through. Each step writes input and waits for a marker in the output (markers are printed
/// by `echo A""B` so the echoed input never matches). Prints the shell's exit status.
const PTY_DRIVER: &str = r#"
import os, pty, select, signal, struct, sys, termios, fcntl, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
seen = b""
def expect_all(markers, timeout=20):
    global seen
    end = time.time() + timeout
    while not all(m.encode() in seen for m in markers):
        left = end - time.time()
        if left <= 0:
            sys.exit("timed out waiting for %r; output so far:\n%s" % (markers, seen.decode(errors="replace")))
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                sys.exit("the terminal closed waiting for %r; output:\n%s" % (markers, seen.decode(errors="replace")))
            seen += chunk
    seen = seen[max(seen.index(m.encode()) + len(m) for m in markers):]
def expect(marker, timeout=20):
    expect_all([marker], timeout)
def say(line):
    os.write(fd, line.encode())
say("trap 'echo WIN''CH-GOT' WINCH; echo RE""ADY\n")
expect("READY")
# Job control: a background job is listed and killed by its job number.
say("sleep 100 & echo JOB""S-START; jobs; echo JOB""S-END\n")
expect("JOBS-START"); expect("Running"); expect("JOBS-END")
say("kill %1; wait; jobs; echo KIL""LED\n")
expect("KILLED")
say("jobs; echo NO""JOBS-$(jobs | wc -l)\n")
expect("NOJOBS-0")
# The window size reaches the shell: SIGWINCH on a resize, and the new size. The next line is
# sent at once: bash runs the trap at its next safe point, which may come after that line (a
# CI run under load waited 20 s for the trap alone), so both outputs are awaited, in any order.
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
say("echo SI""ZE-$(stty size)\n")
expect_all(["WINCH-GOT", "SIZE-33 111"])
# Ctrl-C interrupts a foreground command and the shell survives.
# (bash drops the rest of a line whose command died of SIGINT: the status is asked after.)
say("sleep 100\n")
time.sleep(1)
os.write(fd, b"\x03")
say("echo AFTER-\"$?\"\n")
expect("AFTER-130")
say("echo ALI""VE\n")
expect("ALIVE")
say("exit 7\n")
while True:
    try:
        if not os.read(fd, 4096):
            break
    except OSError:
        break
_, status = os.waitpid(pid, 0)
print("STATUS", os.waitstatus_to_exitcode(status))
"#;

fn terminal(w: &World) {
    let src = w.source("tty");
    launched(&w.af(&["quick", src.to_str().unwrap(), "--", "true"]));
    let bin = common::bin();
    let o = w
        .command(
            Path::new("python3"),
            &["-c", PTY_DRIVER, bin.to_str().unwrap(), "run", "tty"],
        )
        .env("SHELL", "/bin/bash")
        .env("TERM", "xterm")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", stdout(&o), err(&o));
    assert!(stdout(&o).contains("STATUS 7"), "{}{}", stdout(&o), err(&o));
}

#[test]
fn the_shell_gets_the_terminal_with_job_control_signals_and_its_status() {
    if Command::new("python3").arg("-V").output().is_err() {
        eprintln!("SKIP: python3 is not installed");
        return;
    }
    terminal(&World::new(None));
}

#[test]
fn the_environment_is_scrubbed() {
    let w = World::new(None);
    let src = w.source("envproj");
    let mut c = w.command(
        &common::bin(),
        &[
            "quick",
            src.to_str().unwrap(),
            "--env",
            "X=1",
            "--env",
            "KEEP",
            "--",
            "env",
        ],
    );
    let o = c
        .env("SECRET_TOKEN", "s")
        .env("KEEP", "k")
        .output()
        .unwrap();
    started(&o);
    let env = stdout(&o);
    for want in ["AGENTFS_SANDBOX=envproj", "X=1", "KEEP=k", "HOME="] {
        assert!(env.lines().any(|l| l.starts_with(want)), "{want}: {env}");
    }
    assert!(!env.contains("SECRET_TOKEN"), "{env}");
}

#[test]
fn the_policy_leaves_everything_else_read_only_and_masks_hold() {
    let w = World::new(None);
    let src = w.source("pol");
    fs::create_dir(src.join("out")).unwrap();
    fs::create_dir_all(w.home.join(".ssh")).unwrap();
    fs::write(w.home.join(".ssh/id_ed25519"), b"KEY").unwrap();
    let out_root = src.join("out");
    let script = "echo ok > out/a && \
                  for p in b ../x /usr/x /etc/x \"$HOME/x\"; do \
                    if echo no > \"$p\" 2>/dev/null; then echo \"WROTE $p\"; fi; \
                  done; \
                  ls -A \"$HOME/.ssh\"; cat \"$HOME/.ssh/id_ed25519\" 2>/dev/null; \
                  echo > /tmp/agentfs-sandbox-cli-private && echo tmp-ok";
    let o = w.af(&[
        "quick",
        src.to_str().unwrap(),
        "--writable-root",
        out_root.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        script,
    ]);
    started(&o);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(stdout(&o), "tmp-ok\n", "{}", err(&o));
    assert!(
        !Path::new("/tmp/agentfs-sandbox-cli-private").exists(),
        "/tmp is shared"
    );
    let db = w.root().join("pol/delta.db");
    let d = w.af(&["diff", db.to_str().unwrap(), "--name-only"]);
    assert_eq!(stdout(&d), "/out/a\n", "{}", err(&d));
}

/// `git` with a fixed identity, run on the host.
fn git(dir: &Path, args: &[&str]) {
    let o = std::process::Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "git {args:?}: {}", err(&o));
}

/// False (after a SKIP line) when git is not installed.
fn git_or_skip(test: &str) -> bool {
    let there = std::process::Command::new("git")
        .arg("--version")
        .output()
        .is_ok();
    if !there {
        eprintln!("SKIP {test}: git is not installed");
    }
    there
}

/// A source directory of the world made a git repository with one commit (its README).
fn repo(w: &World, rel: &str) -> std::path::PathBuf {
    let dir = w.source(rel);
    git(&dir, &["init", "-q", "-b", "main"]);
    git(&dir, &["add", "README"]);
    git(&dir, &["commit", "-qm", "first"]);
    dir
}

const COMMIT: &str = "echo change >> README && git add README && \
                      git -c user.name=t -c user.email=t@t commit -qm inside && git log --oneline | wc -l";

#[test]
fn git_works_inside_a_project() {
    if !git_or_skip("git_works_inside_a_project") {
        return;
    }
    let w = World::new(None);
    let src = repo(&w, "repo");
    let before = common::tree_listing(&src);
    let script = format!("git status --short && {COMMIT}");
    let o = w.af(&["quick", src.to_str().unwrap(), "--", "sh", "-c", &script]);
    started(&o);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(stdout(&o), "2\n");
    assert_eq!(
        common::tree_listing(&src),
        before,
        "the host repository changed"
    );
}

/// Seed 001's case: a linked worktree's git directory lies outside it, so a commit fails until
/// that directory is bound and declared a writable root.
#[test]
fn a_linked_worktree_commits_once_its_git_directory_is_granted() {
    if !git_or_skip("a_linked_worktree_commits_once_its_git_directory_is_granted") {
        return;
    }
    let w = World::new(None);
    let main = repo(&w, "main");
    let wt = w.base.join("wt");
    git(
        &main,
        &["worktree", "add", "-q", wt.to_str().unwrap(), "-b", "topic"],
    );
    let gitdir = main.join(".git");
    let (wt_s, gd_s) = (wt.to_str().unwrap(), gitdir.to_str().unwrap());
    let denied = w.af(&["quick", wt_s, "--ro-bind", gd_s, "--", "sh", "-c", COMMIT]);
    started(&denied);
    assert!(!denied.status.success(), "committed without the grant");
    assert!(
        err(&denied).contains("Read-only file system"),
        "{}",
        err(&denied)
    );
    // A bound host directory keeps its host owners: it is the command's user's (65534 for
    // this root-started run), as a sudo user's own repository is theirs.
    let chown = std::process::Command::new("chown")
        .args(["-R", "65534:65534", gd_s])
        .output()
        .unwrap();
    assert!(chown.status.success(), "{}", err(&chown));
    let granted = w.af(&[
        "run",
        "wt",
        "--bind",
        gd_s,
        "--writable-root",
        wt_s,
        "--writable-root",
        gd_s,
        "--",
        "sh",
        "-c",
        COMMIT,
    ]);
    assert!(granted.status.success(), "{}", err(&granted));
    assert_eq!(stdout(&granted), "2\n");
}

/// `--mount-backend auto` (the default for a new project, asked for explicitly so that
/// AGENTFS_MOUNT_BACKEND does not decide) decides by mounting: with /dev/fuse
/// closed to the user it picks overlayfs, with /dev/fuse open it picks FUSE; the choice and
/// its reason are in config.toml, the run record and `status --json`, and the project keeps
/// it (asking for the other backend is `backend_mismatch`).
#[test]
fn auto_picks_overlayfs_when_fuse_is_unavailable_and_fuse_otherwise() {
    if !user_can_run("auto_picks_overlayfs_when_fuse_is_unavailable_and_fuse_otherwise") {
        return;
    }
    let chosen = |w: &World| {
        let o = w.af(&["status", "--json"]);
        assert!(o.status.success(), "{}", err(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let p = &v["projects"][0];
        assert_eq!(p["backend"], p["last_run"]["backend"], "{p}");
        (
            p["backend"].as_str().unwrap_or("").to_string(),
            p["last_run"]["backend_reason"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        )
    };
    {
        let Some(_closed) = common::DevFuseClosed::hold() else {
            eprintln!("SKIP: /dev/fuse is open to every user here");
            return;
        };
        let w = World::without_dev_fuse(Some(USER));
        let src = w.source("ovl");
        let o = w.af(&[
            "quick",
            src.to_str().unwrap(),
            "--mount-backend",
            "auto",
            "--",
            "sh",
            "-c",
            "echo x > new",
        ]);
        launched(&o);
        let (backend, why) = chosen(&w);
        assert_eq!(backend, "overlayfs", "{why}");
        assert!(
            why.contains("FUSE failed") && why.contains("overlayfs"),
            "{why}"
        );
        let o = w.af(&["diff", "--project", "ovl", "--name-only"]);
        assert_eq!(String::from_utf8_lossy(&o.stdout), "/new\n", "{}", err(&o));
        let o = w.af(&["run", "ovl", "--mount-backend", "fuse", "--", "true"]);
        common::world::refused(&o, 125, "backend_mismatch");
        // A rule only a server could enforce is refused on overlayfs; nothing runs.
        let o = w.af(&[
            "run",
            "ovl",
            "--symlinks",
            "refuse-escaping",
            "--",
            "sh",
            "-c",
            "echo x > ran",
        ]);
        assert_eq!(o.status.code(), Some(125), "{}", err(&o));
        assert!(
            err(&o).contains("agentfs: policy_unenforceable: "),
            "{}",
            err(&o)
        );
        let o = w.af(&["diff", "--project", "ovl", "--name-only"]);
        assert_eq!(String::from_utf8_lossy(&o.stdout), "/new\n", "{}", err(&o));
        assert!(fs::read_to_string(w.root().join("ovl/config.toml"))
            .unwrap()
            .contains("backend = \"overlayfs\""));
    }
    let w = World::new(Some(USER));
    let src = w.source("fs");
    launched(&w.af(&[
        "quick",
        src.to_str().unwrap(),
        "--mount-backend",
        "auto",
        "--",
        "true",
    ]));
    let (backend, why) = chosen(&w);
    assert_eq!(backend, "fuse", "{why}");
    assert!(why.contains("FUSE mount succeeded"), "{why}");
}

/// AGENTFS_MOUNT_BACKEND chooses the backend of a project's first launch without the flag;
/// later it changes nothing (the project keeps its backend); a value it does not know is
/// `bad_knob`; `--mount-backend auto` is not overridden by it.
#[test]
fn the_default_backend_knob_decides_only_a_first_launch() {
    if !common::fuse_or_skip("the_default_backend_knob_decides_only_a_first_launch") {
        return;
    }
    let w = World::new(None);
    let src = w.source("kn");
    let run = |knob: &str, args: &[&str]| {
        w.command(&common::bin(), args)
            .env("AGENTFS_MOUNT_BACKEND", knob)
            .output()
            .unwrap()
    };
    launched(&run(
        "overlayfs",
        &["quick", src.to_str().unwrap(), "--", "true"],
    ));
    let o = w.af(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["projects"][0]["backend"], "overlayfs", "{v}");
    assert_eq!(
        v["projects"][0]["last_run"]["backend_reason"],
        "AGENTFS_MOUNT_BACKEND=overlayfs"
    );
    launched(&run("fuse", &["run", "kn", "--", "true"]));
    let o = w.af(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["projects"][0]["last_run"]["backend"], "overlayfs", "{v}");
    common::world::refused(
        &run("kernel", &["run", "kn", "--", "true"]),
        125,
        "bad_knob",
    );
    // The flag wins over the knob, `--mount-backend auto` too: it probes (FUSE mounts here).
    let src = w.source("kn-auto");
    launched(&run(
        "overlayfs",
        &[
            "quick",
            src.to_str().unwrap(),
            "--mount-backend",
            "auto",
            "--",
            "true",
        ],
    ));
    let o = w.af(&["status", "kn-auto", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["projects"][0]["backend"], "fuse", "{v}");
    assert!(
        v["projects"][0]["last_run"]["backend_reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("auto: ")),
        "{v}"
    );
}
