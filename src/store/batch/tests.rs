//! The batcher against a fake durable backend that "crashes" (freezes) at the Nth barrier:
//! everything acknowledged as durable (a successful fsync or sync) must be in the image the
//! last successful barrier captured (redb `tests/crash_consistency.rs` in spirit).

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;

use super::*;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Default)]
struct FakeState {
    /// What committed transactions hold (lost at a crash unless a barrier captured it).
    committed: HashMap<Ino, Vec<u8>>,
    /// The image the last successful barrier captured: what survives the crash.
    durable: HashMap<Ino, Vec<u8>>,
    barriers: usize,
    /// The barrier number that crashes (never returns success); 0 = never.
    freeze_at: usize,
    frozen: bool,
    /// Inodes whose commits fail with ENOSPC.
    full: Vec<Ino>,
}

#[derive(Default)]
struct Fake {
    st: std::sync::Mutex<FakeState>,
}

impl Fake {
    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Durability for Fake {
    fn commit_batch(&self, batch: &[Arc<InodeBatch>]) -> Result<(), Errno> {
        let mut st = self.lock();
        if st.frozen {
            return Err(Errno::EIO);
        }
        if batch.iter().any(|b| st.full.contains(&b.ino)) {
            return Err(Errno::ENOSPC);
        }
        for b in batch {
            let f = st.committed.entry(b.ino).or_default();
            for (o, d) in b.extents.iter() {
                let end = o as usize + d.len();
                if f.len() < end {
                    f.resize(end, 0);
                }
                f[o as usize..end].copy_from_slice(d);
            }
        }
        Ok(())
    }

    fn barrier(&self) -> Result<(), Errno> {
        let mut st = self.lock();
        if st.frozen {
            return Err(Errno::EIO);
        }
        st.barriers += 1;
        if st.barriers == st.freeze_at {
            st.frozen = true;
            return Err(Errno::EIO);
        }
        st.durable = st.committed.clone();
        Ok(())
    }
}

fn cfg(window_ms: u64, txn_inodes: usize, txn_bytes: u64, cap: u64) -> BatchConfig {
    BatchConfig {
        window: Duration::from_millis(window_ms),
        inode_trigger: 64 * 1024,
        max_pending: cap,
        txn_inodes,
        txn_bytes,
    }
}

const T: Timespec = Timespec { sec: 1, nsec: 0 };

/// One writer thread: its own inodes, writes whose bytes are the write's sequence number on
/// that inode (1..=250, so newer bytes compare greater), fsync now and then. Returns, per
/// inode, the model as of its last successful fsync.
fn writer(b: &Batcher<Fake>, inos: &[Ino], seed: u64, ops: usize) -> HashMap<Ino, Vec<u8>> {
    let mut rng = Rng(seed);
    let mut model: HashMap<Ino, (u8, Vec<u8>)> = HashMap::new();
    let mut promised = HashMap::new();
    for _ in 0..ops {
        let ino = inos[rng.below(inos.len() as u64) as usize];
        let (seq, m) = model.entry(ino).or_default();
        if rng.below(5) == 0 {
            match b.fsync(ino) {
                Ok(()) => {
                    promised.insert(ino, m.clone());
                }
                Err(_) => break, // crashed
            }
            continue;
        }
        if *seq == 250 {
            continue;
        }
        *seq += 1;
        let off = rng.below(200_000) as usize;
        let max = if rng.below(2) == 0 { 4096 } else { 70_000 };
        let len = 1 + rng.below(max) as usize;
        let data = vec![*seq; len];
        b.write(ino, off as u64, &data, Some(T));
        if m.len() < off + len {
            m.resize(off + len, 0);
        }
        m[off..off + len].copy_from_slice(&data);
    }
    promised
}

/// Every byte promised durable is in the surviving image, or a newer write's byte is.
fn check(durable: &HashMap<Ino, Vec<u8>>, promised: &HashMap<Ino, Vec<u8>>, what: &str) {
    for (ino, p) in promised {
        let empty = Vec::new();
        let d = durable.get(ino).unwrap_or(&empty);
        assert!(
            d.len() >= p.len(),
            "{what}: inode {} lost length: {} < promised {}",
            ino.0,
            d.len(),
            p.len()
        );
        for (i, (want, got)) in p.iter().zip(d.iter()).enumerate() {
            assert!(
                got >= want,
                "{what}: inode {} byte {i} is from write {got}, older than fsynced write {want}",
                ino.0
            );
        }
    }
}

fn crash_run(freeze_at: usize, c: BatchConfig, seed: u64) {
    let b = Batcher::new(
        Fake {
            st: std::sync::Mutex::new(FakeState {
                freeze_at,
                ..Default::default()
            }),
        },
        c,
        Default::default(),
    );
    b.start().unwrap();
    let promised: Vec<HashMap<Ino, Vec<u8>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let b = &b;
                s.spawn(move || {
                    let inos: Vec<Ino> = (0..3).map(|i| Ino(100 + t * 10 + i)).collect();
                    writer(b, &inos, seed * 31 + t + 1, 300)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let _ = b.shutdown();
    let st = b.backend().lock();
    let what = format!("freeze at barrier {freeze_at}, {c:?}");
    for p in &promised {
        check(&st.durable, p, &what);
    }
}

#[test]
fn nothing_acknowledged_as_durable_is_lost_at_a_crash() {
    let configs = [
        cfg(0, 1024, 32 << 20, 256 << 20),
        cfg(1, 2, 64 * 1024, 512 * 1024),
        cfg(5, 1, 4096, 128 * 1024),
        cfg(50, 1024, 1 << 20, 64 * 1024),
    ];
    // Every barrier position in release builds (what CI runs); a sample in debug builds,
    // where the full sweep takes many minutes.
    let step = if cfg!(debug_assertions) { 8 } else { 1 };
    for (k, c) in configs.iter().enumerate() {
        for n in (1..=24usize).step_by(step) {
            crash_run(n, *c, (k * 100 + n) as u64);
        }
    }
}

#[test]
fn without_a_crash_everything_is_committed_at_shutdown() {
    let b = Batcher::new(
        Fake::default(),
        cfg(1000, 3, 8192, 64 * 1024),
        Default::default(),
    );
    b.start().unwrap();
    let promised = writer(&b, &[Ino(5), Ino(6), Ino(7)], 9, 500);
    b.sync_all().unwrap();
    assert_eq!(b.pending_bytes(), 0);
    let st = b.backend().lock();
    check(&st.durable, &promised, "clean");
    drop(st);
    b.shutdown().unwrap();
}

#[test]
fn fsync_commits_and_a_barrier_captures_the_inode() {
    let b = Batcher::new(
        Fake::default(),
        cfg(60_000, 1024, 1 << 20, 1 << 30),
        Default::default(),
    );
    // No committer thread: only the fsync can commit.
    b.write(Ino(2), 0, b"hello", Some(T));
    b.write(Ino(3), 0, b"other", Some(T));
    assert!(b.backend().lock().committed.is_empty());
    b.fsync(Ino(2)).unwrap();
    let st = b.backend().lock();
    assert_eq!(
        st.durable.get(&Ino(2)).map(Vec::as_slice),
        Some(&b"hello"[..])
    );
    assert!(
        !st.durable.contains_key(&Ino(3)),
        "fsync commits only its inode"
    );
    drop(st);
    b.sync_all().unwrap();
    assert_eq!(
        b.backend().lock().durable.get(&Ino(3)).map(Vec::as_slice),
        Some(&b"other"[..])
    );
}

#[test]
fn a_failed_commit_is_reported_by_every_later_fsync_and_sync() {
    let b = Batcher::new(
        Fake::default(),
        cfg(60_000, 1024, 1 << 20, 1 << 30),
        Default::default(),
    );
    b.backend().lock().full.push(Ino(4));
    b.write(Ino(4), 0, b"lost", Some(T));
    b.write(Ino(5), 0, b"kept", Some(T));
    // A group commit of both fails; the fallback commits inode 5 alone.
    assert_eq!(b.flush_all(), Err(Errno::ENOSPC));
    assert_eq!(b.fsync(Ino(4)), Err(Errno::ENOSPC));
    assert_eq!(
        b.fsync(Ino(4)),
        Err(Errno::ENOSPC),
        "sticky: not reported once"
    );
    assert_eq!(
        b.fsync(Ino(5)),
        Err(Errno::ENOSPC),
        "every inode's fsync reports it"
    );
    assert_eq!(b.sync_all(), Err(Errno::ENOSPC), "and every sync");
    assert_eq!(b.sync_all(), Err(Errno::ENOSPC));
    let st = b.backend().lock();
    assert_eq!(
        st.durable.get(&Ino(5)).map(Vec::as_slice),
        Some(&b"kept"[..])
    );
    assert!(!st.durable.contains_key(&Ino(4)));
    assert_eq!(b.pending_bytes(), 0, "failed bytes are not kept forever");
}

#[test]
fn writers_wait_at_the_cap_and_memory_stays_bounded() {
    let cap = 256 * 1024;
    let b = Batcher::new(
        Fake::default(),
        cfg(10_000, 1024, 64 * 1024, cap),
        Default::default(),
    );
    b.start().unwrap();
    let stop = AtomicBool::new(false);
    let peak = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(b.pending_bytes(), Ordering::Relaxed);
                std::thread::yield_now();
            }
        });
        for i in 0..2000u64 {
            b.write(Ino(1 + i % 7), (i / 7) * 4096, &[1u8; 4096], Some(T));
            peak.fetch_max(b.pending_bytes(), Ordering::Relaxed);
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        peak.load(Ordering::Relaxed) <= cap,
        "pending exceeded the cap"
    );
    b.sync_all().unwrap();
    let st = b.backend().lock();
    let total: usize = st.durable.values().map(Vec::len).sum();
    assert_eq!(total, 2000 * 4096);
    drop(st);
    b.shutdown().unwrap();
}

#[test]
fn discard_drops_pending_and_claims_restore() {
    let b = Batcher::new(
        Fake::default(),
        cfg(60_000, 1024, 1 << 20, 1 << 30),
        Default::default(),
    );
    b.write(Ino(8), 0, &[7u8; 100], Some(T));
    let c = b.claim(Ino(8)).unwrap();
    b.write(Ino(8), 50, &[9u8; 10], Some(T));
    b.finish(&c, Finish::Restore { clear_mtime: true });
    let (_, v) = b.view(|v| v.read(Ino(8), 0, 200));
    let v = v.unwrap();
    assert_eq!(v.end, 100);
    let mut buf = vec![0u8; 100];
    for l in &v.layers {
        l.overlay(0, &mut buf);
    }
    assert_eq!(&buf[..50], &[7u8; 50][..]);
    assert_eq!(
        &buf[50..60],
        &[9u8; 10][..],
        "the newer write wins over restored bytes"
    );
    assert_eq!(b.view(|v| v.attr(Ino(8))).1.unwrap().mtime, None);
    b.discard(Ino(8));
    assert_eq!(b.pending_bytes(), 0);
    b.sync_all().unwrap();
    assert!(b.backend().lock().durable.is_empty());
}

/// Bytes written while every other pending inode is claimed elsewhere still commit within the
/// window: the committer, asleep without a deadline, hears of them.
#[test]
fn a_write_during_a_claim_elsewhere_is_committed_without_a_barrier() {
    let b = Batcher::new(
        Fake::default(),
        cfg(20, 1024, 1 << 20, 1 << 30),
        Default::default(),
    );
    b.start().unwrap();
    b.write(Ino(1), 0, &[1u8; 10], Some(T));
    let c = b.claim(Ino(1)).unwrap();
    // Past the window: the committer found only a claimed inode and went to sleep.
    std::thread::sleep(Duration::from_millis(100));
    b.write(Ino(2), 0, &[2u8; 10], Some(T));
    b.finish(&c, Finish::Restore { clear_mtime: false });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while b.pending_bytes() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} bytes never committed",
            b.pending_bytes()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = b.backend().lock();
    assert_eq!(st.committed.get(&Ino(1)), Some(&vec![1u8; 10]));
    assert_eq!(st.committed.get(&Ino(2)), Some(&vec![2u8; 10]));
    drop(st);
    b.shutdown().unwrap();
}

/// How often the committer, asleep until the deadline of one file written first (2 s away),
/// is woken while `each` runs for 198 more files (200 µs apart).
fn wakeups_over_198_files(each: impl Fn(&Batcher<Fake>, Ino)) -> (Arc<Batcher<Fake>>, u64) {
    let b = Batcher::new(
        Fake::default(),
        cfg(2_000, 1024, 1 << 20, 1 << 30),
        Default::default(),
    );
    b.start().unwrap();
    b.write(Ino(1), 0, &[1u8; 10], Some(T));
    std::thread::sleep(Duration::from_millis(50));
    let before = b.state.lock().wakeups;
    for i in 2..200 {
        each(&b, Ino(i));
        std::thread::sleep(Duration::from_micros(200));
    }
    let woke = b.state.lock().wakeups - before;
    (b, woke)
}

#[test]
fn new_files_within_one_window_do_not_each_wake_the_committer() {
    // A committer asleep until the first file's deadline has nothing to do before it: each
    // later file only adds a later deadline. Waking it for each cost two context switches per
    // small file.
    let (b, woke) = wakeups_over_198_files(|b, ino| b.write(ino, 0, &[1u8; 10], Some(T)));
    assert!(
        woke <= 3,
        "the committer woke {woke} times for 198 new files"
    );
    b.shutdown().unwrap();
    assert_eq!(b.backend().lock().committed.len(), 199);
}

#[test]
fn claims_that_commit_their_bytes_do_not_wake_the_committer() {
    // An operation that commits a file's pending bytes itself (a link, rename or fsync of a
    // file just written) leaves the committer nothing to do; a claim put back does not.
    let (b, woke) = wakeups_over_198_files(|b, ino| {
        b.write(ino, 0, &[1u8; 10], Some(T));
        let c = b.claim(ino).unwrap();
        b.finish(&c, Finish::Committed);
    });
    assert!(woke <= 3, "the committer woke {woke} times for 198 claims");
    b.shutdown().unwrap();
    // The claimed bytes were committed by their claimers, not by the backend.
    assert_eq!(b.backend().lock().committed.len(), 1);
    assert_eq!(b.pending_bytes(), 0);

    // A claim put back while the committer sleeps without a deadline (everything pending was
    // in flight) must wake it.
    let b = Batcher::new(
        Fake::default(),
        cfg(100, 1024, 1 << 20, 1 << 30),
        Default::default(),
    );
    b.start().unwrap();
    b.write(Ino(500), 0, &[5u8; 10], Some(T));
    let c = b.claim(Ino(500)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(matches!(b.state.lock().asleep, Asleep::Forever));
    let before = b.state.lock().wakeups;
    b.finish(&c, Finish::Restore { clear_mtime: false });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while b.pending_bytes() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a restored claim was never committed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(b.state.lock().wakeups > before);
    assert_eq!(
        b.backend().lock().committed.get(&Ino(500)),
        Some(&vec![5u8; 10])
    );
    b.shutdown().unwrap();
}

#[test]
fn a_claim_put_back_keeps_its_bytes_deadline() {
    // Bytes written while a claim of older bytes was in flight set a later deadline; the older
    // bytes, put back under them, must still be committed by theirs.
    let b = Batcher::new(
        Fake::default(),
        cfg(60_000, 1024, 1 << 20, 1 << 30),
        Default::default(),
    );
    b.start().unwrap();
    b.write(Ino(7), 0, &[1u8; 10], Some(T));
    let first = b.state.lock().inodes[&Ino(7)].since;
    let c = b.claim(Ino(7)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    b.write(Ino(7), 100, &[2u8; 10], Some(T));
    assert!(b.state.lock().inodes[&Ino(7)].since > first);
    b.finish(&c, Finish::Restore { clear_mtime: false });
    assert_eq!(b.state.lock().inodes[&Ino(7)].since, first);
    b.shutdown().unwrap();
}

/// Extents against a byte-per-position model.
#[test]
fn extents_match_a_simple_model() {
    let mut rng = Rng(77);
    for round in 0..200 {
        let mut e = Extents::default();
        let mut m: Vec<Option<u8>> = vec![None; 3 * MAX_EXTENT];
        for step in 0..40u8 {
            let off = rng.below(2 * MAX_EXTENT as u64) as usize;
            let max = if rng.below(3) == 0 { 700_000 } else { 5000 };
            let len = rng.below(max) as usize;
            match rng.below(10) {
                0 => {
                    e.trim(off as u64);
                    m[off..].iter_mut().for_each(|b| *b = None);
                }
                1 => {
                    e.punch(off as u64, (off + len) as u64);
                    m[off..off + len].iter_mut().for_each(|b| *b = None);
                }
                _ => {
                    e.insert(off as u64, &vec![step + 1; len]);
                    m[off..off + len]
                        .iter_mut()
                        .for_each(|b| *b = Some(step + 1));
                }
            }
            let held = m.iter().filter(|b| b.is_some()).count() as u64;
            assert_eq!(e.bytes(), held, "round {round} step {step}: byte count");
            let mut prev_end = 0;
            for (s, d) in e.iter() {
                assert!(s >= prev_end, "overlapping extents");
                prev_end = s + d.len() as u64;
            }
            let mut buf = vec![0u8; m.len()];
            e.overlay(0, &mut buf);
            for (i, b) in m.iter().enumerate() {
                assert_eq!(buf[i], b.unwrap_or(0), "round {round} step {step} byte {i}");
            }
            let end = m.iter().rposition(|b| b.is_some()).map_or(0, |p| p + 1);
            assert_eq!(e.end(), end as u64);
        }
        let total = e.bytes();
        let mut rest = e.clone();
        let first = rest.take_prefix(100_000);
        assert_eq!(first.bytes() + rest.bytes(), total);
        let mut back = rest;
        back.put_under(first);
        assert_eq!(back.bytes(), total, "take_prefix and put_under round-trip");
        let (mut x, mut y) = (vec![0u8; m.len()], vec![0u8; m.len()]);
        back.overlay(0, &mut x);
        e.overlay(0, &mut y);
        assert!(x == y, "take_prefix and put_under round-trip");
    }
}
