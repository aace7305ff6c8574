//! Store micro-benchmarks without the kernel: namespace operations and data paths.
//!
//! Every benchmark calls `agentfs::store::Store` directly (no FUSE, no dispatcher), so the numbers
//! are the floor below which the mount cannot go: SQLite plus our SQL. Each mutation is one
//! `BEGIN IMMEDIATE ... COMMIT` in WAL mode at `synchronous=NORMAL` (no fdatasync per commit).
//!
//! Run: `cargo bench --bench store` (all), `cargo bench --bench store -- store/data` (a group).
//! With `AGENTFS_BENCH_QUICK=1` each benchmark samples for less time.

use std::hint::black_box;
use std::time::Duration;

use agentfs::cache::CacheConfig;
use agentfs::store::{Caller, InitOptions, Ino, NoReferences, RenameFlags, Store};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const CALLER: Caller = Caller { uid: 0, gid: 0 };
const REG: u32 = libc::S_IFREG | 0o644;

/// Entries in the directory of the readdir benchmark.
const DIR_ENTRIES: usize = 10_000;

fn fresh() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("bench.sqlite");
    Store::create(&db, &InitOptions::default()).expect("create");
    let store = Store::open(&db, false).expect("open");
    (dir, store)
}

fn config() -> Criterion {
    let quick = agentfs::knobs::get().bench_quick;
    let (warm, measure) = if quick { (200, 700) } else { (500, 2000) };
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(warm))
        .measurement_time(Duration::from_millis(measure))
}

fn namespace(c: &mut Criterion) {
    let mut g = c.benchmark_group("store/ns");
    let (_d, s) = fresh();
    let mut n = 0u64;
    g.bench_function("create", |b| {
        b.iter(|| {
            n += 1;
            s.mknod(Ino::ROOT, format!("f{n}").as_bytes(), REG, 0, CALLER)
                .expect("create")
        })
    });
    s.mknod(Ino::ROOT, b"target", REG, 0, CALLER)
        .expect("target");
    g.bench_function("lookup", |b| {
        b.iter(|| s.lookup(Ino::ROOT, black_box(b"target")).expect("lookup"))
    });
    g.bench_function("lookup_missing", |b| {
        b.iter(|| s.lookup(Ino::ROOT, black_box(b"nope")).unwrap_err())
    });
    let ino = s.lookup(Ino::ROOT, b"target").expect("target").ino;
    g.bench_function("getattr", |b| {
        b.iter(|| s.getattr(black_box(ino)).expect("getattr"))
    });
    // Rename back and forth between two names: one dentry update per iteration.
    let mut flip = false;
    g.bench_function("rename", |b| {
        b.iter(|| {
            let (from, to): (&[u8], &[u8]) = if flip {
                (b"renamed", b"target")
            } else {
                (b"target", b"renamed")
            };
            flip = !flip;
            s.rename(
                Ino::ROOT,
                from,
                Ino::ROOT,
                to,
                RenameFlags::default(),
                &NoReferences,
            )
            .expect("rename")
        })
    });
    // Unlink alone: the files are made in the (untimed) setup of each batch.
    let mut u = 0u64;
    g.bench_function("unlink", |b| {
        b.iter_batched(
            || {
                u += 1;
                let name = format!("u{u}");
                s.mknod(Ino::ROOT, name.as_bytes(), REG, 0, CALLER)
                    .expect("create");
                name
            },
            |name| {
                s.unlink(Ino::ROOT, name.as_bytes(), &NoReferences)
                    .expect("unlink")
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("create+unlink", |b| {
        b.iter(|| {
            s.mknod(Ino::ROOT, b"tmp", REG, 0, CALLER).expect("create");
            s.unlink(Ino::ROOT, b"tmp", &NoReferences).expect("unlink");
        })
    });
    g.finish();
}

fn readdir(c: &mut Criterion) {
    let mut g = c.benchmark_group("store/readdir");
    let (_d, s) = fresh();
    let dir = s
        .mkdir(Ino::ROOT, b"big", 0o755, CALLER)
        .expect("mkdir")
        .ino;
    for i in 0..DIR_ENTRIES {
        s.mknod(dir, format!("entry-{i:05}").as_bytes(), REG, 0, CALLER)
            .expect("create");
    }
    g.throughput(Throughput::Elements(DIR_ENTRIES as u64));
    // The kernel asks in pages; 128 entries is roughly one 4 KiB READDIR reply.
    for (label, batch) in [
        ("10000/batch128", 128usize),
        ("10000/batch10000", DIR_ENTRIES + 2),
    ] {
        g.bench_function(label, |b| {
            b.iter(|| {
                let mut off = 0u64;
                let mut seen = 0usize;
                loop {
                    let page = s.readdir(dir, off, batch).expect("readdir");
                    let Some(last) = page.last() else { break };
                    off = last.offset;
                    seen += page.len();
                }
                assert_eq!(seen, DIR_ENTRIES + 2);
            })
        });
    }
    g.bench_function("10000/plus_batch128", |b| {
        b.iter(|| {
            let mut off = 0u64;
            loop {
                let page = s.readdirplus(dir, off, 128).expect("readdirplus");
                let Some((last, _)) = page.last() else { break };
                off = last.offset;
            }
        })
    });
    g.finish();
}

/// Entries in the directory of the cache benchmark.
const CACHE_DIR_ENTRIES: usize = 1000;

/// The server-side caches on and off, side by side: getattr, lookup (hit and miss), and a
/// full listing of a 1,000-entry directory in 128-entry pages (readdir and readdirplus).
fn cache(c: &mut Criterion) {
    let mut g = c.benchmark_group("store/cache");
    let k = agentfs::knobs::get();
    let on = CacheConfig {
        attr: 65536,
        lookup: 65536,
        readdir: 131072,
    };
    for (mode, caching) in [("on", on), ("off", CacheConfig::OFF)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("bench.sqlite");
        Store::create(&db, &InitOptions::default()).expect("create");
        let batching = Some(agentfs::store::batch::BatchConfig::from_knobs(k));
        let namespace = agentfs::store::NamespaceBatch::from_knobs(k);
        let s = Store::open_with(&db, false, batching, namespace, caching).expect("open");
        let big = s
            .mkdir(Ino::ROOT, b"big", 0o755, CALLER)
            .expect("mkdir")
            .ino;
        for i in 0..CACHE_DIR_ENTRIES {
            s.mknod(big, format!("entry-{i:04}").as_bytes(), REG, 0, CALLER)
                .expect("create");
        }
        let ino = s
            .mknod(Ino::ROOT, b"target", REG, 0, CALLER)
            .expect("target")
            .ino;
        g.throughput(Throughput::Elements(1));
        g.bench_function(format!("getattr/{mode}"), |b| {
            b.iter(|| s.getattr(black_box(ino)).expect("getattr"))
        });
        g.bench_function(format!("lookup/{mode}"), |b| {
            b.iter(|| s.lookup(Ino::ROOT, black_box(b"target")).expect("lookup"))
        });
        g.bench_function(format!("lookup_missing/{mode}"), |b| {
            b.iter(|| s.lookup(Ino::ROOT, black_box(b"nope")).unwrap_err())
        });
        g.throughput(Throughput::Elements(CACHE_DIR_ENTRIES as u64));
        g.bench_function(format!("readdir_1000/{mode}"), |b| {
            b.iter(|| {
                let mut off = 0u64;
                while let Some(last) = s.readdir(big, off, 128).expect("readdir").last() {
                    off = last.offset;
                }
            })
        });
        g.bench_function(format!("readdirplus_1000/{mode}"), |b| {
            b.iter(|| {
                let mut off = 0u64;
                while let Some((last, _)) = s.readdirplus(big, off, 128).expect("plus").last() {
                    off = last.offset;
                }
            })
        });
    }
    g.finish();
}

fn data(c: &mut Criterion) {
    let mut g = c.benchmark_group("store/data");
    for size in [4096usize, 65536, 1 << 20] {
        let (_d, s) = fresh();
        let ino = s
            .mknod(Ino::ROOT, b"f", REG, 0, CALLER)
            .expect("create")
            .ino;
        let buf = vec![7u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        // Sequential writes wrapping within 64 MiB (overwrites after the first lap).
        let mut off = 0u64;
        g.bench_function(format!("write/{size}"), |b| {
            b.iter(|| {
                s.write(ino, off, &buf).expect("write");
                off = (off + size as u64) % (64 << 20);
            })
        });
        // Read back what was written, cycling over the written range.
        let written = s.getattr(ino).expect("getattr").size.max(size as u64);
        let mut roff = 0u64;
        g.bench_function(format!("read/{size}"), |b| {
            b.iter(|| {
                let d = s.read(ino, roff, size as u32).expect("read");
                roff = (roff + size as u64) % written;
                d
            })
        });
    }
    // 4 KiB overwrites at random aligned offsets of a 16 MiB file, one transaction each (the
    // path of every WRITE with batching off, and of a partly covered chunk at a group commit).
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("bench.sqlite");
    Store::create(&db, &InitOptions::default()).expect("create");
    let caching = agentfs::cache::CacheConfig::from_knobs(agentfs::knobs::get());
    let s = Store::open_with(&db, false, None, None, caching).expect("open");
    let ino = s
        .mknod(Ino::ROOT, b"r", REG, 0, CALLER)
        .expect("create")
        .ino;
    let mib = vec![3u8; 1 << 20];
    for i in 0..16u64 {
        s.write(ino, i << 20, &mib).expect("prefill");
    }
    let block = vec![9u8; 4096];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    g.throughput(Throughput::Bytes(4096));
    g.bench_function("overwrite_random/4096", |b| {
        b.iter(|| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s.write(ino, (x % 4096) * 4096, &block).expect("write")
        })
    });
    g.finish();
}

/// Growth of a file across the inline threshold (4 KiB by default) into 64 KiB chunks: each
/// iteration makes a fresh file and appends until it is chunked.
fn growth(c: &mut Criterion) {
    let mut g = c.benchmark_group("store/growth");
    let (_d, s) = fresh();
    let cfg = s.config();
    let piece = vec![1u8; 1024];
    let target = cfg.inline_threshold as usize + 2 * 1024;
    g.throughput(Throughput::Bytes(target as u64));
    let mut n = 0u64;
    g.bench_function("inline_to_chunk_1k_appends", |b| {
        b.iter_batched(
            || {
                n += 1;
                s.mknod(Ino::ROOT, format!("g{n}").as_bytes(), REG, 0, CALLER)
                    .expect("create")
                    .ino
            },
            |ino| {
                let mut off = 0usize;
                while off < target {
                    s.write(ino, off as u64, &piece).expect("write");
                    off += piece.len();
                }
            },
            BatchSize::SmallInput,
        )
    });
    // The single write that crosses the threshold: from inline_threshold - 512 bytes to
    // inline_threshold + 512.
    let below = vec![2u8; cfg.inline_threshold as usize - 512];
    let cross = vec![3u8; 1024];
    g.bench_function("threshold_crossing_write", |b| {
        b.iter_batched(
            || {
                n += 1;
                let ino = s
                    .mknod(Ino::ROOT, format!("g{n}").as_bytes(), REG, 0, CALLER)
                    .expect("create")
                    .ino;
                s.write(ino, 0, &below).expect("write");
                ino
            },
            |ino| s.write(ino, below.len() as u64, &cross).expect("write"),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = namespace, readdir, cache, data, growth
}
criterion_main!(benches);
