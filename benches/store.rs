//! Store micro-benchmarks without the kernel: namespace operations and data paths.

use std::hint::black_box;

use agentfs::store::{Caller, InitOptions, Ino, NoReferences, Store};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const CALLER: Caller = Caller { uid: 0, gid: 0 };

fn fresh() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("bench.sqlite");
    Store::create(&db, &InitOptions::default()).expect("create");
    let store = Store::open(&db, false).expect("open");
    (dir, store)
}

fn namespace(c: &mut Criterion) {
    let (_d, s) = fresh();
    let mut n = 0u64;
    c.bench_function("store/create", |b| {
        b.iter(|| {
            n += 1;
            s.mknod(
                Ino::ROOT,
                format!("f{n}").as_bytes(),
                libc::S_IFREG | 0o644,
                0,
                CALLER,
            )
            .expect("create")
        })
    });
    c.bench_function("store/lookup", |b| {
        b.iter(|| s.lookup(Ino::ROOT, black_box(b"f1")).expect("lookup"))
    });
    let ino = s.lookup(Ino::ROOT, b"f1").expect("f1").ino;
    c.bench_function("store/getattr", |b| {
        b.iter(|| s.getattr(black_box(ino)).expect("getattr"))
    });
    c.bench_function("store/create+unlink", |b| {
        b.iter(|| {
            s.mknod(Ino::ROOT, b"tmp", libc::S_IFREG | 0o644, 0, CALLER)
                .expect("create");
            s.unlink(Ino::ROOT, b"tmp", &NoReferences).expect("unlink");
        })
    });
}

fn data(c: &mut Criterion) {
    let mut g = c.benchmark_group("store/data");
    for size in [4096usize, 65536, 1 << 20] {
        let (_d, s) = fresh();
        let ino = s
            .mknod(Ino::ROOT, b"f", libc::S_IFREG | 0o644, 0, CALLER)
            .expect("create")
            .ino;
        let buf = vec![7u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        let mut off = 0u64;
        g.bench_function(format!("write/{size}"), |b| {
            b.iter(|| {
                s.write(ino, off, &buf).expect("write");
                off = (off + size as u64) % (64 << 20);
            })
        });
        g.bench_function(format!("read/{size}"), |b| {
            b.iter_batched(
                || 0u64,
                |o| s.read(ino, o, size as u32).expect("read"),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, namespace, data);
criterion_main!(benches);
