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

/// The project's `last_run` is the run that started last, also when the pids wrapped between
/// two runs of one second and the later supervisor has the smaller pid (the test makes the wrap
/// happen by lowering the kernel's last pid, `/proc/sys/kernel/ns_last_pid`, so root only).
#[test]
fn the_last_run_is_the_newest_even_when_pids_wrapped() {
    if !common::fuse_or_skip("the_last_run_is_the_newest_even_when_pids_wrapped") {
        return;
    }
    let w = World::new(None);
    let src = w.source("wrap");
    let last_run = || {
        let o = w.af(&["status", "wrap", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["projects"][0]["last_run"].clone()
    };
    let pid_max: i64 = fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let last_pid = |p: i64| fs::write("/proc/sys/kernel/ns_last_pid", p.to_string()).unwrap();
    last_pid(pid_max * 2 / 3);
    let first = w.af(&["quick", src.to_str().unwrap(), "--", "sh", "-c", "exit 7"]);
    assert_eq!(first.status.code(), Some(7), "{}", err(&first));
    let r = last_run();
    assert_eq!(r["exit_status"], 7, "{r}");
    let pid = r["supervisor"].as_i64().unwrap();
    last_pid(pid_max / 3);
    let second = w.af(&["run", "wrap", "--", "sh", "-c", "exit 9"]);
    assert_eq!(second.status.code(), Some(9), "{}", err(&second));
    let r = last_run();
    assert_eq!(r["exit_status"], 9, "the older run: {r}");
    assert!(r["supervisor"].as_i64().unwrap() < pid, "no wrap: {r}");
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

/// What the command sees of the project: every entry under it with its type and mode, link
/// count and size (not for directories: each backend counts those its own way), mtime, content hash or symlink target, and extended
/// attributes, one line each, sorted.
const VIEW: &str = r#"
import hashlib, os, sys
root = sys.argv[1]
out = []
for d, dirs, files in os.walk(root):
    for n in dirs + files:
        p = os.path.join(d, n)
        st = os.lstat(p)
        rel = os.path.relpath(p, root)
        if os.path.islink(p):
            body = os.readlink(p)
        elif os.path.isfile(p):
            body = hashlib.sha256(open(p, 'rb').read()).hexdigest()
        else:
            body = ''
        isdir = os.path.isdir(p) and not os.path.islink(p)
        links, size = ('', '') if isdir else (st.st_nlink, st.st_size)
        xattrs = sorted((a, os.getxattr(p, a, follow_symlinks=False))
                        for a in os.listxattr(p, follow_symlinks=False))
        out.append(f"{rel} {st.st_mode:o} {links} {size} {st.st_mtime_ns} {body} {xattrs}")
top = sorted((a, os.getxattr(root, a)) for a in os.listxattr(root))
print(f". {top}")
print("\n".join(sorted(out)))
"#;

/// A launched `agentfs run` ended on drop: SIGTERM to it (its supervisor), then SIGKILL.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let pid = self.0.id() as i32;
        let _ = agentfs::sys::ns::kill(pid, libc::SIGTERM);
        if common::wait_timeout(&mut self.0, std::time::Duration::from_secs(10)).is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `agentfs convert` moves a project between backends without losing anything: the view and
/// `diff --json` are the same before and after each conversion (files, a deletion, an opaque
/// directory, extended attributes, a symlink, hard links, a FIFO, a partly rewritten large
/// file); an upper directory a run left is imported first; the same backend is a no-op; a
/// live sandbox or a mounted delta refuses it (`sandbox_live`), as does a symlink rule the
/// target cannot enforce (`policy_unenforceable`) and a backend it does not know (`usage`).
fn convert_moves_a_project_losslessly(w: &World) {
    let src = w.source("src-cv");
    fs::create_dir_all(src.join("old")).unwrap();
    fs::write(src.join("old/was"), "was\n").unwrap();
    fs::write(src.join("big"), vec![7u8; 300_000]).unwrap();
    // Root-started commands run as USER too, and overlayfs shows the host's owners: the
    // tree is the command's in both worlds.
    for p in [
        &src,
        &src.join("README"),
        &src.join("old"),
        &src.join("old/was"),
        &src.join("big"),
    ] {
        std::os::unix::fs::chown(p, Some(USER), Some(USER)).unwrap();
    }
    let s = src.to_str().unwrap();
    let run = |backend: Option<&str>, script: &str| {
        let mut args = vec!["run", "cv"];
        if let Some(b) = backend {
            args.extend(["--mount-backend", b]);
        }
        let script = format!("cd {s} && {script}");
        args.extend(["--", "sh", "-c", &script]);
        let o = w.af(&args);
        launched(&o);
        o
    };
    let look = || {
        let o = w.af(&["run", "cv", "--", "/usr/bin/python3", "-c", VIEW, s]);
        launched(&o);
        let diff = w.af(&["diff", "--project", "cv", "--json"]);
        assert!(diff.status.success(), "{}", err(&diff));
        (stdout(&o), stdout(&diff))
    };
    let backend = || {
        let o = w.af(&["status", "cv", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (
            v["projects"][0]["backend"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            v["projects"][0]["last_run"]["backend"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        )
    };
    let convert = |to: &str| {
        let o = w.af(&["convert", "cv", "--to", to, "--json"]);
        assert!(o.status.success(), "{}", err(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    launched(&w.af(&["init", "cv", "--source", s]));
    run(
        Some("overlayfs"),
        "echo new > new.txt && rm README && rm -r old && mkdir old && echo fresh > old/other \
         && ln -s new.txt link && ln new.txt hard && mkfifo pipe && mkdir -p made/deep \
         && /usr/bin/python3 -c \"import os; os.setxattr('new.txt', 'user.mine', b'v'); \
         os.setxattr('made', 'user.overlay.opaque', b'n'); os.setxattr('.', 'user.top', b't')\"",
    );
    let on_overlayfs = look();
    assert!(
        on_overlayfs.0.contains("hard 100644 2 "),
        "{}",
        on_overlayfs.0
    );
    assert!(
        on_overlayfs.0.contains("('user.mine', b'v')"),
        "{}",
        on_overlayfs.0
    );
    assert!(on_overlayfs.1.contains("\"/README\""), "{}", on_overlayfs.1);
    assert_eq!(backend(), ("overlayfs".into(), "overlayfs".into()));

    let v = convert("fuse");
    assert_eq!(
        v,
        serde_json::json!({"project": "cv", "from": "overlayfs", "to": "fuse",
            "converted": true, "imported": null})
    );
    let on_fuse = look();
    assert_eq!(backend(), ("fuse".into(), "fuse".into()));
    assert_eq!(on_overlayfs.0, on_fuse.0, "the view");
    assert_eq!(on_overlayfs.1, on_fuse.1, "diff --json");

    // The same backend again: nothing to do, and it says so.
    let o = w.af(&["convert", "cv", "--to", "fuse"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        stdout(&o).contains("already keeps the fuse backend"),
        "{}",
        stdout(&o)
    );
    assert_eq!(convert("fuse")["converted"], false);

    // Changes made on FUSE (a partial rewrite of a large file among them) go back to overlayfs.
    run(
        None,
        "printf x | dd of=big bs=1 seek=5 conv=notrunc 2>/dev/null && rm old/other \
         && ln hard third && /usr/bin/python3 -c \"import os; os.setxattr('made/deep', 'user.d', b'1')\"",
    );
    let on_fuse = look();
    assert!(on_fuse.0.contains("hard 100644 3 "), "{}", on_fuse.0);
    assert_eq!(convert("overlayfs")["from"], "fuse");
    let on_overlayfs = look();
    assert_eq!(backend(), ("overlayfs".into(), "overlayfs".into()));
    assert_eq!(on_fuse.0, on_overlayfs.0, "the view");
    assert_eq!(on_fuse.1, on_overlayfs.1, "diff --json");

    // An upper directory a run left unimported goes into the delta before the switch.
    let upper = w.root().join("cv/upper");
    fs::create_dir(&upper).unwrap();
    fs::write(upper.join("left.txt"), "left\n").unwrap();
    w.own(&upper);
    w.own(&upper.join("left.txt"));
    let v = convert("fuse");
    assert_eq!(
        v["imported"],
        serde_json::json!({"objects": 1, "whiteouts": 0}),
        "{v}"
    );
    assert!(!upper.exists());
    let diff = w.af(&["diff", "--project", "cv", "--name-only"]);
    assert!(
        stdout(&diff).lines().any(|l| l == "/left.txt"),
        "{}",
        stdout(&diff)
    );

    // A FUSE launch takes in an upper left behind too (a launch that read the old backend
    // before a conversion leaves one when it is killed).
    fs::create_dir(&upper).unwrap();
    fs::write(upper.join("late.txt"), "late\n").unwrap();
    w.own(&upper);
    w.own(&upper.join("late.txt"));
    let o = run(None, "cat late.txt");
    assert_eq!(stdout(&o), "late\n");
    assert!(!upper.exists());
    assert_eq!(backend(), ("fuse".into(), "fuse".into()));

    // Refusals change nothing.
    let config = w.root().join("cv/config.toml");
    let kept = fs::read_to_string(&config).unwrap();
    common::world::failed(
        &w.af(&["convert", "cv", "--to", "zfs", "--json"]),
        2,
        "usage",
    );
    let live = Running(
        w.command(&common::bin(), &["run", "cv", "--", "sleep", "1000"])
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while agentfs::sandbox::live(&w.root().join("cv")).is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox never became live"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    common::world::failed(
        &w.af(&["convert", "cv", "--to", "overlayfs", "--json"]),
        4,
        "sandbox_live",
    );
    drop(live);
    let mnt = w.base.join("mnt");
    fs::create_dir(&mnt).unwrap();
    w.own(&mnt);
    let _cleanup = common::UnmountOnDrop(mnt.clone());
    launched(&w.af(&["mount", "cv", mnt.to_str().unwrap()]));
    let e = common::world::failed(
        &w.af(&["convert", "cv", "--to", "overlayfs", "--json"]),
        4,
        "sandbox_live",
    );
    assert!(e["message"].as_str().unwrap().contains("mounted"), "{e}");
    launched(&w.af(&["umount", mnt.to_str().unwrap()]));
    // A rule only the FUSE server enforces, from defaults.toml here.
    let defaults = w.root().join("defaults.toml");
    fs::write(&defaults, "[policy]\nsymlinks = \"refuse-escaping\"\n").unwrap();
    w.own(&defaults);
    common::world::failed(
        &w.af(&["convert", "cv", "--to", "overlayfs", "--json"]),
        3,
        "policy_unenforceable",
    );
    assert_eq!(fs::read_to_string(&config).unwrap(), kept);
    assert!(kept.contains("backend = \"fuse\""), "{kept}");
    assert!(
        host_mounts_of(&src).is_empty(),
        "{:?}",
        host_mounts_of(&src)
    );
}

#[test]
fn convert_moves_a_project_losslessly_as_root() {
    if common::fuse_or_skip("convert_moves_a_project_losslessly_as_root") {
        convert_moves_a_project_losslessly(&World::new(None));
    }
}

#[test]
fn convert_moves_a_project_losslessly_as_a_user() {
    if user_can_run("convert_moves_a_project_losslessly_as_a_user") {
        convert_moves_a_project_losslessly(&World::new(Some(USER)));
    }
}

/// A kernel mount the test made, unmounted on drop (also when the test fails).
struct KernelMount(std::path::PathBuf);

impl KernelMount {
    fn new(args: &[&str], at: &Path) -> KernelMount {
        let o = Command::new("mount").args(args).arg(at).output().unwrap();
        assert!(o.status.success(), "mount {args:?}: {}", err(&o));
        KernelMount(at.to_path_buf())
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// `auto` where neither backend mounts is `no_mount_backend`, naming both failures, and
/// nothing runs: FUSE is unusable (/dev/fuse closed to the user; for root, /dev/null bound
/// over it in a mount namespace of the test's own), and the projects root lies on an
/// overlayfs, which overlayfs refuses as an upper directory's filesystem.
fn no_backend_mounts(user: Option<u32>) {
    let _closed = match user {
        Some(_) => match common::DevFuseClosed::hold() {
            Some(c) => Some(c),
            None => {
                eprintln!("SKIP: /dev/fuse is open to every user here");
                return;
            }
        },
        None => None,
    };
    let w = World::without_dev_fuse(user);
    let layers = w.base.join("layers");
    let top = w.base.join("top");
    for d in [&layers, &top] {
        fs::create_dir(d).unwrap();
    }
    let _layers = KernelMount::new(&["-t", "tmpfs", "-o", "size=8m", "tmpfs"], &layers);
    for d in ["l", "u", "w"] {
        fs::create_dir(layers.join(d)).unwrap();
    }
    let opts = format!(
        "lowerdir={0}/l,upperdir={0}/u,workdir={0}/w",
        layers.display()
    );
    let _top = KernelMount::new(&["-t", "overlay", "-o", &opts, "overlay"], &top);
    w.own(&top);
    let projects = top.join("projects");
    let src = w.source("src-nb");
    let flag = src.join("ran");
    let script = format!("touch {}", flag.display());
    let bin = common::bin();
    let args = [
        "quick",
        src.to_str().unwrap(),
        "--mount-backend",
        "auto",
        "--",
        "sh",
        "-c",
        &script,
    ];
    let mut c = match user {
        Some(_) => w.command(&bin, &args),
        None => {
            let mut wrapped = vec![
                "-m",
                "sh",
                "-c",
                "mount --bind /dev/null /dev/fuse && exec \"$0\" \"$@\"",
                bin.to_str().unwrap(),
            ];
            wrapped.extend(args);
            w.command(Path::new("unshare"), &wrapped)
        }
    };
    let o = c.env("AGENTFS_PROJECTS_DIR", &projects).output().unwrap();
    let e = err(&o);
    assert_eq!(o.status.code(), Some(125), "{e}");
    let last = e.trim_end().lines().last().unwrap_or("");
    let code = "no_mount_backend";
    assert!(last.starts_with(&format!("agentfs: {code}: ")), "{e}");
    assert!(
        last.contains("FUSE: ") && last.contains("overlayfs: "),
        "{e}"
    );
    assert!(!flag.exists(), "the command ran");
    let dir = projects.join("src-nb");
    let config = fs::read_to_string(dir.join("config.toml")).unwrap();
    assert!(!config.contains("\nbackend = "), "{config}");
    let left: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("probe-"))
        .collect();
    assert!(left.is_empty(), "the probe left {left:?}");
}

#[test]
fn no_mount_backend_when_neither_mounts_as_root() {
    if common::fuse_or_skip("no_mount_backend_when_neither_mounts_as_root") {
        no_backend_mounts(None);
    }
}

#[test]
fn no_mount_backend_when_neither_mounts_as_a_user() {
    if user_can_run("no_mount_backend_when_neither_mounts_as_a_user") {
        no_backend_mounts(Some(USER));
    }
}
