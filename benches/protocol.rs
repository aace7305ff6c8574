//! Protocol micro-benchmarks: decode and encode of the hot opcodes, without the kernel or store.
//!
//! Requests are built by hand as the kernel lays them out on /dev/fuse: `fuse_in_header`
//! (40 bytes), the opcode's `in_args[0]` struct, then the payload (a NUL-terminated name for
//! LOOKUP, the data for WRITE). Replies are the bodies of `agentfs::protocol::reply` plus the
//! 16-byte out header, as the /dev/fuse transport sends them.
//!
//! Run: `cargo bench --bench protocol`.

use std::hint::black_box;
use std::time::Duration;

use agentfs::abi::{self, Opcode};
use agentfs::protocol::{self, reply, Operation, Reply};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use zerocopy::IntoBytes;

fn config() -> Criterion {
    let quick = agentfs::knobs::get().bench_quick;
    let (warm, measure) = if quick { (200, 500) } else { (500, 1500) };
    Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(warm))
        .measurement_time(Duration::from_millis(measure))
}

/// One whole request message: header (with `len` filled in) ++ op struct ++ payload.
fn message(opcode: Opcode, nodeid: u64, op_in: &[u8], payload: &[u8]) -> Vec<u8> {
    let len = size_of::<abi::InHeader>() + op_in.len() + payload.len();
    let h = abi::InHeader {
        len: u32::try_from(len).expect("fits"),
        opcode: opcode as u32,
        unique: 42,
        nodeid,
        uid: 1000,
        gid: 1000,
        pid: 4242,
        total_extlen: 0,
        padding: 0,
    };
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(h.as_bytes());
    m.extend_from_slice(op_in);
    m.extend_from_slice(payload);
    m
}

fn sample_attr() -> abi::Attr {
    abi::Attr {
        ino: 1234,
        size: 65536,
        blocks: 128,
        atime: 1_700_000_000,
        mtime: 1_700_000_000,
        ctime: 1_700_000_000,
        mode: libc::S_IFREG | 0o644,
        nlink: 1,
        uid: 1000,
        gid: 1000,
        blksize: 4096,
        ..abi::Attr::default()
    }
}

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("protocol/decode");
    g.throughput(Throughput::Elements(1));

    let lookup = message(Opcode::Lookup, 1, &[], b"Cargo.toml\0");
    assert!(matches!(
        protocol::decode(&lookup).expect("lookup").op,
        Operation::Lookup { .. }
    ));
    g.bench_function("lookup", |b| {
        b.iter(|| protocol::decode(black_box(&lookup)).expect("decode"))
    });

    let getattr_in = abi::GetattrIn {
        getattr_flags: abi::FUSE_GETATTR_FH,
        dummy: 0,
        fh: 7,
    };
    let getattr = message(Opcode::Getattr, 1234, getattr_in.as_bytes(), &[]);
    assert!(matches!(
        protocol::decode(&getattr).expect("getattr").op,
        Operation::Getattr { fh: Some(7) }
    ));
    g.bench_function("getattr", |b| {
        b.iter(|| protocol::decode(black_box(&getattr)).expect("decode"))
    });

    let read_in = abi::ReadIn {
        fh: 7,
        offset: 1 << 20,
        size: 131_072,
        flags: libc::O_RDONLY as u32,
        ..abi::ReadIn::default()
    };
    let read = message(Opcode::Read, 1234, read_in.as_bytes(), &[]);
    assert!(matches!(
        protocol::decode(&read).expect("read").op,
        Operation::Read { .. }
    ));
    g.bench_function("read", |b| {
        b.iter(|| protocol::decode(black_box(&read)).expect("decode"))
    });

    for size in [4096usize, 1 << 20] {
        let write_in = abi::WriteIn {
            fh: 7,
            offset: 0,
            size: u32::try_from(size).expect("fits"),
            flags: libc::O_WRONLY as u32,
            ..abi::WriteIn::default()
        };
        let data = vec![0xabu8; size];
        let write = message(Opcode::Write, 1234, write_in.as_bytes(), &data);
        match protocol::decode(&write).expect("write").op {
            Operation::Write { data, .. } => assert_eq!(data.len(), size),
            other => panic!("decoded as {other:?}"),
        }
        g.bench_function(format!("write/{size}"), |b| {
            b.iter(|| protocol::decode(black_box(&write)).expect("decode"))
        });
    }
    g.finish();
}

fn encode(c: &mut Criterion) {
    let mut g = c.benchmark_group("protocol/encode");
    g.throughput(Throughput::Elements(1));

    let entry = abi::EntryOut {
        nodeid: 1234,
        generation: 0,
        entry_valid: 1,
        attr_valid: 1,
        entry_valid_nsec: 0,
        attr_valid_nsec: 0,
        attr: sample_attr(),
    };
    g.bench_function("lookup_entry", |b| {
        b.iter(|| {
            Reply::Data(reply::entry(black_box(&entry)))
                .to_message(42)
                .expect("message")
        })
    });

    let attr = abi::AttrOut {
        attr_valid: 1,
        attr_valid_nsec: 0,
        dummy: 0,
        attr: sample_attr(),
    };
    g.bench_function("getattr_attr", |b| {
        b.iter(|| {
            Reply::Data(reply::attr(black_box(&attr)))
                .to_message(42)
                .expect("message")
        })
    });

    // READ replies are the data itself; what the transport builds is the header (the body goes
    // out by writev without a copy) — benchmark both the header and a copied message.
    let data = vec![0x5au8; 131_072];
    g.bench_function("read_header_128k", |b| {
        b.iter(|| protocol::out_header(42, 0, black_box(data.len())))
    });
    g.bench_function("read_message_128k", |b| {
        b.iter(|| {
            Reply::Data(black_box(&data).clone())
                .to_message(42)
                .expect("message")
        })
    });

    g.bench_function("write_out", |b| {
        b.iter(|| {
            Reply::Data(reply::write(black_box(131_072)))
                .to_message(42)
                .expect("message")
        })
    });

    g.bench_function("error_enoent", |b| {
        b.iter(|| {
            Reply::Error(agentfs::errno::Errno::ENOENT)
                .to_message(black_box(42))
                .expect("message")
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = decode, encode
}
criterion_main!(benches);
