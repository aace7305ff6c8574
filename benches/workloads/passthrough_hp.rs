//! The `passthrough_hp` columns: libfuse's own high-performance example server, mirroring an
//! ext4 directory, as the reference for what a FUSE server in C++ on libfuse reaches on the same
//! kernel and disk — `passthrough_hp` over /dev/fuse and `passthrough_hp[io_uring]` over
//! FUSE-over-io_uring, the two transports AgentFS has.
//!
//! The binary is `AGENTFS_BENCH_PASSTHROUGH_HP` when set, else `target/bench-tools/
//! passthrough_hp`, which `sh benches/workloads/passthrough_hp.sh` builds from the libfuse 3.18.3
//! release source with io_uring; without either the columns are `missing` and say how to build
//! it.
//!
//! It runs with its defaults, which are its recommended fast setup, plus `--foreground` so it
//! stays our child: entry and attribute timeouts of a day (no `--nocache`), libfuse's
//! multi-threaded loop with its default thread count, splice for reads and writes, and FUSE
//! passthrough (the kernel reads and writes the ext4 file directly after OPEN; without kernel
//! support it falls back to the writeback cache). The transport is chosen with libfuse's
//! `FUSE_URING_ENABLE` (0 or 1), and checked: libfuse falls back to /dev/fuse quietly when the
//! ring cannot start, so the ring column fails unless the server holds io_uring instances once
//! mounted, and the /dev/fuse column unless it holds none. The ring column needs the fuse
//! module's `enable_uring` set (`missing` otherwise).
//!
//! Each repetition mirrors a fresh, empty ext4 directory. Cold rows unmount it and start a new
//! server after dropping the kernel's caches, as the AgentFS column is remounted.

use super::*;

/// The columns: name, directory in the bench's scratch space, and whether it uses the ring.
const COLUMNS: [(&str, &str, bool); 2] = [
    ("passthrough_hp", "passthrough_hp", false),
    ("passthrough_hp[io_uring]", "passthrough_hp-uring", true),
];
/// The mount points inside the bench's scratch directory.
pub const MOUNTS: [&str; 2] = ["passthrough_hp/mnt", "passthrough_hp-uring/mnt"];

/// The passthrough_hp executable: the knob, else the one the build script puts in `target`. A
/// knob naming no file stops the bench (the column was asked for by name).
fn binary(target_dir: &Path) -> Result<PathBuf, String> {
    let set = &agentfs::knobs::get().bench_passthrough_hp;
    if !set.is_empty() {
        let p = PathBuf::from(set);
        if !p.is_file() {
            panic!("AGENTFS_BENCH_PASSTHROUGH_HP: {set:?} is not a file");
        }
        return Ok(p);
    }
    let p = target_dir.join("bench-tools/passthrough_hp");
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} not built: run `sh benches/workloads/passthrough_hp.sh` (or set \
             AGENTFS_BENCH_PASSTHROUGH_HP to a passthrough_hp binary)",
            p.display()
        ))
    }
}

/// Add the columns, and their targets when the binary is there, the scratch space is on ext4
/// and (for the ring) the kernel lets a server use FUSE-over-io_uring.
pub fn add(work: &Path, target_dir: &Path, cols: &mut Vec<Column>, targets: &mut Vec<Target>) {
    let bin = binary(target_dir);
    for (name, sub, uring) in COLUMNS {
        let mut col = Column::new(name);
        let dir = work.join(sub);
        let _ = fs::create_dir_all(&dir);
        match &bin {
            Ok(_) if statfs_type(&dir) != Some(EXT4_SUPER_MAGIC) => {
                col.missing = Some(format!("missing: {} is not on ext4", dir.display()));
            }
            Ok(_) if uring && !kernel_ring_enabled() => {
                col.missing = Some(format!("missing: {ENABLE_URING} is not Y"));
            }
            Ok(bin) => targets.push(Target {
                name,
                backend: Backend::Passthrough(Passthrough {
                    bin: bin.clone(),
                    dir,
                    uring,
                    mount: None,
                }),
            }),
            Err(e) => col.missing = Some(format!("missing: {e}")),
        }
        cols.push(col);
    }
}

/// The fuse module's switch for FUSE-over-io_uring.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

fn kernel_ring_enabled() -> bool {
    fs::read_to_string(ENABLE_URING).is_ok_and(|v| v.trim() == "Y")
}

/// A column's target: an ext4 source directory and its passthrough_hp mount.
pub struct Passthrough {
    bin: PathBuf,
    dir: PathBuf,
    /// Serve over FUSE-over-io_uring instead of /dev/fuse.
    uring: bool,
    mount: Option<PthpMount>,
}

impl Passthrough {
    fn src(&self) -> PathBuf {
        self.dir.join("src")
    }

    fn mnt(&self) -> PathBuf {
        self.dir.join("mnt")
    }

    /// The directory a repetition works in, through the mount.
    pub fn root(&self) -> PathBuf {
        self.mnt().join("w")
    }

    fn start(&mut self) -> Result<(), String> {
        self.mount = Some(PthpMount::start(
            &self.bin,
            &self.src(),
            &self.mnt(),
            &self.dir.join("server.log"),
            self.uring,
        )?);
        Ok(())
    }

    fn stop(&mut self) -> Result<(), String> {
        match self.mount.take() {
            Some(mut m) => m.stop(),
            None => Ok(()),
        }
    }

    /// A fresh empty source directory, mounted.
    pub fn begin(&mut self) -> Result<(), String> {
        self.stop()?;
        self.remove_src()?;
        for d in [self.src(), self.mnt()] {
            io(fs::create_dir_all(&d), &d)?;
        }
        self.start()
    }

    /// A new server on the same directory after the kernel's caches are dropped.
    pub fn remount(&mut self) -> Result<(), String> {
        self.stop()?;
        drop_caches();
        self.start()
    }

    /// Unmount, then remove the repetition's files on ext4 directly.
    pub fn end(&mut self) -> Result<(), String> {
        self.stop()?;
        self.remove_src()
    }

    fn remove_src(&self) -> Result<(), String> {
        let src = self.src();
        match fs::remove_dir_all(&src) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("{}: {e}", src.display()))
            }
            _ => Ok(()),
        }
    }
}

/// A passthrough_hp server mirroring `src` at `mnt` in the foreground as our child. Drop
/// unmounts and ends it.
struct PthpMount {
    mnt: PathBuf,
    child: Option<Child>,
}

impl PthpMount {
    fn start(
        bin: &Path,
        src: &Path,
        mnt: &Path,
        log: &Path,
        uring: bool,
    ) -> Result<PthpMount, String> {
        let child = spawn_logged(
            Command::new(bin)
                .env("FUSE_URING_ENABLE", if uring { "1" } else { "0" })
                .arg("--foreground")
                .arg(src)
                .arg(mnt),
            log,
        )?;
        let mut m = PthpMount {
            mnt: mnt.to_path_buf(),
            child: Some(child),
        };
        wait_mounted(mnt, &mut m.child, log, "passthrough_hp")?;
        m.check_transport(uring, log)?;
        Ok(m)
    }

    /// Fail unless the server uses the transport asked for: io_uring instances among its
    /// descriptors exactly when the ring was asked for. libfuse starts its rings after INIT,
    /// which the kernel sends once mounted, so they may come a little after the mount.
    fn check_transport(&self, uring: bool, log: &Path) -> Result<(), String> {
        let Some(pid) = self.child.as_ref().map(Child::id) else {
            return Err("passthrough_hp: no server".into());
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let rings = io_uring_fds(pid);
            if (rings > 0) == uring {
                return Ok(());
            }
            if !uring || Instant::now() > deadline {
                let log = fs::read_to_string(log).unwrap_or_default();
                return Err(format!(
                    "passthrough_hp (pid {pid}) holds {rings} io_uring instances with \
                     FUSE_URING_ENABLE={}: {}",
                    u8::from(uring),
                    log.trim()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Unmount (the server then leaves its loop and exits) and wait for our child. A mount that
    /// will not go is aborted through fusectl and detached; a server that will not exit is
    /// killed by pid.
    fn stop(&mut self) -> Result<(), String> {
        let mut err = None;
        if is_mounted(&self.mnt) {
            if let Err(e) = umount(&self.mnt, 0) {
                err = Some(format!("umount {}: {e}", self.mnt.display()));
                let mp = agentfs::sys::mounts::locate(&self.mnt);
                if let Some(entry) = agentfs::sys::mounts::find(&mp) {
                    let _ = agentfs::sys::mounts::abort_connection(&entry);
                }
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
}

/// How many of a process's descriptors are io_uring instances.
fn io_uring_fds(pid: u32) -> usize {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    fds.flatten()
        .filter(|e| fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == "anon_inode:[io_uring]"))
        .count()
}

impl Drop for PthpMount {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("warning: {}: {e}", self.mnt.display());
        }
    }
}
