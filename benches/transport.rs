//! Transport A/B through the real kernel: FUSE-over-io_uring against classic /dev/fuse, in one
//! run. Small-op latency (stat with kernel caching off, so every call is a round trip), the
//! latency of one request the server answers from its cache (fstat of an open file: exactly one
//! GETATTR, the nearest thing to a null server's round trip), and metadata throughput (create +
//! stat + unlink) with 1, 2 and 4 client threads. Beside them, the machine's own price of a
//! synchronous hand-off between two threads (a one-byte ping-pong over two pipes, both
//! threads on one CPU and on two): no FUSE request can be answered faster than that.
//!
//! Needs root and /dev/fuse; flips /sys/module/fuse/parameters/enable_uring for the ring leg and
//! restores it. Results: a table on stdout and target/bench-results/transport-latest.json.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

struct Server {
    child: Child,
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(ring: bool) -> Server {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).expect("mkdir");
        let db = dir.path().join("db.sqlite");
        let child = Command::new(env!("CARGO_BIN_EXE_agentfs"))
            .arg("mount")
            .arg(&db)
            .arg(&mnt)
            .arg("-f")
            .env("AGENTFS_FUSE_ATTR_TTL_MS", "0")
            .env("AGENTFS_FUSE_ENTRY_TTL_MS", "0")
            .env("AGENTFS_FUSE_URING", if ring { "1" } else { "0" })
            .stdout(Stdio::null())
            .spawn()
            .expect("start server");
        let deadline = Instant::now() + Duration::from_secs(20);
        let canon = fs::canonicalize(&mnt).expect("canonical");
        while agentfs::sys::mounts::find(&canon).is_none() {
            assert!(Instant::now() < deadline, "mount did not appear");
            std::thread::sleep(Duration::from_millis(10));
        }
        Server {
            child,
            mnt,
            _dir: dir,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new(env!("CARGO_BIN_EXE_agentfs"))
            .arg("umount")
            .arg(&self.mnt)
            .status();
        let _ = self.child.wait();
    }
}

/// Median and 99th percentile, in microseconds, of `n` timed calls of `op`.
fn latency(n: usize, mut op: impl FnMut()) -> (f64, f64) {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        op();
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    (samples[n / 2], samples[n * 99 / 100])
}

/// Single stat() calls by path: the path walk's GETATTR of the root (its attributes are never
/// fresh with a zero timeout) and the file's.
fn stat_latency(mnt: &Path, n: usize) -> (f64, f64) {
    let f = mnt.join("target");
    fs::write(&f, b"x").expect("write");
    latency(n, || {
        fs::metadata(&f).expect("stat");
    })
}

/// fstat() of an open file: one GETATTR per call, answered from the server's attribute cache.
fn one_request_latency(mnt: &Path, n: usize) -> (f64, f64) {
    let f = fs::File::open(mnt.join("target")).expect("open");
    latency(n, || {
        f.metadata().expect("fstat");
    })
}

/// A one-byte ping-pong between two threads over two pipes, the client on CPU 0 and the
/// echoing thread on `echo_cpu`: the scheduler's price of one synchronous hand-off and back.
fn wake_latency(echo_cpu: usize, n: usize) -> (f64, f64) {
    use std::io::{Read, Write};
    let pipe = || {
        let (r, w) = nix::unistd::pipe().expect("pipe");
        (fs::File::from(r), fs::File::from(w))
    };
    let ((mut ping_r, mut ping_w), (mut pong_r, mut pong_w)) = (pipe(), pipe());
    std::thread::scope(|s| {
        s.spawn(move || {
            let _ = agentfs::sys::priority::pin_this_thread(echo_cpu);
            let mut b = [0u8; 1];
            while ping_r.read_exact(&mut b).is_ok() && pong_w.write_all(&b).is_ok() {}
        });
        s.spawn(move || {
            let _ = agentfs::sys::priority::pin_this_thread(0);
            let mut b = [0u8; 1];
            let mut trip = || {
                ping_w.write_all(&b).expect("ping");
                pong_r.read_exact(&mut b).expect("pong");
            };
            for _ in 0..n / 10 {
                trip();
            }
            latency(n, trip)
        })
        .join()
        .expect("ping-pong thread")
    })
}

/// create + stat + unlink cycles per second with `threads` clients, each in its own directory.
fn metadata_ops(mnt: &Path, threads: usize, per_thread: usize) -> f64 {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let dir = mnt.join(format!("t{threads}-{t}"));
            s.spawn(move || {
                fs::create_dir(&dir).expect("mkdir");
                for i in 0..per_thread {
                    let p = dir.join(format!("f{i}"));
                    fs::write(&p, b"").expect("create");
                    fs::metadata(&p).expect("stat");
                    fs::remove_file(&p).expect("unlink");
                }
            });
        }
    });
    (threads * per_thread) as f64 * 3.0 / start.elapsed().as_secs_f64()
}

struct Leg {
    name: &'static str,
    median_us: f64,
    p99_us: f64,
    one_median_us: f64,
    one_p99_us: f64,
    ops: Vec<(usize, f64)>,
}

fn run_leg(name: &'static str, ring: bool, quick: bool) -> Leg {
    let server = Server::start(ring);
    let (n, per) = if quick { (5_000, 500) } else { (20_000, 2_000) };
    let _ = stat_latency(&server.mnt, n / 10); // warm up
    let (median_us, p99_us) = stat_latency(&server.mnt, n);
    let (one_median_us, one_p99_us) = one_request_latency(&server.mnt, n);
    let ops = [1, 2, 4]
        .iter()
        .map(|&t| (t, metadata_ops(&server.mnt, t, per)))
        .collect();
    Leg {
        name,
        median_us,
        p99_us,
        one_median_us,
        one_p99_us,
        ops,
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return; // `cargo test --benches` and `--list`: nothing to run here.
    }
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !Path::new("/dev/fuse").exists() {
        println!("transport bench: needs root and /dev/fuse; skipped");
        return;
    }
    let quick = agentfs::knobs::get().bench_quick;
    let old = fs::read_to_string(PARAM).unwrap_or_default();
    let mut legs = Vec::new();
    legs.push(run_leg("/dev/fuse", false, quick));
    if fs::write(PARAM, "Y").is_ok() {
        legs.push(run_leg("io_uring", true, quick));
        let _ = fs::write(PARAM, old.trim());
    } else {
        println!("io_uring leg missing: cannot set {PARAM}");
    }
    println!(
        "\n| transport | stat median µs | stat p99 µs | one request median µs | one request p99 µs | meta ops/s 1 thr | 2 thr | 4 thr |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut json = String::from("{\"legs\":[");
    for (i, l) in legs.iter().enumerate() {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} | {:.0} |",
            l.name,
            l.median_us,
            l.p99_us,
            l.one_median_us,
            l.one_p99_us,
            l.ops[0].1,
            l.ops[1].1,
            l.ops[2].1
        );
        if i > 0 {
            json.push(',');
        }
        json.push_str(&format!(
            "{{\"transport\":\"{}\",\"stat_median_us\":{:.2},\"stat_p99_us\":{:.2},\"one_request_median_us\":{:.2},\"one_request_p99_us\":{:.2},\"meta_ops\":{{\"1\":{:.0},\"2\":{:.0},\"4\":{:.0}}}}}",
            l.name, l.median_us, l.p99_us, l.one_median_us, l.one_p99_us, l.ops[0].1, l.ops[1].1, l.ops[2].1
        ));
    }
    json.push(']');
    let n = if quick { 5_000 } else { 20_000 };
    let (same, same_p99) = wake_latency(0, n);
    let (across, across_p99) = wake_latency(1, n);
    println!(
        "\nthread hand-off and back (pipe ping-pong): one CPU {same:.1} µs median \
         ({same_p99:.1} p99), two CPUs {across:.1} µs ({across_p99:.1})"
    );
    json.push_str(&format!(
        ",\"wake_us\":{{\"one_cpu\":{same:.2},\"two_cpus\":{across:.2}}}}}"
    ));
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
    let _ = fs::create_dir_all(&out);
    let _ = fs::write(out.join("transport-latest.json"), json + "\n");
}
