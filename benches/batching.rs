//! Write batching on vs off, through a real mount: `cargo bench --bench batching` (root).
//!
//! Three servers per kernel mode, each on a fresh database in `target/bench-batching/`: data and
//! namespace batching on (the defaults), data batching only (`AGENTFS_BATCH_NAMESPACE=0`: one
//! transaction per namespace operation), and everything off (`AGENTFS_BATCH=0` too). Kernel
//! modes: the default writeback cache (the kernel coalesces small writes into up to 1 MiB
//! WRITEs) and `AGENTFS_FUSE_WRITEBACK_CACHE=0` (every write(2) is one WRITE: the small-write
//! case batching exists for). Workloads, each timed to the end of its barrier:
//! * `seq_write_4k`: 32 MiB in 4 KiB write(2)s, then fsync;
//! * `rand_write_4k`: 8,192 4 KiB pwrite(2)s at random aligned offsets of a prefilled 32 MiB
//!   file, then fsync;
//! * `small_files`: 2,000 files of 1–16 KiB (create, write, close), then syncfs;
//! * `fsync_latency`: 200 x (4 KiB append + fdatasync), median and p99 per call.
//!
//! Then the memory ceiling: a writer that never fsyncs writes 2 GiB (1 MiB write(2)s) through
//! a batched mount; the server's peak RSS (VmHWM) is reported. With `AGENTFS_BENCH_QUICK=1`
//! 256 MiB instead.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server {
    child: Child,
    mnt: PathBuf,
}

impl Server {
    fn start(dir: &Path, env: &[(&str, &str)]) -> Server {
        let _ = fs::remove_dir_all(dir);
        fs::create_dir_all(dir.join("mnt")).expect("mkdir");
        let bin = env!("CARGO_BIN_EXE_agentfs");
        let db = dir.join("db.sqlite");
        let mnt = dir.join("mnt");
        let mut cmd = Command::new(bin);
        cmd.arg("mount")
            .arg(&db)
            .arg(&mnt)
            .arg("-f")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start server");
        let deadline = Instant::now() + Duration::from_secs(20);
        let canon = fs::canonicalize(&mnt).expect("canon");
        while agentfs::sys::mounts::find(&canon).is_none() {
            assert!(Instant::now() < deadline, "mount did not appear");
            std::thread::sleep(Duration::from_millis(10));
        }
        Server { child, mnt }
    }

    fn peak_rss_mib(&self) -> u64 {
        let s = fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        s.lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|k| k.parse::<u64>().ok())
            .map_or(0, |kib| kib / 1024)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let bin = env!("CARGO_BIN_EXE_agentfs");
        let _ = Command::new(bin)
            .arg("umount")
            .arg(&self.mnt)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// xorshift64* for offsets.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

const KIB4: usize = 4096;
const FILE_MIB: usize = 32;

fn seq_write_4k(mnt: &Path) -> f64 {
    let buf = vec![0x5au8; KIB4];
    let t = Instant::now();
    let mut f = File::create(mnt.join("seq")).expect("create");
    for _ in 0..FILE_MIB * 256 {
        f.write_all(&buf).expect("write");
    }
    f.sync_all().expect("fsync");
    t.elapsed().as_secs_f64()
}

fn rand_write_4k(mnt: &Path) -> f64 {
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(mnt.join("rand"))
        .expect("create");
    let mib = vec![1u8; 1 << 20];
    for i in 0..FILE_MIB {
        f.write_all_at(&mib, (i << 20) as u64).expect("prefill");
    }
    f.sync_all().expect("fsync");
    let buf = vec![0xa5u8; KIB4];
    let blocks = (FILE_MIB * 256) as u64;
    let mut rng = Rng(42);
    let t = Instant::now();
    for _ in 0..8192 {
        let off = (rng.next() % blocks) * KIB4 as u64;
        f.write_all_at(&buf, off).expect("pwrite");
    }
    f.sync_all().expect("fsync");
    t.elapsed().as_secs_f64()
}

fn small_files(mnt: &Path) -> f64 {
    let dir = mnt.join("small");
    fs::create_dir(&dir).expect("mkdir");
    let mut rng = Rng(7);
    let data = vec![0x33u8; 16 * 1024];
    let t = Instant::now();
    for i in 0..2000 {
        let len = 1024 + (rng.next() % (15 * 1024)) as usize;
        let mut f = File::create(dir.join(format!("f{i}"))).expect("create");
        f.write_all(&data[..len]).expect("write");
    }
    let d = File::open(&dir).expect("open dir");
    // SAFETY: syncfs on an open descriptor of the mount.
    let rc = unsafe { libc::syncfs(d.as_raw_fd()) };
    assert_eq!(rc, 0, "syncfs");
    t.elapsed().as_secs_f64()
}

/// Median and p99 of append + fdatasync, in microseconds.
fn fsync_latency(mnt: &Path) -> (f64, f64) {
    let mut f = File::create(mnt.join("log")).expect("create");
    let buf = vec![0x11u8; KIB4];
    let mut lat = Vec::with_capacity(200);
    for _ in 0..200 {
        let t = Instant::now();
        f.write_all(&buf).expect("write");
        f.sync_data().expect("fdatasync");
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    (lat[100], lat[197])
}

#[derive(Default, Clone, Copy)]
struct Row {
    seq: f64,
    rand: f64,
    small: f64,
    fsync_med: f64,
    fsync_p99: f64,
}

fn run(dir: &Path, env: &[(&str, &str)]) -> Row {
    let s = Server::start(dir, env);
    let seq = seq_write_4k(&s.mnt);
    let rand = rand_write_4k(&s.mnt);
    let small = small_files(&s.mnt);
    let (fsync_med, fsync_p99) = fsync_latency(&s.mnt);
    Row {
        seq,
        rand,
        small,
        fsync_med,
        fsync_p99,
    }
}

fn memory_ceiling(dir: &Path, mib: usize) -> (u64, f64, u64) {
    let s = Server::start(dir, &[("AGENTFS_BATCH", "1")]);
    let buf = vec![0x77u8; 1 << 20];
    let mut f = File::create(s.mnt.join("huge")).expect("create");
    let t = Instant::now();
    let mut peak = 0;
    for i in 0..mib {
        f.write_all(&buf).expect("write");
        if i % 64 == 0 {
            peak = peak.max(s.peak_rss_mib());
        }
    }
    drop(f);
    let secs = t.elapsed().as_secs_f64();
    peak = peak.max(s.peak_rss_mib());
    let cap = agentfs::knobs::get().batch_max_pending_mib;
    (peak, mib as f64 / secs, cap)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("batching: bench");
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        eprintln!("batching bench needs root and /dev/fuse; skipped");
        return;
    }
    let quick = agentfs::knobs::get().bench_quick;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-batching");
    println!(
        "| kernel cache | batching | seq 4 KiB writes (32 MiB + fsync) | random 4 KiB writes (8,192 + fsync) | 2,000 small files + syncfs | fsync median | fsync p99 |"
    );
    println!("|---|---|---|---|---|---|---|");
    // (label, AGENTFS_BATCH, AGENTFS_BATCH_NAMESPACE): everything on, data only, everything off.
    let legs = [
        ("data + namespace", "1", "1"),
        ("data only", "1", "0"),
        ("off", "0", "0"),
    ];
    for wb in ["1", "0"] {
        let cache = if wb == "1" {
            "writeback"
        } else {
            "write-through"
        };
        let mut rows = Vec::new();
        for (label, batch, ns) in legs {
            let env = [
                ("AGENTFS_BATCH", batch),
                ("AGENTFS_BATCH_NAMESPACE", ns),
                ("AGENTFS_FUSE_WRITEBACK_CACHE", wb),
            ];
            let r = run(&root.join(format!("wb{wb}-b{batch}-n{ns}")), &env);
            println!(
                "| {cache} | {label} | {:.3} s ({:.0} MiB/s) | {:.3} s ({:.0} writes/s) | {:.3} s ({:.0} files/s) | {:.0} µs | {:.0} µs |",
                r.seq,
                FILE_MIB as f64 / r.seq,
                r.rand,
                8192.0 / r.rand,
                r.small,
                2000.0 / r.small,
                r.fsync_med,
                r.fsync_p99
            );
            rows.push(r);
        }
        for (name, base) in [("vs off", rows[2]), ("vs data only", rows[1])] {
            let on = rows[0];
            println!(
                "| {cache} | speed-up {name} | {:.1}x | {:.1}x | {:.1}x | {:.2}x | {:.2}x |",
                base.seq / on.seq,
                base.rand / on.rand,
                base.small / on.small,
                base.fsync_med / on.fsync_med,
                base.fsync_p99 / on.fsync_p99
            );
        }
    }
    let mib = if quick { 256 } else { 2048 };
    let (peak, rate, cap) = memory_ceiling(&root.join("memory"), mib);
    println!(
        "\nmemory ceiling: {mib} MiB written without fsync at {rate:.0} MiB/s; server peak RSS \
         {peak} MiB (AGENTFS_BATCH_MAX_PENDING_MIB = {cap})"
    );
    let _ = fs::remove_dir_all(&root);
}
