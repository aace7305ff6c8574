//! The `passthrough_hp` column: libfuse's own high-performance example server, mirroring an
//! ext4 directory, as the reference for what a FUSE server in C++ on libfuse reaches on the same
//! kernel and disk.
//!
//! The binary is `AGENTFS_BENCH_PASSTHROUGH_HP` when set, else `target/bench-tools/
//! passthrough_hp`, which `sh benches/workloads/passthrough_hp.sh` builds from the libfuse 3.17.2
//! release source; without either the column is `missing` and says how to build it.
//!
//! It runs with its defaults, which are its recommended fast setup, plus `--foreground` so it
//! stays our child: entry and attribute timeouts of a day (no `--nocache`), libfuse's
//! multi-threaded loop with its default thread count, splice for reads and writes, and FUSE
//! passthrough (the kernel reads and writes the ext4 file directly after OPEN; without kernel
//! support it falls back to the writeback cache). The transport is /dev/fuse: libfuse 3.17.2
//! has no FUSE-over-io_uring (its source holds no io_uring code), so unlike AgentFS this column
//! cannot use the ring.
//!
//! Each repetition mirrors a fresh, empty ext4 directory. Cold rows unmount it and start a new
//! server after dropping the kernel's caches, as the AgentFS column is remounted.

use super::*;

/// The column's name.
pub const COLUMN: &str = "passthrough_hp";
/// The mount point inside the bench's scratch directory.
pub const MOUNT: &str = "passthrough_hp/mnt";

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

/// Add the column, and its target when the binary is there and the scratch space is on ext4.
pub fn add(work: &Path, target_dir: &Path, cols: &mut Vec<Column>, targets: &mut Vec<Target>) {
    let mut col = Column::new(COLUMN);
    let dir = work.join(COLUMN);
    let _ = fs::create_dir_all(&dir);
    match binary(target_dir) {
        Ok(_) if statfs_type(&dir) != Some(EXT4_SUPER_MAGIC) => {
            col.missing = Some(format!("missing: {} is not on ext4", dir.display()));
        }
        Ok(bin) => targets.push(Target {
            name: COLUMN,
            backend: Backend::Passthrough(Passthrough {
                bin,
                dir,
                mount: None,
            }),
        }),
        Err(e) => col.missing = Some(format!("missing: {e}")),
    }
    cols.push(col);
}

/// The column's target: an ext4 source directory and its passthrough_hp mount.
pub struct Passthrough {
    bin: PathBuf,
    dir: PathBuf,
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
    fn start(bin: &Path, src: &Path, mnt: &Path, log: &Path) -> Result<PthpMount, String> {
        let child = spawn_logged(Command::new(bin).arg("--foreground").arg(src).arg(mnt), log)?;
        let mut m = PthpMount {
            mnt: mnt.to_path_buf(),
            child: Some(child),
        };
        wait_mounted(mnt, &mut m.child, log, "passthrough_hp")?;
        Ok(m)
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

impl Drop for PthpMount {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("warning: {}: {e}", self.mnt.display());
        }
    }
}
