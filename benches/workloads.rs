//! Mount-level workloads through the real kernel: AgentFS against its peers, same workload on
//! each, one table out.
//!
//! `cargo bench --bench workloads` (root only; about 6–9 minutes on a 2-core VM), or with
//! `AGENTFS_BENCH_QUICK=1` a subset with smaller sizes (under 2 minutes).
//!
//! Targets (columns): AgentFS (the release binary, `agentfs mount DB MNT -f` as our child, a
//! fresh database per repetition, the database on the same ext4 disk as the native peer), a
//! native ext4 directory (the limit every ratio is taken against), a tmpfs we mount, and
//! libfuse's passthrough_hp example mirroring an ext4 directory (module `passthrough_hp`: a C++
//! server on libfuse 3.18.3 with its own fast defaults, one column over /dev/fuse and one over
//! FUSE-over-io_uring). Those columns need its binary: `sh benches/workloads/passthrough_hp.sh`
//! builds it into `target/bench-tools/` from libfuse's release source, or
//! `AGENTFS_BENCH_PASSTHROUGH_HP=/path` names one; without it the columns say how to get it. The
//! overlay form (module `overlay`) follows: one lower tree through kernel overlayfs,
//! fuse-overlayfs and AgentFS overlay mode side by side, with the delta's growth. Then the
//! sandbox (module `sandbox`; alone: `-- sandbox`): the same workloads inside a sandbox on each
//! mount backend, beside a plain mount of the project and a native ext4 directory.
//!
//! Workloads (rows), each repeated `REPS` times with targets interleaved inside a repetition so
//! drift on a noisy machine hits every column alike; cells show the median and min–max:
//! * `seq_write`: N MiB in 1 MiB `write(2)`s, then fsync (timed together).
//! * `seq_read_cold`: the same file read in 1 MiB blocks after `sync; echo 3 > drop_caches`;
//!   AgentFS is also remounted, so its SQLite page cache is cold too (and passthrough_hp, so its
//!   open descriptors of the ext4 files are closed).
//! * `rand_write_4k`: 4 KiB `pwrite`s at random aligned offsets of a prefilled file, as many as
//!   the file has blocks, then fsync. Reported in writes/s.
//! * `create` / `stat` / `readdir` / `unlink`: 10,000 empty files in one directory (readdir is
//!   three full listings, reported in entries/s; stat is warm, right after create).
//! * `small_write` / `small_read`: 2,000 files of 1–16 KiB written (no fsync), then, after
//!   dropping caches (and remounting AgentFS), read back. Files/s.
//! * `tree_copy`: `cp -r` of a real source tree into the target; `git_add_commit`:
//!   `git init && git add -A && git commit`; `git_status`; `find_stat`: `find . | xargs stat`;
//!   `find_stat_cold` and `read_all_cold`: the same stat and a `cat` of every file, each after
//!   `drop_caches` but without a remount (the kernel reclaimed its caches; a server's own stay);
//!   `untar`: `tar -xf` of an uncompressed tar of the same tree (made once per run in the
//!   scratch space on the ext4 disk, never on a target) into a fresh directory; `rm_rf`:
//!   `rm -rf` of that directory. All in files of the tree per second.
//! * `rss_peak` / `rss_end` / `rss_idle`: the AgentFS server's resident set in MiB — the highest
//!   of every server of the repetition (VmHWM, remounts included), at the end of its workloads,
//!   and after 30 s without requests (the idle give-back, `AGENTFS_MEMORY_IDLE_MS`). Lower is
//!   better; the other columns have none.
//!
//! Columns at other memory budgets: `AGENTFS_BENCH_BUDGETS=16,256` adds `agentfs@16MiB` and
//! `agentfs@256MiB` beside the default budget's `agentfs`; with other knobs:
//! `AGENTFS_BENCH_VARIANTS=AGENTFS_WAL_CHECKPOINT_PAGES=0` adds
//! `agentfs[WAL_CHECKPOINT_PAGES=0]` (entries comma-separated, knobs of one entry `;`-separated).
//!
//! The tree: the Rust standard library sources (`$(rustc --print sysroot)/lib/rustlib/src/rust/
//! library`) when rust-src is installed, else crate sources from the cargo registry
//! (`~/.cargo/registry/src/*/`), whole crates in name order until the file budget is reached,
//! skipping the `*-pc-windows-gnu` crates (import libraries, not source). The table names which.
//!
//! Results: a markdown table on stdout, and JSON in `target/bench-results/workloads-<unix>.json`
//! plus `target/bench-results/latest.json`.
//!
//! Requests (module `requests`; alone: `-- requests`): every workload once on an AgentFS mount
//! with default knobs, counting the FUSE requests each sends with the kernel tracepoint
//! `fuse:fuse_request_send` — a table of totals, requests per file (or per unit of the row) and
//! the top opcodes, so a reader sees where the round trips go.
//!
//! The sandbox form (module `sandbox`) follows: the same workloads inside `agentfs exec` of a
//! project beside a plain `agentfs mount` of its delta. `cargo bench --bench workloads --
//! sandbox` runs only that part.
//!
//! Cleanup: every mount is held by a guard whose Drop unmounts it (and, for AgentFS and
//! passthrough_hp, ends the server by pid), so a panic or an early return leaves no /proc/mounts
//! entries behind.

use std::ffi::CString;
use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[path = "workloads/overlay.rs"]
mod overlay;
#[path = "workloads/passthrough_hp.rs"]
mod passthrough_hp;
#[path = "workloads/replica.rs"]
mod replica;
#[path = "workloads/requests.rs"]
mod requests;
#[path = "workloads/sandbox.rs"]
mod sandbox;

const MIB: usize = 1 << 20;
const EXT4_SUPER_MAGIC: i64 = 0xEF53;

/// Sizes of one run.
#[derive(Clone, Copy, Debug)]
struct Plan {
    quick: bool,
    reps: usize,
    seq_mib: usize,
    rand_mib: usize,
    files: usize,
    small_files: usize,
    tree_files: usize,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                quick,
                reps: 2,
                seq_mib: 64,
                rand_mib: 16,
                files: 2_000,
                small_files: 500,
                tree_files: 800,
            }
        } else {
            Plan {
                quick,
                reps: 3,
                seq_mib: 256,
                rand_mib: 64,
                files: 10_000,
                small_files: 2_000,
                tree_files: 4_000,
            }
        }
    }
}

// ----------------------------------------------------------------------------------------------
// Small system helpers
// ----------------------------------------------------------------------------------------------

fn statfs_type(p: &Path) -> Option<i64> {
    let c = CString::new(p.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized out-parameter.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        if libc::statfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        #[allow(clippy::unnecessary_cast)]
        Some(st.f_type as i64)
    }
}

fn is_mounted(mnt: &Path) -> bool {
    let want = mnt.to_string_lossy().into_owned();
    fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
}

fn fstype_of(mnt: &Path) -> Option<String> {
    let want = mnt.to_string_lossy().into_owned();
    fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .next_back()
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn drop_caches() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    if let Err(e) = fs::write("/proc/sys/vm/drop_caches", "3\n") {
        eprintln!("warning: drop_caches: {e}");
    }
}

fn umount(mnt: &Path, flags: i32) -> std::io::Result<()> {
    let c = CString::new(mnt.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// xorshift64*: deterministic offsets and sizes, the same for every target.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

// ----------------------------------------------------------------------------------------------
// Mount guards
// ----------------------------------------------------------------------------------------------

/// An AgentFS server serving `mnt` in the foreground as our child. Drop unmounts and ends it.
/// The highest resident set of any AgentFS server of the current repetition, in KiB.
static PEAK_RSS_KIB: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Start a FUSE server as our child, no stdin, its stdout and stderr appended to `log`.
fn spawn_logged(cmd: &mut Command, log: &Path) -> Result<Child, String> {
    let logf = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(logf.try_clone().map_err(|e| e.to_string())?)
        .stderr(logf)
        .spawn()
        .map_err(|e| format!("spawn {:?}: {e}", cmd.get_program()))
}

/// Wait until a FUSE server we started (`child`, named `what`) has mounted `mnt`; if it exits
/// first, the error carries its log.
fn wait_mounted(
    mnt: &Path,
    child: &mut Option<Child>,
    log: &Path,
    what: &str,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if fstype_of(mnt).is_some_and(|t| t.starts_with("fuse")) {
            return Ok(());
        }
        if let Some(c) = child.as_mut() {
            if let Ok(Some(st)) = c.try_wait() {
                *child = None;
                let log = fs::read_to_string(log).unwrap_or_default();
                return Err(format!("{what} exited with {st}: {}", log.trim()));
            }
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: not mounted after 15 s"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Wait up to 30 s for a server we started, whose mount is gone, to exit; past that, kill it
/// by pid (SIGKILL to our own child only) and say so.
fn reap(mut c: Child) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match c.try_wait() {
            Ok(Some(_)) => return Ok(()),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = c.kill();
                let _ = c.wait();
                return Err(format!("server pid {} killed", c.id()));
            }
        }
    }
}

/// How long the server idles before its idle resident set is sampled.
const IDLE_SAMPLE: Duration = Duration::from_secs(30);

struct AgentFsMount {
    bin: PathBuf,
    db: PathBuf,
    mnt: PathBuf,
    log: PathBuf,
    /// Knobs the server runs with (a column's memory budget or variant).
    env: Vec<(String, String)>,
    child: Option<Child>,
    /// The replica URL of `--replicate` (module `replica`), when the mount replicates.
    replicate: Option<String>,
    /// Whether this guard still owns the mount (false after `stop`, so a guard that was
    /// replaced by a remount never unmounts its successor).
    live: bool,
}

impl AgentFsMount {
    fn start(bin: &Path, db: &Path, mnt: &Path, log: &Path) -> Result<AgentFsMount, String> {
        AgentFsMount::start_with(bin, db, mnt, log, &[], None)
    }

    /// [`AgentFsMount::start`] with knobs `env` (a memory budget, a variant), replicating to
    /// `replicate` when given.
    fn start_with(
        bin: &Path,
        db: &Path,
        mnt: &Path,
        log: &Path,
        env: &[(String, String)],
        replicate: Option<&str>,
    ) -> Result<AgentFsMount, String> {
        let mut cmd = Command::new(bin);
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        cmd.arg("mount").arg(db).arg(mnt).arg("-f");
        if let Some(url) = replicate {
            replica::apply_env(cmd.arg("--replicate").arg(url));
        }
        let child = spawn_logged(&mut cmd, log)?;
        let mut m = AgentFsMount {
            bin: bin.to_path_buf(),
            db: db.to_path_buf(),
            mnt: mnt.to_path_buf(),
            log: log.to_path_buf(),
            env: env.to_vec(),
            child: Some(child),
            replicate: replicate.map(String::from),
            live: true,
        };
        wait_mounted(mnt, &mut m.child, log, "agentfs mount")?;
        Ok(m)
    }

    /// A figure of the server's /proc status in MiB ("VmRSS", "VmHWM").
    fn memory(&self, field: &str) -> Option<f64> {
        let pid = self.child.as_ref()?.id();
        let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = text.lines().find(|l| l.starts_with(field))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    }

    /// `agentfs umount MNT`, then wait for our child; force and kill by pid if that fails.
    fn stop(&mut self) -> Result<(), String> {
        let mut err = None;
        if !std::mem::replace(&mut self.live, false) {
            return Ok(());
        }
        // The peak of this server, before it goes (a remount starts a new one).
        if let Some(hwm) = self.memory("VmHWM") {
            let kib = (hwm * 1024.0) as u64;
            PEAK_RSS_KIB.fetch_max(kib, std::sync::atomic::Ordering::Relaxed);
        }
        if is_mounted(&self.mnt) {
            if let Err(e) = run(Command::new(&self.bin).arg("umount").arg(&self.mnt)) {
                err = Some(e);
                let _ = run(Command::new(&self.bin)
                    .args(["umount", "--force"])
                    .arg(&self.mnt));
                if is_mounted(&self.mnt) {
                    let _ = umount(&self.mnt, libc::MNT_DETACH);
                }
            }
        }
        if let Err(e) = self.child.take().map_or(Ok(()), reap) {
            err.get_or_insert(e);
        }
        err.map_or(Ok(()), Err)
    }

    /// Unmount and mount the same database again: every cache, kernel and SQLite, is cold.
    fn remount(&mut self) -> Result<(), String> {
        self.stop()?;
        drop_caches();
        let fresh = AgentFsMount::start_with(
            &self.bin,
            &self.db,
            &self.mnt,
            &self.log,
            &self.env,
            self.replicate.as_deref(),
        )?;
        *self = fresh;
        Ok(())
    }
}

impl Drop for AgentFsMount {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("warning: {}: {e}", self.mnt.display());
        }
    }
}

/// A tmpfs we mounted. Drop unmounts it (lazily if busy).
struct TmpfsMount {
    mnt: PathBuf,
}

impl TmpfsMount {
    fn mount(mnt: &Path) -> Result<TmpfsMount, String> {
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=3g,mode=0755", "benchtmpfs"])
            .arg(mnt))?;
        Ok(TmpfsMount {
            mnt: mnt.to_path_buf(),
        })
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) && umount(&self.mnt, 0).is_err() {
            let _ = umount(&self.mnt, libc::MNT_DETACH);
        }
    }
}

// ----------------------------------------------------------------------------------------------
// Targets
// ----------------------------------------------------------------------------------------------

enum Backend {
    AgentFs {
        bin: PathBuf,
        dir: PathBuf,
        /// Knobs the server runs with (empty: the defaults).
        env: Vec<(String, String)>,
        mount: Option<Box<AgentFsMount>>,
        /// Replicate each repetition's fresh database to a fresh path under this URL.
        replicate: Option<replica::Replicas>,
    },
    Ext4 {
        dir: PathBuf,
    },
    Tmpfs {
        _mount: TmpfsMount,
        dir: PathBuf,
    },
    /// libfuse's passthrough_hp over an ext4 directory (module `passthrough_hp`).
    Passthrough(passthrough_hp::Passthrough),
    /// A directory this process works in for the bench that started it (module `sandbox`),
    /// which makes the caches cold when asked.
    Runner {
        dir: PathBuf,
    },
}

struct Target {
    name: &'static str,
    backend: Backend,
}

impl Target {
    /// The directory a repetition works in (created fresh by `begin`).
    fn root(&self) -> PathBuf {
        match &self.backend {
            Backend::AgentFs { dir, .. } => dir.join("mnt").join("w"),
            Backend::Ext4 { dir } | Backend::Tmpfs { dir, .. } | Backend::Runner { dir } => {
                dir.join("w")
            }
            Backend::Passthrough(p) => p.root(),
        }
    }

    /// Start a repetition: AgentFS gets a fresh database, the others an empty directory.
    fn begin(&mut self) -> Result<(), String> {
        if let Backend::AgentFs {
            bin,
            dir,
            env,
            mount,
            replicate,
        } = &mut self.backend
        {
            if let Some(mut m) = mount.take() {
                m.stop()?;
            }
            for suffix in ["", "-wal", "-shm"] {
                let _ = fs::remove_file(dir.join(format!("fs.db{suffix}")));
            }
            let mnt = dir.join("mnt");
            fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
            let url = replicate.as_mut().map(replica::Replicas::next);
            *mount = Some(Box::new(AgentFsMount::start_with(
                bin,
                &dir.join("fs.db"),
                &mnt,
                &dir.join("server.log"),
                env,
                url.as_deref(),
            )?));
        }
        if let Backend::Passthrough(p) = &mut self.backend {
            p.begin()?;
        }
        let root = self.root();
        if root.exists() {
            fs::remove_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        }
        fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))
    }

    /// Drop the kernel's caches only: a server's own caches stay, as they would when the
    /// kernel reclaims memory under a long-lived mount.
    fn kernel_cold(&mut self) {
        match self.backend {
            Backend::Runner { .. } => sandbox::ask("C"),
            _ => drop_caches(),
        }
    }

    /// Make every cache cold before a read workload.
    fn cold(&mut self) -> Result<(), String> {
        if let Backend::Runner { .. } = self.backend {
            sandbox::ask("C");
            return Ok(());
        }
        drop_caches();
        match &mut self.backend {
            Backend::AgentFs { mount: Some(m), .. } => m.remount()?,
            Backend::Passthrough(p) => p.remount()?,
            _ => {}
        }
        Ok(())
    }

    /// Remove the repetition's files (untimed) so the next one starts from nothing.
    fn end(&mut self) -> Result<(), String> {
        if let Backend::AgentFs { mount, .. } = &mut self.backend {
            if let Some(mut m) = mount.take() {
                return m.stop();
            }
            return Ok(());
        }
        if let Backend::Passthrough(p) = &mut self.backend {
            return p.end();
        }
        let root = self.root();
        fs::remove_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))
    }
}

// ----------------------------------------------------------------------------------------------
// Workloads
// ----------------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct Workload {
    key: &'static str,
    unit: &'static str,
    what: &'static str,
}

const WORKLOADS: &[Workload] = &[
    Workload {
        key: "seq_write",
        unit: "MiB/s",
        what: "sequential write, 1 MiB blocks, + fsync",
    },
    Workload {
        key: "seq_read_cold",
        unit: "MiB/s",
        what: "sequential read, 1 MiB blocks, caches dropped",
    },
    Workload {
        key: "rand_write_4k",
        unit: "writes/s",
        what: "4 KiB random pwrite over the file, + fsync",
    },
    Workload {
        key: "create",
        unit: "files/s",
        what: "create empty files in one directory",
    },
    Workload {
        key: "stat",
        unit: "files/s",
        what: "stat each of them",
    },
    Workload {
        key: "readdir",
        unit: "entries/s",
        what: "list the directory (3 passes)",
    },
    Workload {
        key: "unlink",
        unit: "files/s",
        what: "unlink each of them",
    },
    Workload {
        key: "small_write",
        unit: "files/s",
        what: "write small files of 1-16 KiB",
    },
    Workload {
        key: "small_read",
        unit: "files/s",
        what: "read them back, caches dropped",
    },
    Workload {
        key: "tree_copy",
        unit: "files/s",
        what: "cp -r of the source tree",
    },
    Workload {
        key: "git_add_commit",
        unit: "files/s",
        what: "git init && git add -A && git commit",
    },
    Workload {
        key: "git_status",
        unit: "files/s",
        what: "git status",
    },
    Workload {
        key: "find_stat",
        unit: "files/s",
        what: "find . | xargs stat",
    },
    Workload {
        key: "find_stat_cold",
        unit: "files/s",
        what: "find . | xargs stat after drop_caches (a server keeps its own caches)",
    },
    Workload {
        key: "read_all_cold",
        unit: "files/s",
        what: "cat of every file of the tree after drop_caches",
    },
    Workload {
        key: "untar",
        unit: "files/s",
        what: "tar -xf of the tree (an uncompressed tar on ext4) into a fresh directory",
    },
    Workload {
        key: "rm_rf",
        unit: "files/s",
        what: "rm -rf of the unpacked tree",
    },
    Workload {
        key: "rss_peak",
        unit: "MiB",
        what: "AgentFS server: highest resident set over the repetition (every remount's server)",
    },
    Workload {
        key: "rss_end",
        unit: "MiB",
        what: "AgentFS server: resident set when the repetition's workloads are done",
    },
    Workload {
        key: "rss_idle",
        unit: "MiB",
        what: "AgentFS server: resident set 30 s later, without requests",
    },
];

/// One measurement: workload key, value (higher is better, except the `rss_` rows), seconds
/// taken.
type Sample = (&'static str, f64, f64);

/// Time one workload. Every timed section is one sample, pushed right after it (the requests
/// mode counts each section's FUSE requests and pairs them with the samples in that order).
fn timed<T>(f: impl FnOnce() -> Result<T, String>) -> Result<(T, f64), String> {
    requests::section_start()?;
    let t = Instant::now();
    let v = f();
    let secs = t.elapsed().as_secs_f64();
    let counted = requests::section_end();
    let v = v?;
    counted?;
    Ok((v, secs))
}

fn io<T>(r: std::io::Result<T>, what: &Path) -> Result<T, String> {
    r.map_err(|e| format!("{}: {e}", what.display()))
}

fn seq_and_rand(t: &mut Target, plan: &Plan, out: &mut Vec<Sample>) -> Result<(), String> {
    let root = t.root();
    let path = root.join("seq.bin");
    let block = vec![0x5au8; MIB];
    let (_, secs) = timed(|| {
        let mut f = io(File::create(&path), &path)?;
        for _ in 0..plan.seq_mib {
            io(f.write_all(&block), &path)?;
        }
        io(f.sync_all(), &path)
    })?;
    out.push(("seq_write", plan.seq_mib as f64 / secs, secs));

    t.cold()?;
    let mut buf = vec![0u8; MIB];
    let (n, secs) = timed(|| {
        let mut f = io(File::open(&path), &path)?;
        let mut total = 0usize;
        loop {
            let n = io(f.read(&mut buf), &path)?;
            if n == 0 {
                break;
            }
            total += n;
        }
        Ok(total)
    })?;
    if n != plan.seq_mib * MIB {
        return Err(format!(
            "{}: read {n} bytes back, wrote {}",
            t.name,
            plan.seq_mib * MIB
        ));
    }
    out.push(("seq_read_cold", plan.seq_mib as f64 / secs, secs));
    io(fs::remove_file(&path), &path)?;

    // Random 4 KiB writes over a prefilled file (prefill and its fsync untimed).
    let path = root.join("rand.bin");
    {
        let mut f = io(File::create(&path), &path)?;
        for _ in 0..plan.rand_mib {
            io(f.write_all(&block), &path)?;
        }
        io(f.sync_all(), &path)?;
    }
    let blocks = (plan.rand_mib * MIB / 4096) as u64;
    let page = vec![0xa5u8; 4096];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (_, secs) = timed(|| {
        let f = io(OpenOptions::new().write(true).open(&path), &path)?;
        for _ in 0..blocks {
            let off = (rng.next() % blocks) * 4096;
            io(f.write_all_at(&page, off), &path)?;
        }
        io(f.sync_all(), &path)
    })?;
    out.push(("rand_write_4k", blocks as f64 / secs, secs));
    io(fs::remove_file(&path), &path)
}

fn many_files(t: &mut Target, plan: &Plan, out: &mut Vec<Sample>) -> Result<(), String> {
    let dir = t.root().join("many");
    io(fs::create_dir(&dir), &dir)?;
    let names: Vec<PathBuf> = (0..plan.files)
        .map(|i| dir.join(format!("file-{i:05}")))
        .collect();
    let n = names.len() as f64;
    let (_, secs) = timed(|| {
        for p in &names {
            io(File::create(p), p)?;
        }
        Ok(())
    })?;
    out.push(("create", n / secs, secs));
    let (_, secs) = timed(|| {
        for p in &names {
            io(fs::symlink_metadata(p), p)?;
        }
        Ok(())
    })?;
    out.push(("stat", n / secs, secs));
    let (seen, secs) = timed(|| {
        let mut seen = 0usize;
        for _ in 0..3 {
            for e in io(fs::read_dir(&dir), &dir)? {
                io(e, &dir)?;
                seen += 1;
            }
        }
        Ok(seen)
    })?;
    if seen != 3 * plan.files {
        return Err(format!("{}: readdir saw {seen} entries", t.name));
    }
    out.push(("readdir", seen as f64 / secs, secs));
    let (_, secs) = timed(|| {
        for p in &names {
            io(fs::remove_file(p), p)?;
        }
        Ok(())
    })?;
    out.push(("unlink", n / secs, secs));
    io(fs::remove_dir(&dir), &dir)
}

fn small_files(t: &mut Target, plan: &Plan, out: &mut Vec<Sample>) -> Result<(), String> {
    let dir = t.root().join("small");
    io(fs::create_dir(&dir), &dir)?;
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let files: Vec<(PathBuf, usize)> = (0..plan.small_files)
        .map(|i| {
            // 1..=16 KiB, spread over 16 subdirectories like a real project.
            let size = 1024 + (rng.next() % (15 * 1024 + 1)) as usize;
            (dir.join(format!("d{:02}/f{i:05}", i % 16)), size)
        })
        .collect();
    for d in 0..16 {
        let p = dir.join(format!("d{d:02}"));
        io(fs::create_dir(&p), &p)?;
    }
    let data = vec![0x42u8; 16 * 1024];
    let n = files.len() as f64;
    let (_, secs) = timed(|| {
        for (p, size) in &files {
            io(fs::write(p, &data[..*size]), p)?;
        }
        Ok(())
    })?;
    out.push(("small_write", n / secs, secs));
    t.cold()?;
    let mut buf = Vec::with_capacity(16 * 1024);
    let (_, secs) = timed(|| {
        for (p, size) in &files {
            buf.clear();
            io(io(File::open(p), p)?.read_to_end(&mut buf), p)?;
            if buf.len() != *size {
                return Err(format!(
                    "{}: {} bytes, wrote {size}",
                    p.display(),
                    buf.len()
                ));
            }
        }
        Ok(())
    })?;
    out.push(("small_read", n / secs, secs));
    io(fs::remove_dir_all(&dir), &dir)
}

/// The source tree to unpack: where it comes from, what it is, and the top-level entries to
/// copy (each `cp -r`'d into the target).
struct Tree {
    label: String,
    entries: Vec<PathBuf>,
    files: usize,
    bytes: u64,
    /// An uncompressed tar of the entries, each under its own name as `cp -r` places it.
    tar: PathBuf,
}

fn count_tree(p: &Path, files: &mut usize, bytes: &mut u64) {
    let Ok(rd) = fs::read_dir(p) else { return };
    for e in rd.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            count_tree(&e.path(), files, bytes);
        } else {
            *files += 1;
            *bytes += e.metadata().map(|m| m.len()).unwrap_or(0);
        }
    }
}

/// The tree of at most about `budget` files, and its tar written to `tar`.
fn find_tree(budget: usize, tar: &Path) -> Result<Tree, String> {
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let std_src = Path::new(&sysroot).join("lib/rustlib/src/rust/library");
    let (label, candidates): (String, Vec<PathBuf>) = if std_src.is_dir() {
        let mut v: Vec<PathBuf> = io(fs::read_dir(&std_src), &std_src)?
            .flatten()
            .map(|e| e.path())
            .collect();
        v.sort();
        (format!("Rust std sources ({})", std_src.display()), v)
    } else {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        let reg = home.join(".cargo/registry/src");
        let mut v = Vec::new();
        for index in io(fs::read_dir(&reg), &reg)?.flatten() {
            for c in fs::read_dir(index.path()).into_iter().flatten().flatten() {
                let name = c.file_name().to_string_lossy().into_owned();
                if !name.contains("pc-windows-gnu") && c.path().is_dir() {
                    v.push(c.path());
                }
            }
        }
        v.sort_by_key(|p| p.file_name().map(|n| n.to_os_string()));
        (
            "cargo registry crate sources (~/.cargo/registry/src, rust-src not installed)"
                .to_string(),
            v,
        )
    };
    let mut t = Tree {
        label,
        entries: Vec::new(),
        files: 0,
        bytes: 0,
        tar: tar.to_path_buf(),
    };
    for c in candidates {
        if t.files >= budget {
            break;
        }
        count_tree(&c, &mut t.files, &mut t.bytes);
        t.entries.push(c);
    }
    if t.files == 0 {
        return Err("no source tree found".into());
    }
    let mut cmd = Command::new("tar");
    cmd.arg("-cf").arg(tar);
    for e in &t.entries {
        let (Some(dir), Some(name)) = (e.parent(), e.file_name()) else {
            return Err(format!("{}: not an entry of a directory", e.display()));
        };
        cmd.arg("-C").arg(dir).arg(name);
    }
    run(&mut cmd)?;
    Ok(t)
}

fn git(dir: &Path) -> Command {
    let mut c = Command::new("git");
    c.current_dir(dir)
        .args(["-c", "user.name=bench", "-c", "user.email=bench@localhost"])
        .args(["-c", "init.defaultBranch=main", "-c", "safe.directory=*"])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .stdout(Stdio::null());
    c
}

fn source_tree(t: &mut Target, tree: &Tree, out: &mut Vec<Sample>) -> Result<(), String> {
    let dir = t.root().join("tree");
    io(fs::create_dir(&dir), &dir)?;
    let n = tree.files as f64;
    let (_, secs) = timed(|| run(Command::new("cp").arg("-r").args(&tree.entries).arg(&dir)))?;
    out.push(("tree_copy", n / secs, secs));
    // Git compares whole seconds: a file written in the second its index is written is "racily
    // clean", and `git status` reads it again. Without this pause the git_status row was
    // bimodal (16k or 60k files/s on one target) by when the copy ended within its second.
    std::thread::sleep(Duration::from_millis(1100));
    let (_, secs) = timed(|| {
        run(git(&dir).arg("init").arg("-q"))?;
        run(git(&dir).args(["add", "-A"]))?;
        run(git(&dir).args(["commit", "-q", "-m", "x"]))
    })?;
    out.push(("git_add_commit", n / secs, secs));
    let (_, secs) = timed(|| run(git(&dir).arg("status")))?;
    out.push(("git_status", n / secs, secs));
    let (_, secs) = timed(|| {
        run(Command::new("sh")
            .current_dir(&dir)
            .args(["-c", "find . -print0 | xargs -0 stat > /dev/null"]))
    })?;
    out.push(("find_stat", n / secs, secs));
    let sh = |script: &str| -> Result<(), String> {
        run(Command::new("sh").current_dir(&dir).args(["-c", script]))
    };
    t.kernel_cold();
    let (_, secs) = timed(|| sh("find . -print0 | xargs -0 stat > /dev/null"))?;
    out.push(("find_stat_cold", n / secs, secs));
    t.kernel_cold();
    let (_, secs) = timed(|| sh("find . -type f -print0 | xargs -0 cat > /dev/null"))?;
    out.push(("read_all_cold", n / secs, secs));
    untar_rm_rf(t, tree, out)
}

/// `tar -xf` of the tree's tar (on the ext4 scratch disk) into a fresh directory of the
/// target, then `rm -rf` of that directory.
fn untar_rm_rf(t: &Target, tree: &Tree, out: &mut Vec<Sample>) -> Result<(), String> {
    let dir = t.root().join("untar");
    io(fs::create_dir(&dir), &dir)?;
    let n = tree.files as f64;
    let (_, secs) = timed(|| {
        run(Command::new("tar")
            .arg("-xf")
            .arg(&tree.tar)
            .arg("-C")
            .arg(&dir))
    })?;
    out.push(("untar", n / secs, secs));
    let (_, secs) = timed(|| run(Command::new("rm").arg("-rf").arg(&dir)))?;
    out.push(("rm_rf", n / secs, secs));
    if dir.exists() {
        return Err(format!("{}: still there after rm -rf", dir.display()));
    }
    Ok(())
}

/// The AgentFS server's resident set now, its peak over the repetition, and after idling.
fn memory(t: &Target, out: &mut Vec<Sample>) {
    let Backend::AgentFs { mount: Some(m), .. } = &t.backend else {
        return;
    };
    use std::sync::atomic::Ordering::Relaxed;
    let end = m.memory("VmRSS");
    let peak = PEAK_RSS_KIB.swap(0, Relaxed) as f64 / 1024.0;
    if let Some(end) = end {
        out.push(("rss_end", end, 0.0));
    }
    if let Some(hwm) = m.memory("VmHWM") {
        out.push(("rss_peak", hwm.max(peak), 0.0));
    }
    std::thread::sleep(IDLE_SAMPLE);
    if let Some(idle) = m.memory("VmRSS") {
        out.push(("rss_idle", idle, 0.0));
    }
}

fn one_rep(t: &mut Target, plan: &Plan, tree: &Tree) -> Result<Vec<Sample>, String> {
    let mut out = Vec::new();
    t.begin()?;
    seq_and_rand(t, plan, &mut out)?;
    many_files(t, plan, &mut out)?;
    small_files(t, plan, &mut out)?;
    source_tree(t, tree, &mut out)?;
    memory(t, &mut out);
    t.end()?;
    Ok(out)
}

// ----------------------------------------------------------------------------------------------
// Results
// ----------------------------------------------------------------------------------------------

struct Column {
    name: &'static str,
    /// Why the target has no numbers (None: it ran).
    missing: Option<String>,
    /// Per workload key: the values of every repetition.
    values: Vec<(&'static str, Vec<f64>)>,
}

impl Column {
    fn new(name: &'static str) -> Column {
        Column {
            name,
            missing: None,
            values: WORKLOADS.iter().map(|w| (w.key, Vec::new())).collect(),
        }
    }
    fn add(&mut self, samples: &[Sample]) {
        for (k, v, _) in samples {
            if let Some((_, vs)) = self.values.iter_mut().find(|(key, _)| key == k) {
                vs.push(*v);
            }
        }
    }
    fn get(&self, key: &str) -> &[f64] {
        self.values
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_slice())
            .unwrap_or(&[])
    }
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    Some(if s.len() % 2 == 0 {
        (s[m - 1] + s[m]) / 2.0
    } else {
        s[m]
    })
}

fn fmt_num(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn table(cols: &[Column], plan: &Plan, tree: &Tree) -> String {
    let mut s = String::new();
    let _ = write!(s, "| workload | unit |");
    for c in cols {
        let _ = write!(s, " {} |", c.name);
    }
    s.push('\n');
    let _ = write!(s, "|---|---|");
    for _ in cols {
        s.push_str("---|");
    }
    s.push('\n');
    let base = cols.iter().find(|c| c.name == "ext4");
    for w in WORKLOADS {
        let _ = write!(s, "| {} | {} |", w.key, w.unit);
        let limit = base.and_then(|b| median(b.get(w.key)));
        for c in cols {
            let v = c.get(w.key);
            cell(&mut s, c.missing.is_some(), v, limit);
        }
        s.push('\n');
    }
    for c in cols {
        if let Some(why) = &c.missing {
            let _ = writeln!(s, "\n{}: {why}", c.name);
        }
    }
    let _ = writeln!(
        s,
        "\nCells: median of {} runs (× native ext4) [min–max]. Sizes: seq {} MiB, random {} MiB, \
         {} files, {} small files, tree {} files / {:.1} MiB ({}).",
        plan.reps,
        plan.seq_mib,
        plan.rand_mib,
        plan.files,
        plan.small_files,
        tree.files,
        tree.bytes as f64 / MIB as f64,
        tree.label
    );
    s
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// The sizes of a run as a JSON object.
fn sizes_json(plan: &Plan, tree: &Tree) -> String {
    format!(
        "{{\"reps\": {}, \"seq_mib\": {}, \"rand_mib\": {}, \"files\": {}, \
         \"small_files\": {}, \"tree_files\": {}, \"tree_bytes\": {}, \"tree\": {}}}",
        plan.reps,
        plan.seq_mib,
        plan.rand_mib,
        plan.files,
        plan.small_files,
        tree.files,
        tree.bytes,
        json_str(&tree.label)
    )
}

fn json(
    cols: &[Column],
    plan: &Plan,
    tree: &Tree,
    unix: u64,
    machine: &str,
    secs: f64,
    overlay: &str,
) -> String {
    let mut s = String::from("{\n");
    let _ = writeln!(s, "  \"unix_time\": {unix},");
    let _ = writeln!(s, "  \"quick\": {},", plan.quick);
    let _ = writeln!(s, "  \"wall_seconds\": {secs:.1},");
    let _ = writeln!(s, "  \"machine\": {},", json_str(machine));
    let _ = writeln!(s, "  \"sizes\": {},", sizes_json(plan, tree));
    s.push_str("  \"workloads\": [\n");
    let base = cols.iter().find(|c| c.name == "ext4");
    for (i, w) in WORKLOADS.iter().enumerate() {
        let _ = write!(
            s,
            "    {{\"key\": {}, \"unit\": {}, \"what\": {}, \"targets\": {{",
            json_str(w.key),
            json_str(w.unit),
            json_str(w.what)
        );
        let limit = base.and_then(|b| median(b.get(w.key)));
        for (j, c) in cols.iter().enumerate() {
            if j > 0 {
                s.push_str(", ");
            }
            let _ = write!(s, "{}: ", json_str(c.name));
            match (&c.missing, median(c.get(w.key))) {
                (Some(why), _) => {
                    let _ = write!(s, "{{\"missing\": {}}}", json_str(why));
                }
                (None, Some(m)) => {
                    let v = c.get(w.key);
                    let runs: Vec<String> = v.iter().map(|x| format!("{x:.3}")).collect();
                    let ratio = limit.map_or("null".to_string(), |l| format!("{:.4}", m / l));
                    let _ = write!(
                        s,
                        "{{\"median\": {m:.3}, \"min\": {:.3}, \"max\": {:.3}, \"ratio_to_ext4\": {ratio}, \"runs\": [{}]}}",
                        v.iter().copied().fold(f64::INFINITY, f64::min),
                        v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                        runs.join(", ")
                    );
                }
                (None, None) => s.push_str("null"),
            }
        }
        s.push_str("}}");
        s.push_str(if i + 1 < WORKLOADS.len() { ",\n" } else { "\n" });
    }
    let _ = write!(s, "  ],\n  \"overlay\": {overlay}\n}}\n");
    s
}

fn machine() -> String {
    let sh = |c: &str| {
        Command::new("sh")
            .args(["-c", c])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    format!(
        "{} CPUs, {} MiB RAM, kernel {}, disk {}",
        sh("nproc"),
        sh("awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo"),
        sh("uname -r"),
        sh("df -T / | awk 'NR==2 {print $2}'")
    )
}

// ----------------------------------------------------------------------------------------------
// main
// ----------------------------------------------------------------------------------------------

fn agentfs_binary(root: &Path) -> Result<PathBuf, String> {
    eprintln!("building the release binary (cargo build --release --bin agentfs) ...");
    run(
        Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .current_dir(root)
            .args(["build", "--release", "--bin", "agentfs"]),
    )?;
    let bin = root.join("target/release/agentfs");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("{} missing after the build", bin.display()))
    }
}

/// Mount points the bench makes inside its scratch directory.
const SCRATCH_MOUNTS: [&str; 9] = [
    "agentfs/mnt",
    "tmpfs",
    passthrough_hp::MOUNTS[0],
    passthrough_hp::MOUNTS[1],
    "ov-0/mnt",
    "ov-1/mnt",
    "ov-2/mnt",
    "ov-3/mnt",
    "sandbox/mnt",
];

fn main() {
    // `cargo bench` passes `--bench`; the filters are `sandbox` (only the sandbox beside a
    // plain mount of its project), `requests` (FUSE requests per workload), `replicate` and
    // `replicate-lag`.
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    if args.get(1).map(String::as_str) == Some(sandbox::RUNNER_ARG) {
        sandbox::runner(&args[2..]);
    }
    let only_sandbox = args.iter().skip(1).any(|a| a == "sandbox");
    let plan = Plan::new(agentfs::knobs::get().bench_quick);
    let started = Instant::now();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("workloads: needs root (mounts, drop_caches); skipped");
        return;
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target_dir = manifest.join("target");
    let work = target_dir.join("bench-work");
    let results = target_dir.join("bench-results");
    for d in [&work, &results] {
        fs::create_dir_all(d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    }
    // A previous run that was killed may have left mounts; clear ours before starting.
    for m in SCRATCH_MOUNTS {
        let p = work.join(m);
        if is_mounted(&p) {
            let _ = umount(&p, libc::MNT_DETACH);
        }
    }

    let tree = find_tree(plan.tree_files, &work.join("tree.tar"))
        .unwrap_or_else(|e| panic!("source tree: {e}"));
    eprintln!(
        "plan: {plan:?}\ntree: {} — {} entries, {} files, {:.1} MiB",
        tree.label,
        tree.entries.len(),
        tree.files,
        tree.bytes as f64 / MIB as f64
    );
    if args.iter().skip(1).any(|a| a == "requests") {
        let r = agentfs_binary(&manifest)
            .and_then(|bin| requests::run_requests(&bin, &work, &results, &plan, &tree));
        let _ = fs::remove_file(&tree.tar);
        match r {
            Ok(text) => println!("\n{text}"),
            Err(e) => {
                eprintln!("requests: failed: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    if args.iter().skip(1).any(|a| a == "replicate-lag") {
        let text = agentfs_binary(&manifest)
            .and_then(|bin| replica::run_lag(&bin, &work))
            .unwrap_or_else(|e| format!("failed: {e}\n"));
        let _ = fs::remove_file(&tree.tar);
        println!("\n{text}");
        return;
    }
    if args.iter().skip(1).any(|a| a == "replicate") {
        let table = agentfs_binary(&manifest)
            .and_then(|bin| replica::run_replica(&bin, &work, &plan, &tree))
            .unwrap_or_else(|e| format!("failed: {e}\n"));
        let _ = fs::remove_file(&tree.tar);
        println!(
            "\nAgentFS workloads{}, without replication, replicating to a local S3 server and to a local directory — {}\n\n{table}",
            if plan.quick { " (quick)" } else { "" },
            machine()
        );
        return;
    }
    if only_sandbox {
        let table = agentfs_binary(&manifest)
            .and_then(|bin| sandbox::run_sandbox(&bin, &work, &plan, &tree))
            .unwrap_or_else(|e| format!("failed: {e}\n"));
        let _ = fs::remove_file(&tree.tar);
        println!(
            "\nAgentFS workloads{}, a sandbox on each backend beside a plain mount and native ext4 — {}\n\n{table}",
            if plan.quick { " (quick)" } else { "" },
            machine()
        );
        return;
    }

    let mut cols: Vec<Column> = ["agentfs", "ext4", "tmpfs"]
        .into_iter()
        .map(Column::new)
        .collect();
    let mut targets: Vec<Target> = Vec::new();

    // Extra AgentFS columns at other memory budgets (AGENTFS_BENCH_BUDGETS), so the default
    // budget is a measured choice, and with other knobs (AGENTFS_BENCH_VARIANTS), so a change
    // is measured beside what it replaces.
    let k = agentfs::knobs::get();
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|b| !b.is_empty())
            .map(String::from)
            .collect()
    };
    let budgets = list(&k.bench_budgets).into_iter().map(|b| {
        let n: u64 = b
            .parse()
            .unwrap_or_else(|_| panic!("AGENTFS_BENCH_BUDGETS: {b:?} is not a MiB count"));
        (
            format!("agentfs@{n}MiB"),
            vec![("AGENTFS_MEMORY_BUDGET_MIB".to_string(), n.to_string())],
        )
    });
    let variants = list(&k.bench_variants).into_iter().map(|v| {
        let env: Vec<(String, String)> = v
            .split(';')
            .map(|kv| match kv.trim().split_once('=') {
                Some((k, v)) if k.starts_with("AGENTFS_") => (k.to_string(), v.to_string()),
                _ => panic!("AGENTFS_BENCH_VARIANTS: {kv:?} is not NAME=VALUE of an AGENTFS_ knob"),
            })
            .collect();
        let shown: Vec<String> = env
            .iter()
            .map(|(k, v)| format!("{}={v}", k.trim_start_matches("AGENTFS_")))
            .collect();
        (format!("agentfs[{}]", shown.join(";")), env)
    });
    match agentfs_binary(&manifest) {
        Ok(bin) => {
            let plain = std::iter::once(("agentfs".to_string(), Vec::new()));
            for (i, (name, env)) in plain.chain(budgets).chain(variants).enumerate() {
                let name: &'static str = Box::leak(name.into_boxed_str());
                if i > 0 {
                    cols.insert(i, Column::new(name));
                }
                let dir = work.join(name);
                let _ = fs::create_dir_all(&dir);
                targets.push(Target {
                    name,
                    backend: Backend::AgentFs {
                        bin: bin.clone(),
                        dir,
                        env,
                        mount: None,
                        replicate: None,
                    },
                });
            }
        }
        Err(e) => cols[0].missing = Some(format!("missing: {e}")),
    }
    let ext4 = work.join("ext4");
    let _ = fs::create_dir_all(&ext4);
    if statfs_type(&ext4) == Some(EXT4_SUPER_MAGIC) {
        targets.push(Target {
            name: "ext4",
            backend: Backend::Ext4 { dir: ext4 },
        });
    } else if let Some(c) = cols.iter_mut().find(|c| c.name == "ext4") {
        c.missing = Some(format!("missing: {} is not on ext4", ext4.display()));
    }
    let tmp = work.join("tmpfs");
    let _ = fs::create_dir_all(&tmp);
    match TmpfsMount::mount(&tmp) {
        Ok(m) => targets.push(Target {
            name: "tmpfs",
            backend: Backend::Tmpfs {
                _mount: m,
                dir: tmp,
            },
        }),
        Err(e) => {
            if let Some(c) = cols.iter_mut().find(|c| c.name == "tmpfs") {
                c.missing = Some(format!("missing: {e}"));
            }
        }
    }
    passthrough_hp::add(&work, &target_dir, &mut cols, &mut targets);
    for rep in 0..plan.reps {
        for t in targets.iter_mut() {
            eprint!("rep {}/{} {:8} ...", rep + 1, plan.reps, t.name);
            let t0 = Instant::now();
            match one_rep(t, &plan, &tree) {
                Ok(samples) => {
                    eprintln!(" {:.1} s", t0.elapsed().as_secs_f64());
                    let col = cols.iter_mut().find(|c| c.name == t.name).expect("column");
                    col.add(&samples);
                }
                Err(e) => {
                    eprintln!(" FAILED: {e}");
                    let col = cols.iter_mut().find(|c| c.name == t.name).expect("column");
                    col.missing = Some(format!("failed: {e}"));
                    let _ = t.end();
                }
            }
        }
        targets.retain(|t| {
            cols.iter()
                .find(|c| c.name == t.name)
                .is_some_and(|c| c.missing.is_none())
        });
    }
    let bin = targets.iter().find_map(|t| match &t.backend {
        Backend::AgentFs { bin, .. } => Some(bin.clone()),
        _ => None,
    });
    drop(targets); // unmounts tmpfs, ends any AgentFS server

    let (ov_table, ov_json) = match overlay::run_overlay(bin.as_deref(), &work, &plan, &tree) {
        Ok(r) => r,
        Err(e) => (
            format!("overlay form: failed: {e}\n"),
            format!("{{\"failed\": {}}}", json_str(&e)),
        ),
    };

    let sb_table = match bin.as_deref() {
        Some(b) => sandbox::run_sandbox(b, &work, &plan, &tree)
            .unwrap_or_else(|e| format!("failed: {e}\n")),
        None => "missing: no agentfs binary\n".into(),
    };

    let secs = started.elapsed().as_secs_f64();
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let m = machine();
    let tab = table(&cols, &plan, &tree);
    println!(
        "\nAgentFS workloads{} — {m}, {secs:.0} s\n\n{tab}\nOverlay form (one lower tree, \
         copy-on-write on top):\n\n{ov_table}\nA sandbox on each backend beside a plain mount and native ext4:\n\n{sb_table}",
        if plan.quick { " (quick)" } else { "" }
    );
    let j = json(&cols, &plan, &tree, unix, &m, secs, &ov_json);
    let file = results.join(format!("workloads-{unix}.json"));
    for p in [&file, &results.join("latest.json")] {
        if let Err(e) = fs::write(p, &j) {
            eprintln!("warning: {}: {e}", p.display());
        }
    }
    println!("results: {}", file.display());
    // Remove the scratch space only when nothing is mounted inside it any more.
    if !SCRATCH_MOUNTS.iter().any(|m| is_mounted(&work.join(m))) {
        let _ = fs::remove_dir_all(&work);
    }
}

/// One table cell: "median (× reference) [min–max]", "missing", or "–" without runs.
fn cell(s: &mut String, missing: bool, v: &[f64], limit: Option<f64>) {
    match (missing, median(v)) {
        (true, _) => s.push_str(" missing |"),
        (false, Some(m)) => {
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let ratio = limit.map_or(String::new(), |l| format!(" ({:.2}×)", m / l));
            let _ = write!(
                s,
                " {}{ratio} [{}–{}] |",
                fmt_num(m),
                fmt_num(lo),
                fmt_num(hi)
            );
        }
        (false, None) => s.push_str(" – |"),
    }
}
