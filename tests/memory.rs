//! The memory budget through a real mount: a workload several times larger than a small budget
//! keeps the server's resident set within the budget plus the fixed overhead (sampled from
//! /proc while it runs), an idle server falls back to its floor, and the next workload passes.

mod common;

use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Mounted;

const MIB: u64 = 1024 * 1024;
const BUDGET_MIB: u64 = 8;
/// What a server holds beyond its budget at most: program text and libraries (~7 MiB), thread
/// stacks, statement caches, the allocator's slack, and one ring entry per queue (the kernel's
/// minimum) — measured in kernel-notes/memory.md.
const FIXED_OVERHEAD_MIB: u64 = 24;
/// Resident set of an idle server after the give-back (kernel-notes/memory.md).
const IDLE_FLOOR_MIB: u64 = 16;

/// Samples a process's resident set every 20 ms and keeps the highest.
struct Peak {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Peak {
    fn start(pid: u32) -> Peak {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let (s, p) = (stop.clone(), peak.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(r) = agentfs::sys::memory::rss(Some(pid)) {
                    p.fetch_max(r, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Peak {
            stop,
            peak,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

/// Write 48 MiB in 1 MiB writes over three files, 1,500 small files in 15 directories, then
/// stat and read everything back and compare.
fn workload(root: &Path, round: u8) {
    let big: Vec<u8> = (0..MIB as usize).map(|i| (i % 251) as u8 ^ round).collect();
    for f in 0..3 {
        let mut w = fs::File::create(root.join(format!("big{f}"))).unwrap();
        for _ in 0..16 {
            w.write_all(&big).unwrap();
        }
        w.sync_all().unwrap();
    }
    for d in 0..15 {
        let dir = root.join(format!("d{d}"));
        fs::create_dir_all(&dir).unwrap();
        for i in 0..100 {
            fs::write(dir.join(format!("file-{i:04}")), format!("{round}:{d}:{i}")).unwrap();
        }
    }
    let mut seen = 0;
    for d in 0..15 {
        for e in fs::read_dir(root.join(format!("d{d}"))).unwrap() {
            let e = e.unwrap();
            assert!(e.metadata().unwrap().len() > 0);
            seen += 1;
        }
    }
    assert_eq!(seen, 1500);
    for d in 0..15 {
        for i in 0..100 {
            let got = fs::read_to_string(root.join(format!("d{d}/file-{i:04}"))).unwrap();
            assert_eq!(got, format!("{round}:{d}:{i}"));
        }
    }
    for f in 0..3 {
        let got = fs::read(root.join(format!("big{f}"))).unwrap();
        assert_eq!(got.len() as u64, 16 * MIB);
        assert!(got.chunks(MIB as usize).all(|c| c == big.as_slice()));
    }
}

/// What a test on `uring` (else /dev/fuse) needs: FUSE, and for the ring the kernel's switch
/// set for as long as the returned guard lives. None: the test is skipped (said on stderr).
fn transport_or_skip(test: &str, uring: bool) -> Option<Option<common::UringParam>> {
    if !common::fuse_or_skip(test) {
        return None;
    }
    if !uring {
        return Some(None);
    }
    match common::UringParam::set("Y") {
        Some(p) => Some(Some(p)),
        None => {
            eprintln!("SKIP {test}: enable_uring is not writable");
            None
        }
    }
}

fn budget_holds(test: &str, uring: bool) {
    let Some(_param) = transport_or_skip(test, uring) else {
        return;
    };
    let budget = BUDGET_MIB.to_string();
    let m = Mounted::with_env(&[
        ("AGENTFS_MEMORY_BUDGET_MIB", &budget),
        ("AGENTFS_MEMORY_IDLE_MS", "1000"),
        ("AGENTFS_FUSE_URING", if uring { "1" } else { "0" }),
    ]);
    let pid = m.server_pid();
    let rec = common::settled_record(pid);
    assert_eq!(rec.transport, if uring { "io-uring" } else { "dev-fuse" });
    assert_eq!(
        rec.memory.budget,
        BUDGET_MIB * MIB,
        "the budget is published"
    );

    let peak = Peak::start(pid);
    workload(&m.mnt, 1);
    let peak = peak.finish();
    assert!(
        peak <= (BUDGET_MIB + FIXED_OVERHEAD_MIB) * MIB,
        "peak RSS {} KiB over a {BUDGET_MIB} MiB budget plus {FIXED_OVERHEAD_MIB} MiB overhead",
        peak / 1024
    );

    // Idle: a second without requests, then the give-back: the caches drop to an eighth of
    // their share (as the status record reports them) and the resident set falls.
    let end = agentfs::sys::memory::rss(Some(pid)).unwrap();
    let floor = BUDGET_MIB * MIB / 4 / 8;
    let deadline = Instant::now() + Duration::from_secs(20);
    let rec = loop {
        let rec = common::settled_record(pid);
        if rec.memory.caches <= floor || Instant::now() > deadline {
            break rec;
        }
    };
    assert!(rec.memory.caches <= floor, "caches not shrunk: {rec:?}");
    assert!(rec.memory.rss > 0 && rec.memory.transport > 0, "{rec:?}");
    let idle = agentfs::sys::memory::rss(Some(pid)).unwrap();
    assert!(
        idle <= IDLE_FLOOR_MIB * MIB && idle < end,
        "idle RSS {} KiB: above the {IDLE_FLOOR_MIB} MiB floor or not below the {} KiB at the \
         workload's end",
        idle / 1024,
        end / 1024
    );
    eprintln!(
        "{test}: peak {} KiB, end {} KiB, idle {} KiB",
        peak / 1024,
        end / 1024,
        idle / 1024
    );

    // The next workload refills what the idle server dropped and still passes.
    workload(&m.mnt, 2);
    drop(m);
}

#[test]
fn small_budget_bounds_rss_and_idle_gives_back_devfuse() {
    budget_holds("small_budget_bounds_rss_and_idle_gives_back_devfuse", false);
}

#[test]
fn small_budget_bounds_rss_and_idle_gives_back_uring() {
    budget_holds("small_budget_bounds_rss_and_idle_gives_back_uring", true);
}

/// Freed large buffers (committed 1 MiB WRITEs, sent 1 MiB READ replies) are kept for the next
/// ones, never more than a quarter of the WRITE-data share, and freed when the server idles.
fn buffers_reused(test: &str, uring: bool) {
    let Some(_param) = transport_or_skip(test, uring) else {
        return;
    };
    let m = Mounted::with_env(&[
        ("AGENTFS_MEMORY_BUDGET_MIB", "64"),
        ("AGENTFS_MEMORY_IDLE_MS", "4000"),
        ("AGENTFS_FUSE_URING", if uring { "1" } else { "0" }),
    ]);
    let pid = m.server_pid();
    let cap = 64 * MIB / 4 / 4;
    let big: Vec<u8> = (0..MIB as usize).map(|i| (i % 253) as u8).collect();
    let path = m.mnt.join("big");
    let mut w = fs::File::create(&path).unwrap();
    for _ in 0..24 {
        w.write_all(&big).unwrap();
    }
    w.sync_all().unwrap();
    drop(w);
    let got = fs::read(&path).unwrap();
    assert_eq!(got.len() as u64, 24 * MIB);
    assert!(got.chunks(MIB as usize).all(|c| c == big.as_slice()));
    let record = || {
        agentfs::sys::registry::live()
            .into_iter()
            .find(|r| r.pid == pid)
            .map(|r| r.memory.buffers)
    };
    // The status record is rewritten every few hundred milliseconds; idle comes at 4 s.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut held = 0;
    while held == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        held = record().unwrap_or(0);
    }
    assert!(held > 0, "no freed buffer was kept for reuse");
    assert!(
        held <= cap,
        "{held} bytes of kept buffers, above the cap of {cap}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while record() != Some(0) {
        assert!(
            Instant::now() < deadline,
            "an idle server still keeps {:?} bytes of buffers",
            record()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(m);
}

#[test]
fn large_buffers_are_reused_and_freed_when_idle_devfuse() {
    buffers_reused(
        "large_buffers_are_reused_and_freed_when_idle_devfuse",
        false,
    );
}

#[test]
fn large_buffers_are_reused_and_freed_when_idle_uring() {
    buffers_reused("large_buffers_are_reused_and_freed_when_idle_uring", true);
}

/// At the default budget, deleting a large file leaves free pages that the idle server hands
/// back step by step (each step fills the writer's page cache). The memory give-back comes
/// after the last step, so the idle server ends at its floor rather than holding the page
/// cache the vacuum filled.
#[test]
fn idle_give_back_follows_the_idle_vacuum() {
    let test = "idle_give_back_follows_the_idle_vacuum";
    if !common::fuse_or_skip(test) {
        return;
    }
    let m = Mounted::with_env(&[("AGENTFS_MEMORY_IDLE_MS", "1000")]);
    let pid = m.server_pid();
    let chunk: Vec<u8> = (0..MIB as usize).map(|i| (i % 253) as u8).collect();
    let big = m.path("big");
    let mut w = fs::File::create(&big).unwrap();
    for _ in 0..160 {
        w.write_all(&chunk).unwrap();
    }
    w.sync_all().unwrap();
    drop(w);
    fs::remove_file(&big).unwrap();
    fs::write(m.path("marker"), b"synced").unwrap();
    fs::File::open(m.path("marker"))
        .unwrap()
        .sync_all()
        .unwrap();

    // The idle vacuum hands the free pages back over several seconds.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let rec = common::settled_record(pid);
        if rec.free_pages == 0 && rec.db_pages > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "free pages never handed back: {rec:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Then the give-back: within a few status ticks the resident set is at the floor.
    let deadline = Instant::now() + Duration::from_secs(20);
    let idle = loop {
        let rss = agentfs::sys::memory::rss(Some(pid)).unwrap();
        if rss <= IDLE_FLOOR_MIB * MIB || Instant::now() > deadline {
            break rss;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        idle <= IDLE_FLOOR_MIB * MIB,
        "idle RSS {} KiB after the vacuum: above the {IDLE_FLOOR_MIB} MiB floor",
        idle / 1024
    );
    eprintln!("{test}: idle {} KiB", idle / 1024);
    assert_eq!(fs::read(m.path("marker")).unwrap(), b"synced");
    drop(m);
}

/// The request buffers among `pid`'s anonymous mappings, as (buffers, resident KiB) per
/// mapping: a mapping exactly `size_kib` large holds one buffer; two buffers mapped side by
/// side are merged by the kernel into one mapping twice as large. (The buffers are larger than
/// the allocator's mmap threshold, so each is mapped on its own.)
fn resident_of_mappings(pid: u32, size_kib: u64) -> Vec<(u64, u64)> {
    let smaps = fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut out = Vec::new();
    let mut anon = false;
    let mut buffers = 0;
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        match (f.next(), f.next()) {
            (Some("Size:"), Some(v)) => {
                let v = v.parse::<u64>().unwrap_or(0);
                buffers = if anon && (v == size_kib || v == 2 * size_kib) {
                    v / size_kib
                } else {
                    0
                };
            }
            (Some("Rss:"), Some(v)) if buffers > 0 => out.push((buffers, v.parse().unwrap())),
            (Some(first), _) if first.contains('-') && !first.ends_with(':') => {
                // A mapping's first line: range, perms, offset, dev, inode and no path.
                anon = line.split_whitespace().count() == 5;
                buffers = 0;
            }
            _ => {}
        }
    }
    out
}

/// A large WRITE fills a transport thread's whole request buffer (max_write); once idle, the
/// thread hands all but the buffer's head back, so an idle server holds no max_write buffer
/// per thread.
#[test]
fn idle_transport_threads_hand_back_their_buffer_tails() {
    let test = "idle_transport_threads_hand_back_their_buffer_tails";
    if !common::fuse_or_skip(test) {
        return;
    }
    // /dev/fuse threads' buffers, whatever the kernel's io_uring switch says. At an 8 MiB
    // budget the pool of reusable buffers holds none of 1 MiB: a kept buffer mapped next to a
    // request buffer would merge with it into one mapping of another size, which the count
    // below would miss.
    let m = Mounted::with_env(&[
        ("AGENTFS_MEMORY_IDLE_MS", "1000"),
        ("AGENTFS_MEMORY_BUDGET_MIB", "8"),
        ("AGENTFS_FUSE_THREADS", "2"),
        ("AGENTFS_FUSE_URING", "0"),
    ]);
    let pid = m.server_pid();
    let rec = common::settled_record(pid);
    // Two threads' buffers of max_write + 64 KiB, each mapped with the allocator's 16-byte
    // header, rounded up to pages.
    let buf = rec.memory.transport / 2;
    let size_kib = (buf + 16).div_ceil(4096) * 4;
    let head_kib = 128 + 4;
    let chunk: Vec<u8> = (0..MIB as usize).map(|i| (i % 251) as u8).collect();
    let mut w = fs::File::create(m.path("big")).unwrap();
    for _ in 0..32 {
        w.write_all(&chunk).unwrap();
    }
    w.sync_all().unwrap();
    let busy = resident_of_mappings(pid, size_kib);
    assert_eq!(
        busy.iter().map(|&(n, _)| n).sum::<u64>(),
        2,
        "two request buffers of {size_kib} KiB expected: {busy:?}"
    );
    assert!(
        busy.iter().any(|&(n, r)| r > n * head_kib),
        "the large writes left no buffer filled past its head: {busy:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let idle = loop {
        let now = resident_of_mappings(pid, size_kib);
        if now.iter().all(|&(n, r)| r <= n * head_kib) || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        idle.iter().all(|&(n, r)| r <= n * head_kib),
        "idle request buffers still resident past their {head_kib} KiB head: {idle:?} KiB"
    );
    // The next large write refills a buffer and is intact.
    fs::write(m.path("again"), &chunk).unwrap();
    assert_eq!(fs::read(m.path("again")).unwrap(), chunk);
    assert_eq!(fs::metadata(m.path("big")).unwrap().len(), 32 * MIB);
    drop(m);
}

/// The ring's payload buffers are mapped, not filled: a page costs memory once a request or
/// reply was written to it. So a server on the ring that served only small requests holds
/// far less than its request buffers' size (with every page faulted in at mount, its resident
/// set exceeded that size before the first request).
#[test]
fn ring_buffers_hold_only_the_pages_requests_used() {
    let test = "ring_buffers_hold_only_the_pages_requests_used";
    if !common::fuse_or_skip(test) {
        return;
    }
    let Some(_param) = common::UringParam::set("Y") else {
        eprintln!("SKIP {test}: enable_uring is not writable");
        return;
    };
    let m = Mounted::with_env(&[("AGENTFS_FUSE_URING", "1")]);
    let pid = m.server_pid();
    let rec = common::settled_record(pid);
    assert_eq!(rec.transport, "io-uring");
    fs::create_dir(m.path("s")).unwrap();
    for i in 0..500 {
        fs::write(m.path(&format!("s/f{i}")), b"small\n").unwrap();
        assert_eq!(fs::read(m.path(&format!("s/f{i}"))).unwrap(), b"small\n");
    }
    let rec = common::settled_record(pid);
    let rss = agentfs::sys::memory::rss(Some(pid)).unwrap();
    assert!(
        rss < rec.memory.transport,
        "resident {} KiB, request buffers {} KiB",
        rss / 1024,
        rec.memory.transport / 1024
    );
    drop(m);
}
