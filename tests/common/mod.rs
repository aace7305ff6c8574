//! Shared helpers for tests that mount AgentFS for real.
#![allow(dead_code)]

pub mod ops;
pub mod s3;
pub mod world;

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_agentfs"))
}

pub fn agentfs(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run agentfs")
}

/// `agentfs init DB --base BASE`, which must succeed.
pub fn init_overlay(db: &Path, base: &Path) {
    let out = agentfs(&[
        "init",
        db.to_str().unwrap(),
        "--base",
        base.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether mount tests can run here. With AGENTFS_REQUIRE_FUSE=1 a missing /dev/fuse or a
/// non-root test run is a failure instead of a skip.
pub fn fuse_or_skip(test: &str) -> bool {
    let root = unsafe { libc::geteuid() } == 0;
    let dev = Path::new("/dev/fuse").exists();
    if root && dev {
        return true;
    }
    let why = if !dev {
        "/dev/fuse is missing"
    } else {
        "not running as root"
    };
    if agentfs::knobs::get().require_fuse {
        panic!("{test}: AGENTFS_REQUIRE_FUSE=1 but {why}");
    }
    eprintln!("SKIP {test}: {why}");
    false
}

/// The mount backend the projects of this test run take: AGENTFS_MOUNT_BACKEND, which every
/// launch of a new project inherits (validation/run-all.sh runs the sandbox, history and harness
/// suites once more with it set to overlayfs). "overlayfs" when it says so, else "fuse" (`auto`
/// picks FUSE where these tests run).
pub fn backend() -> &'static str {
    match std::env::var("AGENTFS_MOUNT_BACKEND").as_deref() {
        Ok("overlayfs") => "overlayfs",
        _ => "fuse",
    }
}

/// Whether `test` may check `what`, a property only the FUSE backend has (docs/sandbox.md,
/// "What differs on overlayfs"). On overlayfs it says on stderr what is skipped and why.
pub fn fuse_only(test: &str, what: &str) -> bool {
    let fuse = backend() == "fuse";
    if !fuse {
        eprintln!("SKIP {test}: {what} holds on the FUSE backend only, not on overlayfs");
    }
    fuse
}

/// True while `mnt` is a mount point.
pub fn is_mounted(mnt: &Path) -> bool {
    let canon = std::fs::canonicalize(mnt).unwrap_or_else(|_| mnt.to_path_buf());
    agentfs::sys::mounts::find(&canon).is_some()
}

/// A database mounted by a foreground server that this test owns by pid.
pub struct Mounted {
    pub dir: tempfile::TempDir,
    pub db: PathBuf,
    pub mnt: PathBuf,
    server: Option<Child>,
    env: Vec<(String, String)>,
    /// A command the server runs under (e.g. strace), empty for none.
    pub wrapper: Vec<String>,
}

impl Mounted {
    /// Create a scratch dir with `db.sqlite` (created on first mount) and `mnt/`, and mount.
    pub fn new() -> Self {
        Self::with_env(&[])
    }

    pub fn with_env(env: &[(&str, &str)]) -> Self {
        Self::build(env, &[])
    }

    /// Like [`Mounted::new`] but the server runs under `wrapper` (its last word is followed by
    /// the agentfs command line).
    pub fn wrapped(wrapper: &[&str]) -> Self {
        Self::build(&[], wrapper)
    }

    /// The scratch dir and its paths, not mounted yet (to prepare the database first).
    pub fn unmounted() -> Self {
        Self::scratch(&[], &[])
    }

    /// [`Mounted::unmounted`] with environment variables for the server.
    pub fn unmounted_with_env(env: &[(&str, &str)]) -> Self {
        Self::scratch(env, &[])
    }

    /// Mount with extra environment and under a wrapper (see [`Mounted::wrapped`]).
    pub fn build(env: &[(&str, &str)], wrapper: &[&str]) -> Self {
        let mut m = Self::scratch(env, wrapper);
        m.mount();
        m
    }

    fn scratch(env: &[(&str, &str)], wrapper: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("agentfs-test-")
            .tempdir_in(scratch_root())
            .expect("tempdir");
        let db = dir.path().join("db.sqlite");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mkdir mnt");
        Mounted {
            dir,
            db,
            mnt,
            server: None,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            wrapper: wrapper.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Start the server in the foreground and wait until the mount is live.
    pub fn mount(&mut self) {
        self.mount_with(&[]);
    }

    pub fn mount_with(&mut self, extra: &[&str]) {
        assert!(self.server.is_none(), "already mounted");
        let mut cmd = match self.wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin());
                c
            }
            None => Command::new(bin()),
        };
        cmd.arg("mount")
            .arg(&self.db)
            .arg(&self.mnt)
            .arg("-f")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start server");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !is_mounted(&self.mnt) {
            if let Ok(Some(st)) = child.try_wait() {
                panic!("server exited before mounting: {st}");
            }
            assert!(Instant::now() < deadline, "mount did not appear");
            std::thread::sleep(Duration::from_millis(10));
        }
        self.server = Some(child);
    }

    pub fn server_pid(&self) -> u32 {
        self.server.as_ref().map(|c| c.id()).expect("mounted")
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Clean unmount through the CLI; the server must exit 0 by itself.
    pub fn unmount(&mut self) {
        if self.server.is_none() {
            return;
        }
        let (out, status) = self.unmount_reporting();
        assert!(
            out.status.success(),
            "umount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(status.success(), "server exited with {status}");
    }

    /// Unmount through the CLI, which waits for the server's final commit; returns what
    /// `agentfs umount` said and the server's exit status (both fail after a lost commit).
    pub fn unmount_reporting(&mut self) -> (Output, std::process::ExitStatus) {
        let mut child = self.server.take().expect("mounted");
        let out = agentfs(&["umount", self.mnt.to_str().expect("utf8")]);
        let status = wait_timeout(&mut child, Duration::from_secs(30)).unwrap_or_else(|| {
            let _ = child.kill();
            panic!("server did not exit after unmount");
        });
        assert!(!is_mounted(&self.mnt), "still mounted after umount");
        (out, status)
    }

    /// Wait for the server to exit by itself (after a signal or an external unmount).
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let mut child = self.server.take().expect("mounted");
        wait_timeout(&mut child, Duration::from_secs(30)).unwrap_or_else(|| {
            let _ = child.kill();
            panic!("server did not exit");
        })
    }

    /// Kill the server with SIGKILL and clean up the dead mount.
    pub fn crash(&mut self) {
        let Some(mut child) = self.server.take() else {
            return;
        };
        let _ = child.kill();
        let _ = child.wait();
        force_cleanup(&self.mnt);
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut child) = self.server.take() {
            let _ = agentfs(&["umount", self.mnt.to_str().unwrap_or("")]);
            if wait_timeout(&mut child, Duration::from_secs(10)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        force_cleanup(&self.mnt);
    }
}

/// Aborts and detaches whatever is mounted at its path however the test ends (for mounts a
/// test made through the CLI rather than through [`Mounted`]).
pub struct UnmountOnDrop(pub PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        force_cleanup(&self.0);
    }
}

/// The options /proc/mounts shows for the mount at `mnt`.
pub fn mount_options(mnt: &Path) -> Option<String> {
    let canon = std::fs::canonicalize(mnt).ok()?;
    let table = std::fs::read_to_string("/proc/mounts").ok()?;
    table.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 3 && Path::new(f[1]) == canon).then(|| f[3].to_string())
    })
}

/// Abort and detach whatever is left at `mnt`.
pub fn force_cleanup(mnt: &Path) {
    if is_mounted(mnt) {
        let _ = agentfs(&["umount", "--force", mnt.to_str().unwrap_or("")]);
    }
}

pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Where scratch directories go: the target dir (a real disk), not a tmpfs /tmp.
pub fn scratch_root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&root).expect("scratch root");
    root
}

/// Inodes with no link left (never the root), as committed: what the server still has to reap.
pub fn orphans(db: &Path) -> i64 {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("open db read-only");
    c.query_row(
        "SELECT count(*) FROM fs_inode WHERE nlink = 0 AND ino != 1",
        [],
        |r| r.get(0),
    )
    .expect("count orphans")
}

/// `PRAGMA integrity_check` and our consistency checker on a database that is not mounted.
pub fn assert_consistent(db: &Path) {
    let conn = rusqlite::Connection::open(db).expect("open db");
    let ic: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(ic, "ok");
    drop(conn);
    let out = agentfs(&["integrity", db.to_str().expect("utf8")]);
    assert!(
        out.status.success(),
        "integrity findings:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The kernel's switch for FUSE-over-io_uring. It is global, so tests that set it hold a lock
/// file meanwhile (see [`UringParam`]).
pub const URING_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Holds the lock and the parameter's old value; restores it when dropped.
pub struct UringParam {
    old: String,
    _lock: fs::File,
}

impl UringParam {
    /// Take the lock and set enable_uring to `value` ("Y"/"N"); None when it is not writable.
    pub fn set(value: &str) -> Option<Self> {
        let lock = fs::File::create(std::env::temp_dir().join("agentfs-enable-uring.lock")).ok()?;
        // SAFETY: flock on an fd owned by `lock`.
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        let old = fs::read_to_string(URING_PARAM).ok()?.trim().to_string();
        fs::write(URING_PARAM, value).ok()?;
        Some(UringParam { old, _lock: lock })
    }
}

impl Drop for UringParam {
    fn drop(&mut self) {
        let _ = fs::write(URING_PARAM, &self.old);
    }
}

/// Run `python3 ARGS` from the crate root with extra environment; (success, stdout + stderr).
pub fn python(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new("python3")
        .args(args)
        .envs(env.iter().copied())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("python3");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Requests the server `pid` has served so far, on both transports, once the count settled.
pub fn served(pid: u32) -> u64 {
    let rec = settled_record(pid);
    rec.ring_requests + rec.devfuse_requests
}

/// The status record of server `pid`, once its counters have settled: read until two readings
/// 0.6 s apart agree (the record is rewritten every half second, so one rewrite lies between).
/// The server writes its first record once INIT is answered, just after the mount appears.
pub fn settled_record(pid: u32) -> agentfs::sys::registry::ServerRecord {
    let read = || {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found = agentfs::sys::registry::live()
                .into_iter()
                .find(|r| r.pid == pid);
            match found {
                Some(r) => return r,
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                None => panic!("server {pid} wrote no status record"),
            }
        }
    };
    // Resident memory moves on its own; the counters are what must settle.
    let counters =
        |r: &agentfs::sys::registry::ServerRecord| agentfs::sys::registry::ServerRecord {
            memory: Default::default(),
            ..r.clone()
        };
    let mut last = read();
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(600));
        let now = read();
        if counters(&now) == counters(&last) {
            return now;
        }
        last = now;
    }
    panic!("the status record of server {pid} never settled");
}

/// /dev/fuse opened to every user for the life of the value (it is root-only on this kind of
/// machine), then restored. The mode is global: the first holder in a process takes a lock file
/// that other test processes wait for, later holders in the same process share it, and the last
/// one to drop restores the mode.
pub struct DevFuseMode(());

struct DevFuseShared {
    holders: usize,
    original: u32,
    _lock: fs::File,
}

static DEV_FUSE_MODE: std::sync::Mutex<Option<DevFuseShared>> = std::sync::Mutex::new(None);

impl DevFuseMode {
    pub fn open_up() -> Self {
        let mut shared = DEV_FUSE_MODE.lock().unwrap_or_else(|e| e.into_inner());
        match shared.as_mut() {
            Some(s) => s.holders += 1,
            None => {
                let lock =
                    fs::File::create(std::env::temp_dir().join("agentfs-dev-fuse-mode.lock"))
                        .expect("lock file");
                // SAFETY: flock on an fd owned by `lock`.
                unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
                let original = fs::metadata("/dev/fuse").unwrap().permissions().mode();
                fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o20666)).unwrap();
                *shared = Some(DevFuseShared {
                    holders: 1,
                    original,
                    _lock: lock,
                });
            }
        }
        DevFuseMode(())
    }
}

impl Drop for DevFuseMode {
    fn drop(&mut self) {
        let mut shared = DEV_FUSE_MODE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = shared.as_mut() {
            s.holders -= 1;
            if s.holders == 0 {
                let _ = fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(s.original));
                *shared = None;
            }
        }
    }
}

/// /dev/fuse left at its default mode for the life of the value, with the lock
/// [`DevFuseMode::open_up`] takes held, so no test opens it to every user meanwhile.
pub struct DevFuseClosed(#[allow(dead_code)] fs::File);

impl DevFuseClosed {
    /// None when the default mode already lets every user read and write it.
    pub fn hold() -> Option<Self> {
        let lock = fs::File::create(std::env::temp_dir().join("agentfs-dev-fuse-mode.lock"))
            .expect("lock file");
        // SAFETY: flock on an fd owned by `lock`.
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        let mode = fs::metadata("/dev/fuse").ok()?.permissions().mode();
        (mode & 0o006 == 0).then_some(DevFuseClosed(lock))
    }
}

/// Whether every directory above `p` lets other users through.
pub fn readable_by_all(p: &Path) -> bool {
    p.ancestors().skip(1).all(|a| {
        fs::metadata(a)
            .map(|m| m.permissions().mode() & 0o001 != 0)
            .unwrap_or(false)
    })
}

/// Every entry under `dir`: its path relative to `dir`, mode, and content (files) or target
/// (symlinks), sorted. Two equal listings mean an unchanged tree.
pub fn tree_listing(dir: &Path) -> Vec<(String, u32, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt as _;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let md = fs::symlink_metadata(&p).unwrap();
            let body = if md.is_file() {
                fs::read(&p).unwrap()
            } else if md.is_symlink() {
                fs::read_link(&p)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else {
                stack.push(p.clone());
                Vec::new()
            };
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            out.push((rel, md.mode(), body));
        }
    }
    out.sort();
    out
}
