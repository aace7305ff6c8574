//! The sandbox through real namespaces and mounts, as root and as an unprivileged user.
//!
//! Each test runs the library's `sandbox::run`/`exec` in a helper process (this test binary
//! started again with `helper_entry` and a request in the environment): the sandbox forks, and a
//! process of its own keeps the test harness's threads out of it. Commands report what they see
//! on standard output between markers.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use agentfs::sandbox::request::{
    Bind, HomeMode, MountBackend, Net, Policy, PolicyMode, SandboxRequest,
};
use serde::{Deserialize, Serialize};

use common::{agentfs, fuse_or_skip, scratch_root};

const SPEC: &str = "SANDBOX_TEST_SPEC";

/// A request as the test writes it down (the helper turns it into a `SandboxRequest`).
#[derive(Serialize, Deserialize, Clone)]
struct Spec {
    project: String,
    project_dir: PathBuf,
    source: PathBuf,
    db: PathBuf,
    command: Vec<String>,
    cwd: PathBuf,
    home_dir: PathBuf,
    home: String,
    masks: Vec<PathBuf>,
    /// (src, dst, writable)
    binds: Vec<(PathBuf, PathBuf, bool)>,
    policy: Option<String>,
    writable: Vec<PathBuf>,
    net_none: bool,
    exec: bool,
    /// "overlayfs" or "fuse"; a new project takes the one the suite runs on
    /// (`common::backend`).
    backend: String,
}

impl Spec {
    fn request(&self) -> SandboxRequest {
        SandboxRequest {
            project: self.project.clone(),
            project_dir: self.project_dir.clone(),
            source: self.source.clone(),
            db: self.db.clone(),
            command: self.command.iter().map(Into::into).collect(),
            cwd: self.cwd.clone(),
            home_dir: self.home_dir.clone(),
            home: match self.home.as_str() {
                "full" => HomeMode::Full,
                "empty" => HomeMode::Empty,
                _ => HomeMode::FullRo,
            },
            masks: self.masks.clone(),
            binds: self
                .binds
                .iter()
                .map(|(s, d, w)| Bind {
                    src: s.clone(),
                    dst: d.clone(),
                    writable: *w,
                })
                .collect(),
            policy: Policy {
                mode: match self.policy.as_deref() {
                    Some("read-only") => Some(PolicyMode::ReadOnly),
                    Some(_) => Some(PolicyMode::WorkspaceWrite),
                    None => None,
                },
                writable: self.writable.clone(),
            },
            refuse_escaping_symlinks: false,
            net: if self.net_none { Net::None } else { Net::Host },
            env: vec![
                ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
                ("HOME".into(), self.home_dir.clone().into()),
                ("LANG".into(), "C".into()),
            ],
            replicate: None,
            backend: match self.backend.as_str() {
                "overlayfs" => MountBackend::Overlayfs,
                _ => MountBackend::Fuse,
            },
            backend_reason: String::new(),
        }
    }
}

/// The helper process's body: run the request and exit with the status it propagates, or
/// print the error's code and exit 250.
#[test]
fn helper_entry() {
    let Ok(text) = std::env::var(SPEC) else {
        return;
    };
    let spec: Spec = serde_json::from_str(&text).unwrap();
    let req = spec.request();
    let knobs = agentfs::knobs::get();
    let res = if spec.exec {
        agentfs::sandbox::exec(&req, knobs)
    } else {
        agentfs::sandbox::run(&req, knobs)
    };
    match res {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            println!("SANDBOX_ERROR {} {e}", e.code());
            std::process::exit(250)
        }
    }
}

/// A project: a host directory, its delta and its project directory, all under one scratch
/// directory, with a home beside them.
struct Project {
    root: PathBuf,
    spec: Spec,
    /// Run as this host user (None: as root).
    user: Option<(u32, u32)>,
}

impl Project {
    fn new(name: &str, user: Option<(u32, u32)>) -> Project {
        Project::new_with(name, user, &|_: &Path, _: &Path| {})
    }

    /// `setup(root, source)` runs once the files exist, before ownership and the delta.
    fn new_with(name: &str, user: Option<(u32, u32)>, setup: &dyn Fn(&Path, &Path)) -> Project {
        let root = scratch_root().join(format!("sbx-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let source = root.join("src");
        let home = root.join("home");
        let project_dir = home.join(".agentfs").join(name);
        fs::create_dir_all(&source).unwrap();
        fs::create_dir_all(&project_dir).unwrap();
        fs::write(source.join("hello.txt"), "hello\n").unwrap();
        fs::create_dir(source.join("sub")).unwrap();
        fs::write(source.join("sub/keep.txt"), "keep\n").unwrap();
        fs::write(source.join(".env"), "SECRET=1\n").unwrap();
        fs::create_dir_all(home.join(".ssh")).unwrap();
        fs::write(home.join(".ssh/id_ed25519"), "PRIVATE").unwrap();
        fs::write(home.join(".netrc"), "machine x password y\n").unwrap();
        setup(&root, &source);
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        // The delta is made by root: its root directory is root's. The sandbox serves the
        // project as owned by the command's user all the same.
        let db = project_dir.join("delta.db");
        let out = Command::new(common::bin())
            .args([
                "init",
                db.to_str().unwrap(),
                "--base",
                source.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        // Every file belongs to the user the command runs as (65534 for root-started runs),
        // so a rootless server can open the database.
        chown_tree(&root, user.unwrap_or((65534, 65534)));
        let spec = Spec {
            project: name.into(),
            project_dir,
            source: source.clone(),
            db,
            command: vec![],
            cwd: source.clone(),
            home_dir: home.clone(),
            home: "full-ro".into(),
            masks: vec![
                home.join(".ssh"),
                home.join(".netrc"),
                home.join(".agentfs"),
                source.join(".env"),
            ],
            binds: vec![],
            policy: None,
            writable: vec![source],
            net_none: false,
            exec: false,
            backend: common::backend().into(),
        };
        Project { root, spec, user }
    }

    fn source(&self) -> &Path {
        &self.spec.source
    }

    /// Run `script` with sh in the sandbox as `spec` says.
    fn run_with(&self, spec: &Spec, script: &str) -> Output {
        let mut spec = spec.clone();
        if spec.command.is_empty() {
            spec.command = vec!["/bin/sh".into(), "-c".into(), script.into()];
        }
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "helper_entry",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(SPEC, serde_json::to_string(&spec).unwrap())
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .current_dir("/");
        if let Some((u, g)) = self.user {
            cmd.uid(u).gid(g).env("HOME", &self.spec.home_dir);
        }
        cmd.output().unwrap()
    }

    fn run(&self, script: &str) -> Output {
        self.run_with(&self.spec, script)
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn chown_tree(p: &Path, (u, g): (u32, u32)) {
    let _ = std::os::unix::fs::lchown(p, Some(u), Some(g));
    if p.is_dir() && !p.is_symlink() {
        for e in fs::read_dir(p).unwrap() {
            chown_tree(&e.unwrap().path(), (u, g));
        }
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A listing of every path under `root` with its type, mode, size, owner, mtime and content
/// hash: equal listings mean an untouched tree.
fn listing(root: &Path) -> Vec<String> {
    use sha2::Digest;
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = fs::symlink_metadata(&p).unwrap();
        let hash = if m.is_file() {
            sha2::Sha256::digest(fs::read(&p).unwrap())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        } else {
            String::new()
        };
        out.push(format!(
            "{} {:o} {} {}:{} {}.{} {hash}",
            p.display(),
            m.mode(),
            m.size(),
            m.uid(),
            m.gid(),
            m.mtime(),
            m.mtime_nsec()
        ));
        if m.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    out.sort();
    out
}

fn no_sandbox_mounts_on_host(p: &Project) {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let src = p.source().to_string_lossy().into_owned();
    assert!(
        !info
            .lines()
            .any(|l| l.contains(&src) || l.contains("newroot")),
        "a sandbox mount is visible on the host:\n{info}"
    );
}

/// Root or the test user, and whether the machine can run sandboxes at all.
fn ready(test: &str) -> bool {
    if !fuse_or_skip(test) {
        return false;
    }
    fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .map(|s| s.trim() != "0")
        .unwrap_or(false)
}

#[test]
fn the_project_is_at_its_real_path_and_writes_land_in_the_delta_only() {
    if !ready("the_project_is_at_its_real_path_and_writes_land_in_the_delta_only") {
        return;
    }
    let p = Project::new("real", None);
    let before = listing(p.source());
    let out = p.run(&format!(
        "cd {src} && cat hello.txt && echo new > new.txt && echo more >> sub/keep.txt && rm hello.txt && pwd && id -u && echo AGENTFS_SANDBOX=$AGENTFS_SANDBOX",
        src = p.source().display()
    ));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text.contains("hello\n"), "{text}");
    assert!(
        text.contains(&format!("{}\n65534\n", p.source().display())),
        "{text}"
    );
    assert!(text.contains("AGENTFS_SANDBOX=real"), "{text}");
    assert_eq!(before, listing(p.source()), "the host directory changed");
    let diff = agentfs(&["diff", "--name-only", p.spec.db.to_str().unwrap()]);
    let names = String::from_utf8_lossy(&diff.stdout);
    let mut names: Vec<&str> = names.lines().collect();
    names.sort();
    assert_eq!(
        names,
        ["/hello.txt", "/new.txt", "/sub/keep.txt"],
        "{diff:?}"
    );
    let integ = agentfs(&["integrity", p.spec.db.to_str().unwrap()]);
    assert!(integ.status.success(), "{integ:?}");
    no_sandbox_mounts_on_host(&p);
    assert!(!p.spec.project_dir.join("live.json").exists());
    let rec = agentfs::sandbox::latest_record(&p.spec.project_dir).expect("a run record");
    assert_eq!(rec.exit_status, Some(0));
    assert_eq!(rec.uid_inside, 65534);
    assert!(rec
        .mounts
        .iter()
        .any(|m| m.op == p.spec.backend && m.path == p.spec.source && m.mode == "rw"));
}

#[test]
fn a_root_owned_project_is_served_as_owned_by_the_command() {
    let test = "a_root_owned_project_is_served_as_owned_by_the_command";
    if !ready(test) || !common::fuse_only(test, "owners squashed to the command's") {
        return;
    }
    let p = Project::new("rootowned", None);
    // The project's files and the delta's root directory belong to root; the command runs
    // as 65534.
    chown_tree(p.source(), (0, 0));
    let before = listing(p.source());
    let out = p.run(&format!(
        "cd {src} && echo new > new.txt && echo more >> hello.txt && chmod 600 hello.txt && mkdir d && touch d/x && stat -c '%n %u:%g %a' . new.txt hello.txt d d/x sub/keep.txt",
        src = p.source().display()
    ));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    for name in [".", "new.txt", "hello.txt", "d", "d/x", "sub/keep.txt"] {
        let want = format!("\n{name} 65534:65534 ");
        assert!(
            format!("\n{text}").contains(&want),
            "{want:?} not in {text}"
        );
    }
    assert!(text.contains("hello.txt 65534:65534 600\n"), "{text}");
    assert_eq!(before, listing(p.source()), "the host directory changed");
    no_sandbox_mounts_on_host(&p);
}

/// Root raises a FUSE mount's readahead after INIT (the kernel caps it at 128 KiB, and every
/// READ with it); a sandbox's project mount lives in another mount namespace, so its device
/// comes from the sandbox side, never from the project's host path (whose own device, when
/// that directory is a mount point, must not be touched).
#[test]
fn a_root_sandboxs_project_mount_gets_the_readahead_of_a_plain_mount() {
    let test = "a_root_sandboxs_project_mount_gets_the_readahead_of_a_plain_mount";
    if !ready(test) || !common::fuse_only(test, "a FUSE mount's readahead") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("{test}: skipped, only root may raise a device's readahead");
        return;
    }
    let want = agentfs::knobs::get().fuse_readahead_kib;
    if want <= 128 {
        eprintln!(
            "{test}: skipped, AGENTFS_FUSE_READAHEAD_KIB={want} is not above the kernel's 128"
        );
        return;
    }
    let p = Project::new("readahead", None);
    let out = p.run(&format!(
        "cat /sys/class/bdi/$(mountpoint -d {src})/read_ahead_kb",
        src = p.source().display()
    ));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    assert_eq!(
        text.lines().last(),
        Some(want.to_string().as_str()),
        "{out:?}"
    );
}

#[test]
fn outside_the_writable_set_writes_fail_with_erofs_and_secrets_read_empty() {
    if !ready("outside_the_writable_set_writes_fail_with_erofs_and_secrets_read_empty") {
        return;
    }
    let p = Project::new("erofs", None);
    let ro = p.root.join("ro");
    fs::create_dir(&ro).unwrap();
    chown_tree(&ro, (65534, 65534));
    let mut spec = p.spec.clone();
    spec.binds = vec![(ro.clone(), ro.clone(), false)];
    let home = spec.home_dir.display().to_string();
    let script = format!(
        r#"for f in /usr/x /etc/x {home}/x {ro}/x /x; do touch $f 2>&1 | grep -q 'Read-only file system' && echo EROFS $f; done
echo tmp > /tmp/mine && cat /tmp/mine
cat {home}/.netrc | wc -c; ls -A {home}/.ssh | wc -l; cat {src}/.env | wc -c
ls {home}/.agentfs | wc -l
umount {home}/.ssh 2>/dev/null || echo UMOUNT-REFUSED
unshare -Urm sh -c 'umount {home}/.ssh 2>/dev/null || echo NESTED-UMOUNT-REFUSED; mount -o remount,rw,bind {home}/.netrc 2>/dev/null || echo NESTED-REMOUNT-REFUSED'
echo w > {src}/ok && echo PROJECT-WRITABLE
test -e /dev/fuse || echo NO-DEV-FUSE
"#,
        ro = ro.display(),
        src = p.source().display()
    );
    let out = p.run_with(&spec, &script);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    for f in [
        "/usr/x",
        "/etc/x",
        &format!("{home}/x"),
        &format!("{}/x", ro.display()),
        "/x",
    ] {
        assert!(text.contains(&format!("EROFS {f}\n")), "{f}: {text}");
    }
    assert!(text.contains("tmp\n0\n0\n0\n0\n"), "{text}");
    for m in [
        "UMOUNT-REFUSED",
        "NESTED-UMOUNT-REFUSED",
        "NESTED-REMOUNT-REFUSED",
        "PROJECT-WRITABLE",
        "NO-DEV-FUSE",
    ] {
        assert!(text.contains(m), "{m}: {text}");
    }
    assert!(
        !Path::new("/tmp/mine").exists() || fs::read_to_string("/tmp/mine").unwrap() != "tmp\n"
    );
    no_sandbox_mounts_on_host(&p);
}

#[test]
fn exit_statuses_propagate_and_nothing_outlives_the_command() {
    if !ready("exit_statuses_propagate_and_nothing_outlives_the_command") {
        return;
    }
    let p = Project::new("status", None);
    for (script, want) in [
        ("exit 0", 0),
        ("exit 3", 3),
        ("kill -INT $$", 130),
        ("kill -KILL $$", 137),
    ] {
        let out = p.run(script);
        assert_eq!(out.status.code(), Some(want), "{script}: {out:?}");
    }
    // A background child left running is killed when the command exits.
    let marker = format!("sleep 300.{}1", std::process::id());
    let out = p.run(&format!("{marker} & exit 0"));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ps = Command::new("pgrep")
        .args(["-f", &marker])
        .output()
        .unwrap();
    assert!(!ps.status.success(), "the background child survived");
    no_sandbox_mounts_on_host(&p);
}

#[test]
fn no_capabilities_no_new_privs_and_the_optional_namespaces() {
    if !ready("no_capabilities_no_new_privs_and_the_optional_namespaces") {
        return;
    }
    let p = Project::new("caps", None);
    let mut spec = p.spec.clone();
    spec.net_none = true;
    spec.home = "empty".into();
    let home = spec.home_dir.display().to_string();
    let out = p.run_with(
        &spec,
        &format!(
            "grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status; \
             tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; cat /sys/class/net/lo/operstate /sys/class/net/lo/flags; \
             ls -A {home} | wc -l; touch {home}/x 2>&1 | grep -c Read-only; echo $$"
        ),
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    for cap in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
        assert!(
            text.contains(&format!("{cap}:\t0000000000000000")),
            "{cap}: {text}"
        );
    }
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    // Only loopback, and it is up (IFF_UP in its flags).
    assert!(
        text.contains("\nlo\n") && !text.contains("eth") && !text.contains("ens"),
        "{text}"
    );
    assert!(
        text.contains("0x9\n") || text.contains("unknown\n0x9"),
        "{text}"
    );
    // An empty, read-only home; the command is pid 2 (pid 1 is ours).
    assert!(text.ends_with("0\n1\n2\n"), "{text}");
}

/// Start `spec` in a helper and wait until it is live; returns the helper and pid 1's host pid.
// The caller waits for the child it is handed.
#[allow(clippy::zombie_processes)]
fn start_live(p: &Project, spec: &Spec) -> (std::process::Child, i32) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_entry",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(SPEC, serde_json::to_string(spec).unwrap())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some(m) = agentfs::sandbox::live(&p.spec.project_dir) {
            return (child, m.pid1);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the sandbox never went live");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn pid1_forwards_signals_and_the_sandbox_dies_with_its_supervisor() {
    if !ready("pid1_forwards_signals_and_the_sandbox_dies_with_its_supervisor") {
        return;
    }
    let p = Project::new("signal", None);
    let mut spec = p.spec.clone();
    let marker = format!("sleep 300.{}2", std::process::id());
    spec.command = vec![
        "/bin/sh".into(),
        "-c".into(),
        format!("{marker} & sleep 60"),
    ];
    // A signal sent to pid 1 reaches the command: TERM ends it with 128+15.
    let (mut child, pid1) = start_live(&p, &spec);
    let _ = Command::new("kill")
        .args(["-TERM", &pid1.to_string()])
        .status();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
    // A supervisor killed outright takes the whole sandbox with it.
    let (mut child, _) = start_live(&p, &spec);
    child.kill().unwrap();
    let _ = child.wait();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while Command::new("pgrep")
        .args(["-f", &marker])
        .status()
        .unwrap()
        .success()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox outlived its supervisor"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Its marker is stale now: exec does not try to join it.
    assert!(agentfs::sandbox::live(&p.spec.project_dir).is_none());
    no_sandbox_mounts_on_host(&p);
}

#[test]
fn a_read_only_policy_refuses_writes_in_the_project_too() {
    if !ready("a_read_only_policy_refuses_writes_in_the_project_too") {
        return;
    }
    let p = Project::new("ropolicy", None);
    let mut spec = p.spec.clone();
    spec.policy = Some("read-only".into());
    spec.writable = vec![];
    let out = p.run_with(
        &spec,
        &format!("touch {}/new 2>&1; echo rc=$?", p.source().display()),
    );
    let text = stdout(&out);
    assert!(
        text.contains("Read-only file system") && text.contains("rc=1"),
        "{text}"
    );
    // Narrower roots: only sub/ is writable.
    spec.policy = Some("workspace-write".into());
    spec.writable = vec![p.source().join("sub")];
    let out = p.run_with(
        &spec,
        &format!(
            "echo x > {src}/sub/new && echo SUB-OK; echo x > {src}/top 2>/dev/null || echo TOP-REFUSED",
            src = p.source().display()
        ),
    );
    let text = stdout(&out);
    assert!(
        text.contains("SUB-OK") && text.contains("TOP-REFUSED"),
        "{text}"
    );
}

/// git on the host, as root, on a tree that belongs to someone else.
fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "safe.directory=*",
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

const GIT_ID: &str = "git -c user.name=t -c user.email=t@example.com";

#[test]
fn git_status_and_commit_work_inside_a_git_project() {
    if !ready("git_status_and_commit_work_inside_a_git_project") {
        return;
    }
    let p = Project::new_with("git", None, &|_, src| {
        git(src, &["init", "-q"]);
        git(src, &["add", "."]);
        git(src, &["commit", "-qm", "base"]);
    });
    let before = listing(p.source());
    let out = p.run(&format!(
        "echo change >> hello.txt && git status --short && {GIT_ID} commit -qam inside && git log --format=%s | head -1"
    ));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text.contains(" M hello.txt\ninside\n"), "{text}");
    assert_eq!(before, listing(p.source()), "the host repository changed");
}

#[test]
fn a_linked_worktree_commits_only_once_its_git_dir_is_granted() {
    if !ready("a_linked_worktree_commits_only_once_its_git_dir_is_granted") {
        return;
    }
    let p = Project::new_with("worktree", None, &|root, src| {
        let repo = root.join("repo");
        fs::create_dir(&repo).unwrap();
        fs::write(repo.join("f"), "f\n").unwrap();
        git(&repo, &["init", "-q"]);
        git(&repo, &["add", "."]);
        git(&repo, &["commit", "-qm", "base"]);
        fs::remove_dir_all(src).unwrap();
        git(&repo, &["worktree", "add", "-q", src.to_str().unwrap()]);
    });
    let repo = p.root.join("repo");
    let script = format!("echo x >> f && {GIT_ID} commit -qam wt && echo COMMITTED");
    // The git directory is visible but read-only: the commit fails.
    let mut spec = p.spec.clone();
    spec.binds = vec![(repo.clone(), repo.clone(), false)];
    let out = p.run_with(&spec, &script);
    assert!(!stdout(&out).contains("COMMITTED"), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Read-only file system"),
        "{out:?}"
    );
    // Granted as a writable bind and a writable root: it commits.
    spec.binds = vec![(repo.clone(), repo.clone(), true)];
    spec.policy = Some("workspace-write".into());
    spec.writable = vec![p.source().to_path_buf(), repo.join(".git")];
    let out = p.run_with(&spec, &script);
    assert!(stdout(&out).contains("COMMITTED"), "{out:?}");
}

#[test]
fn exec_joins_a_live_sandbox() {
    if !ready("exec_joins_a_live_sandbox") {
        return;
    }
    let p = Project::new("join", None);
    let mut spec = p.spec.clone();
    spec.command = vec![
        "/bin/sh".into(),
        "-c".into(),
        "echo inside > /tmp/flag; while [ ! -e /tmp/stop ]; do sleep 0.1; done".into(),
    ];
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "helper_entry",
        "--nocapture",
        "--test-threads=1",
        "-q",
    ])
    .env(SPEC, serde_json::to_string(&spec).unwrap())
    .stdout(std::process::Stdio::null());
    let mut first = cmd.spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !p.spec.project_dir.join("live.json").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox never went live"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut joiner = p.spec.clone();
    joiner.exec = true;
    // The private /tmp of the live sandbox is visible: the command joined it.
    let out = p.run_with(&joiner, "cat /tmp/flag; touch /tmp/stop");
    let text = stdout(&out);
    let status = first.wait().unwrap();
    assert!(text.contains("inside"), "{out:?}");
    assert_eq!(status.code(), Some(0));
    no_sandbox_mounts_on_host(&p);
    // With no live sandbox, exec starts one of its own.
    let out = p.run_with(&joiner, "test -e /tmp/flag || echo FRESH");
    assert!(stdout(&out).contains("FRESH"), "{out:?}");
}

#[test]
fn an_unprivileged_user_runs_a_sandbox() {
    if !ready("an_unprivileged_user_runs_a_sandbox") {
        return;
    }
    let Some(ids) = test_user() else {
        return;
    };
    let exe = std::env::current_exe().unwrap();
    if !readable_by_all(&exe) {
        eprintln!("skipping: the test binary is not reachable by an ordinary user");
        return;
    }
    let _open = common::DevFuseMode::open_up();
    let p = Project::new("rootless", Some(ids));
    // A file of another owner in the project: squashed to the user like the rest, it is
    // theirs to write and chmod (the change reaches the delta only).
    let theirs = p.source().join("theirs.txt");
    fs::write(&theirs, "root's\n").unwrap();
    std::os::unix::fs::lchown(&theirs, Some(0), Some(0)).unwrap();
    let squashed = common::fuse_only(
        "an_unprivileged_user_runs_a_sandbox",
        "writing a file of another owner",
    );
    let before = listing(p.source());
    let out = p.run(&format!(
        "id -u; echo x > {src}/made && cat {src}/made; touch /usr/x 2>&1 | grep -c 'Read-only'; unshare -Urm sh -c 'umount {home}/.ssh 2>/dev/null || echo NESTED-REFUSED'; {theirs}",
        src = p.source().display(),
        home = p.spec.home_dir.display(),
        theirs = if squashed {
            format!("echo more >> {src}/theirs.txt && chmod 600 {src}/theirs.txt && stat -c 'THEIRS %u:%g %a' {src}/theirs.txt", src = p.source().display())
        } else {
            String::new()
        },
    ));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text.contains(&format!("{}\nx\n1\nNESTED-REFUSED", ids.0)),
        "{text}"
    );
    assert!(
        !squashed || text.contains(&format!("THEIRS {}:{} 600", ids.0, ids.1)),
        "{text}"
    );
    let rec = agentfs::sandbox::latest_record(&p.spec.project_dir).expect("a run record");
    assert_eq!(rec.backend, common::backend());
    assert_eq!(before, listing(p.source()));
    no_sandbox_mounts_on_host(&p);
}

#[test]
fn disabled_user_namespaces_refuse_the_launch_and_nothing_runs() {
    if !ready("disabled_user_namespaces_refuse_the_launch_and_nothing_runs") {
        return;
    }
    let p = Project::new("nouserns", None);
    let flag = p.root.join("ran");
    // The limit is per user namespace: switched off in a namespace of the test's own, the
    // host keeps its setting.
    let spec = {
        let mut s = p.spec.clone();
        s.command = vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("touch {}", flag.display()),
        ];
        s
    };
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(["-Ur", "sh", "-c"])
        .arg("echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" --exact helper_entry --nocapture --test-threads=1 -q")
        .arg(&exe)
        .env(SPEC, serde_json::to_string(&spec).unwrap())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(250), "{out:?}");
    assert!(
        stdout(&out).contains("SANDBOX_ERROR userns_disabled"),
        "{out:?}"
    );
    assert!(!flag.exists(), "the command ran");
    assert!(agentfs::sandbox::latest_record(&p.spec.project_dir).is_none());
}

const TEST_USER: &str = "agentfs-sbx";

/// The dedicated test user (created when absent): its uid and gid.
fn test_user() -> Option<(u32, u32)> {
    let lookup = || {
        let out = Command::new("id").args(["-u", TEST_USER]).output().ok()?;
        let uid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
        let out = Command::new("id").args(["-g", TEST_USER]).output().ok()?;
        let gid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
        Some((uid, gid))
    };
    if let Some(ids) = lookup() {
        return Some(ids);
    }
    let made = Command::new("useradd")
        .args(["--create-home", "--shell", "/bin/sh", TEST_USER])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !made {
        eprintln!("skipping: cannot create the test user {TEST_USER}");
        return None;
    }
    lookup()
}

fn readable_by_all(p: &Path) -> bool {
    p.ancestors().skip(1).all(|a| {
        fs::metadata(a)
            .map(|m| m.permissions().mode() & 0o001 != 0)
            .unwrap_or(false)
    })
}

/// The same commands through both backends, on two projects made alike: `diff --json` and
/// what `apply` writes into the host directory are the same.
fn both_backends_agree(user: Option<(u32, u32)>, tag: &str) {
    let setup = |_: &Path, src: &Path| {
        fs::create_dir_all(src.join("old")).unwrap();
        fs::write(src.join("old/was"), "was\n").unwrap();
        fs::create_dir_all(src.join("drop/inner")).unwrap();
        fs::write(src.join("drop/inner/x"), "x\n").unwrap();
        fs::write(src.join("big"), vec![7u8; 300_000]).unwrap();
    };
    let mut fuse = Project::new_with(&format!("{tag}-fuse"), user, &setup);
    fuse.spec.backend = "fuse".into();
    let mut ovl = Project::new_with(&format!("{tag}-ovl"), user, &setup);
    ovl.spec.backend = "overlayfs".into();
    let first = "cd \"$SRC\" && echo new > new.txt && echo more >> sub/keep.txt && rm hello.txt \
        && mkdir -p made/deep && echo d > made/deep/f && ln -s new.txt link && chmod 600 new.txt \
        && ln new.txt hard && rm -r drop && rm -r old && mkdir old && echo fresh > old/other \
        && printf 'x' | dd of=big bs=1 seek=5 conv=notrunc 2>/dev/null && mkfifo pipe \
        && /usr/bin/python3 -c \"import os; os.setxattr('sub/keep.txt', 'user.mine', b'v'); os.setxattr('made', 'user.overlay.opaque', b'n'); os.setxattr('.', 'user.top', b't')\" \
        && echo FIRST";
    let second = "cd \"$SRC\" && cat new.txt hard sub/keep.txt made/deep/f && ls old && ls -a . \
        && test ! -e hello.txt && test ! -e drop && readlink link && test -p pipe && rm pipe \
        && /usr/bin/python3 -c \"import os; print(sorted(os.listxattr('sub/keep.txt')), sorted(os.listxattr('made')), os.getxattr('made', 'user.overlay.opaque'), os.getxattr('.', 'user.top'))\" \
        && echo again >> hard && rm made/deep/f && stat -c '%a %h' new.txt && echo SECOND";
    let mut outputs = Vec::new();
    for p in [&fuse, &ovl] {
        let src = p.source().display().to_string();
        let mut texts = Vec::new();
        for script in [first, second] {
            let out = p.run(&format!("SRC={src}; {script}"));
            assert_eq!(out.status.code(), Some(0), "{}: {out:?}", p.spec.project);
            texts.push(stdout(&out));
        }
        assert!(
            !p.spec.project_dir.join("upper").exists(),
            "the upper stayed"
        );
        assert!(
            !p.spec.project_dir.join("work").exists(),
            "the work directory stayed"
        );
        let rec = agentfs::sandbox::latest_record(&p.spec.project_dir).expect("a run record");
        assert_eq!(rec.exit_status, Some(0));
        assert_eq!(rec.backend, p.spec.backend);
        no_sandbox_mounts_on_host(p);
        let db = p.spec.db.to_str().unwrap();
        let integ = agentfs(&["integrity", db]);
        assert!(integ.status.success(), "{integ:?}");
        let diff = agentfs(&["diff", db, "--json"]);
        assert!(diff.status.success(), "{diff:?}");
        let json = String::from_utf8_lossy(&diff.stdout).replace(&src, "SRC");
        let applied = agentfs(&["apply", db]);
        assert!(applied.status.success(), "{applied:?}");
        outputs.push((texts, json, common::tree_listing(p.source())));
    }
    assert!(outputs[0].0[1].contains("SECOND"), "{:?}", outputs[0].0);
    assert!(
        outputs[0].0[1].contains("['user.mine'] ['user.overlay.opaque'] b'n' b't'"),
        "{:?}",
        outputs[0].0
    );
    assert_eq!(outputs[0].0, outputs[1].0, "what the command saw");
    assert_eq!(outputs[0].1, outputs[1].1, "diff --json");
    assert_eq!(outputs[0].2, outputs[1].2, "the applied trees");
}

#[test]
fn the_overlayfs_backend_gives_what_fuse_gives_as_root() {
    if !ready("the_overlayfs_backend_gives_what_fuse_gives_as_root") {
        return;
    }
    both_backends_agree(None, "bk-root");
}

#[test]
fn the_overlayfs_backend_gives_what_fuse_gives_as_a_user() {
    if !ready("the_overlayfs_backend_gives_what_fuse_gives_as_a_user") {
        return;
    }
    let Some(ids) = test_user() else {
        return;
    };
    if !readable_by_all(&std::env::current_exe().unwrap()) {
        eprintln!("skipping: the test binary is not reachable by an ordinary user");
        return;
    }
    let _open = common::DevFuseMode::open_up();
    both_backends_agree(Some(ids), "bk-user");
}

/// An upper directory a previous overlayfs run left unimported (it ended before the import)
/// goes into the delta before the next launch exports it; one that cannot be used refuses the
/// launch with `upper_failed` and nothing runs.
#[test]
fn an_upper_left_behind_is_imported_before_the_next_overlayfs_run() {
    if !ready("an_upper_left_behind_is_imported_before_the_next_overlayfs_run") {
        return;
    }
    let mut p = Project::new("leftover", None);
    p.spec.backend = "overlayfs".into();
    let upper = p.spec.project_dir.join("upper");
    fs::create_dir(&upper).unwrap();
    fs::set_permissions(&upper, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(upper.join("left.txt"), "left\n").unwrap();
    // A whiteout: the previous run deleted hello.txt.
    let wh = std::ffi::CString::new(upper.join("hello.txt").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; mknod has no other preconditions.
    assert_eq!(unsafe { libc::mknod(wh.as_ptr(), libc::S_IFCHR, 0) }, 0);
    chown_tree(&upper, (65534, 65534));
    let out = p.run(&format!(
        "cd {} && cat left.txt && test ! -e hello.txt && echo RECOVERED",
        p.source().display()
    ));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout(&out).contains("left\nRECOVERED"), "{out:?}");
    assert!(!upper.exists());
    let diff = agentfs(&["diff", "--name-only", p.spec.db.to_str().unwrap()]);
    let names = String::from_utf8_lossy(&diff.stdout);
    let mut names: Vec<&str> = names.lines().collect();
    names.sort();
    assert_eq!(names, ["/hello.txt", "/left.txt"], "{diff:?}");

    // Something that is not a directory where the upper goes: refused before the command.
    fs::write(&upper, "not a directory").unwrap();
    let flag = p.root.join("ran");
    let out = p.run(&format!("touch {}", flag.display()));
    assert_eq!(out.status.code(), Some(250), "{out:?}");
    let code = "upper_failed";
    assert!(
        stdout(&out).contains(&format!("SANDBOX_ERROR {code}")),
        "{out:?}"
    );
    assert!(!flag.exists(), "the command ran");
    no_sandbox_mounts_on_host(&p);
}

/// On overlayfs a writable root inside the project is writable and the rest of the project is
/// refused by the kernel (read-only mount, EROFS), unlogged; masks inside the project hold;
/// a rule only a server can enforce refuses the launch.
#[test]
fn overlayfs_fences_the_project_at_the_kernel() {
    if !ready("overlayfs_fences_the_project_at_the_kernel") {
        return;
    }
    let mut p = Project::new("ovlfence", None);
    p.spec.backend = "overlayfs".into();
    p.spec.policy = Some("workspace-write".into());
    p.spec.writable = vec![p.source().join("sub")];
    let out = p.run(&format!(
        "cd {} && echo w > sub/ok && echo ROOT-WRITABLE; touch top 2>&1 | grep -c 'Read-only'; cat .env | wc -c",
        p.source().display()
    ));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout(&out).contains("ROOT-WRITABLE\n1\n0\n"), "{out:?}");
    let rec = agentfs::sandbox::latest_record(&p.spec.project_dir).expect("a run record");
    assert_eq!(rec.backend, "overlayfs");
    assert_eq!(rec.escape_attempts, 0);
    let diff = agentfs(&["diff", "--name-only", p.spec.db.to_str().unwrap()]);
    assert_eq!(
        String::from_utf8_lossy(&diff.stdout),
        "/sub/ok\n",
        "{diff:?}"
    );
    assert!(!p.spec.project_dir.join("audit").exists());
    no_sandbox_mounts_on_host(&p);
}
