use super::*;

const SIZES: [usize; 8] = [0, 1, 4095, 4096, 4097, 65535, 65536, 65537];

fn layouts() -> Vec<Db> {
    vec![fresh(), fresh_with(4096, 1024)]
}

#[test]
fn inline_and_chunk_transitions_at_boundaries() {
    for db in layouts() {
        let cfg = db.config();
        for (i, &n) in SIZES.iter().enumerate() {
            // One write of n bytes.
            let f = db.file(Ino::ROOT, &format!("one{i}"));
            let data = pattern(n, i as u8);
            assert_eq!(db.write(f, 0, &data).unwrap() as usize, n);
            assert_eq!(db.all(f), data);
            let a = db.getattr(f).unwrap();
            assert_eq!(a.size, n as u64);
            let inline = n as u64 <= cfg.inline_threshold;
            assert_eq!(db.kind(f), inline as i64, "size {n} cfg {cfg:?}");
            let want_rows = if inline {
                0
            } else {
                (n as u64).div_ceil(cfg.chunk_size)
            };
            assert_eq!(db.rows(f) as u64, want_rows, "size {n}");
            assert_eq!(a.blocks, (n as u64).div_ceil(512));
            // Grown by appends of 1000 bytes.
            let g = db.file(Ino::ROOT, &format!("grow{i}"));
            for (k, piece) in data.chunks(1000).enumerate() {
                db.write(g, (k * 1000) as u64, piece).unwrap();
            }
            assert_eq!(db.all(g), data);
            assert_eq!(db.kind(g), inline as i64);
            // Shrunk back to each smaller size.
            for &m in SIZES.iter().filter(|&&m| m <= n) {
                let h = db.file(Ino::ROOT, &format!("shrink{i}_{m}"));
                db.write(h, 0, &data).unwrap();
                db.setattr(
                    h,
                    &SetAttr {
                        size: Some(m as u64),
                        ..Default::default()
                    },
                )
                .unwrap();
                assert_eq!(db.all(h), data[..m]);
                assert_eq!(
                    db.kind(h),
                    (m as u64 <= cfg.inline_threshold) as i64,
                    "{n}->{m}"
                );
            }
        }
        db.assert_clean();
    }
}

#[test]
fn sparse_writes_read_holes_as_zeros() {
    for db in layouts() {
        let cs = db.config().chunk_size as usize;
        let f = db.file(Ino::ROOT, "sparse");
        db.write(f, 0, b"0123456789").unwrap();
        db.write(f, 10, b"abc").unwrap();
        assert_eq!(db.kind(f), 1);
        // A write past EOF leaves a hole: chunked now.
        let far = 3 * cs + 100;
        db.write(f, far as u64, b"xyz").unwrap();
        assert_eq!(db.kind(f), 0);
        let all = db.all(f);
        assert_eq!(all.len(), far + 3);
        let mut want = vec![0u8; far + 3];
        want[..13].copy_from_slice(b"0123456789abc");
        want[far..].copy_from_slice(b"xyz");
        assert_eq!(all, want);
        assert_eq!(db.rows(f), 2);
        assert!(db.getattr(f).unwrap().blocks * 512 < (far as u64));
        // Reads straddling the hole.
        assert_eq!(db.read(f, (far - 2) as u64, 10).unwrap(), b"\0\0xyz");
        assert_eq!(db.read(f, (far + 3) as u64, 10).unwrap(), b"");
        db.assert_clean();
    }
}

#[test]
fn write_to_new_empty_file_at_offset_is_sparse() {
    let db = fresh();
    let f = db.file(Ino::ROOT, "f");
    db.write(f, 100, b"x").unwrap();
    assert_eq!(db.kind(f), 0);
    assert_eq!(db.all(f)[..100], [0u8; 100]);
    db.assert_clean();
}

#[test]
fn truncate_never_resurrects_stale_bytes() {
    for db in layouts() {
        let cs = db.config().chunk_size;
        let thr = db.config().inline_threshold;
        for (new, ext) in [
            (cs + 17, 3 * cs),
            (10, 2 * cs),
            (thr + 1, cs * 2),
            (0, cs + 1),
            (cs, cs * 2),
        ] {
            let f = db.file(Ino::ROOT, &format!("t{new}_{ext}"));
            let data = vec![0xABu8; (3 * cs) as usize];
            db.write(f, 0, &data).unwrap();
            db.setattr(
                f,
                &SetAttr {
                    size: Some(new),
                    ..Default::default()
                },
            )
            .unwrap();
            db.setattr(
                f,
                &SetAttr {
                    size: Some(ext),
                    ..Default::default()
                },
            )
            .unwrap();
            let all = db.all(f);
            assert_eq!(all.len() as u64, ext);
            assert!(all[..new as usize].iter().all(|b| *b == 0xAB));
            assert!(
                all[new as usize..].iter().all(|b| *b == 0),
                "stale bytes after {new}"
            );
            // Extending by a write past EOF too.
            db.setattr(
                f,
                &SetAttr {
                    size: Some(new),
                    ..Default::default()
                },
            )
            .unwrap();
            db.write(f, ext, b"!").unwrap();
            let all = db.all(f);
            assert!(all[new as usize..ext as usize].iter().all(|b| *b == 0));
        }
        db.assert_clean();
    }
}

#[test]
fn truncate_extend_inline_stays_inline_then_spills() {
    let db = fresh_with(4096, 1024);
    let size = |f, n| {
        db.setattr(
            f,
            &SetAttr {
                size: Some(n),
                ..Default::default()
            },
        )
        .unwrap();
    };
    let f = db.file(Ino::ROOT, "f");
    db.write(f, 0, b"abc").unwrap();
    size(f, 1024);
    assert_eq!(db.kind(f), 1, "explicit zeros inline while it fits");
    size(f, 5000);
    assert_eq!(db.kind(f), 0);
    let all = db.all(f);
    assert_eq!(&all[..3], b"abc");
    assert!(all[3..].iter().all(|b| *b == 0));
    // Row 0 holds all 1024 remaining bytes: dense, so back inline.
    size(f, 1000);
    assert_eq!(db.kind(f), 1);
    // Straight from 3 bytes to a hole: row 0 has 3 bytes.
    let g = db.file(Ino::ROOT, "g");
    db.write(g, 0, b"abc").unwrap();
    size(g, 5000);
    assert_eq!(db.kind(g), 0);
    assert_eq!(db.rows(g), 1);
    size(g, 1000);
    assert_eq!(db.kind(g), 0, "sparse remainder stays chunked");
    assert_eq!(db.all(g)[..4], *b"abc\0");
    size(g, 3);
    assert_eq!(db.kind(g), 1);
    assert_eq!(db.all(g), b"abc");
    db.assert_clean();
}

#[test]
fn setattr_size_errnos_and_times() {
    let db = fresh();
    let d = db.dir(Ino::ROOT, "d");
    let fifo = db
        .mknod(Ino::ROOT, b"p", libc::S_IFIFO | 0o644, 0, ME)
        .unwrap()
        .ino;
    let sz = SetAttr {
        size: Some(1),
        ..Default::default()
    };
    assert_eq!(db.setattr(d, &sz), Err(Errno::EISDIR));
    assert_eq!(db.setattr(fifo, &sz), Err(Errno::EINVAL));
    let f = db.file(Ino::ROOT, "f");
    let before = db.getattr(f).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let after = db
        .setattr(
            f,
            &SetAttr {
                size: Some(100),
                ..Default::default()
            },
        )
        .unwrap();
    assert!(after.mtime != before.mtime && after.ctime != before.ctime);
    let t = Timespec {
        sec: 1_000_000,
        nsec: 123_456_789,
    };
    let a = db
        .setattr(
            f,
            &SetAttr {
                atime: Some(TimeSet::At(t)),
                mtime: Some(TimeSet::At(t)),
                mode: Some(0o4711),
                uid: Some(5),
                gid: Some(6),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((a.atime, a.mtime), (t, t));
    assert_eq!(a.mode, libc::S_IFREG | 0o4711);
    assert_eq!((a.uid, a.gid), (5, 6));
    assert!(a.ctime.sec > 1_000_000);
    let a = db
        .setattr(
            f,
            &SetAttr {
                ctime: Some(t),
                atime: Some(TimeSet::Now),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.ctime, t);
    assert!(a.atime.sec > 1_000_000);
    let bad = Timespec {
        sec: 1,
        nsec: 1_000_000_000,
    };
    assert_eq!(
        db.setattr(
            f,
            &SetAttr {
                mtime: Some(TimeSet::At(bad)),
                ..Default::default()
            }
        ),
        Err(Errno::EINVAL)
    );
    // A failed setattr changed nothing (one transaction).
    assert_eq!(db.getattr(f).unwrap().mtime, t);
}

#[test]
fn write_updates_times_and_reads_do_not_touch_atime() {
    let db = fresh();
    let f = db.file(Ino::ROOT, "f");
    let t = Timespec { sec: 5, nsec: 6 };
    db.setattr(
        f,
        &SetAttr {
            atime: Some(TimeSet::At(t)),
            mtime: Some(TimeSet::At(t)),
            ..Default::default()
        },
    )
    .unwrap();
    db.read(f, 0, 10).unwrap();
    assert_eq!(db.getattr(f).unwrap().atime, t);
    db.write(f, 0, b"x").unwrap();
    let a = db.getattr(f).unwrap();
    assert!(a.mtime.sec > 5 && a.ctime.sec > 5);
    assert_eq!(a.atime, t);
}

#[test]
fn data_ops_on_wrong_types() {
    let db = fresh();
    let d = db.dir(Ino::ROOT, "d");
    let l = db.symlink(Ino::ROOT, b"l", b"d", ME).unwrap().ino;
    assert_eq!(db.read(d, 0, 1), Err(Errno::EISDIR));
    assert_eq!(db.write(d, 0, b"x"), Err(Errno::EISDIR));
    assert_eq!(db.read(l, 0, 1), Err(Errno::EINVAL));
    assert_eq!(db.write(l, 0, b"x"), Err(Errno::EINVAL));
    assert_eq!(db.read(Ino(999), 0, 1), Err(Errno::ENOENT));
    let f = db.file(Ino::ROOT, "f");
    assert_eq!(db.write(f, i64::MAX as u64, b"x"), Err(Errno::EFBIG));
    assert_eq!(db.write(f, 0, b"").unwrap(), 0);
    db.assert_clean();
}

#[test]
fn partial_chunk_writes_merge() {
    let db = fresh_with(4096, 0);
    let f = db.file(Ino::ROOT, "f");
    let mut model = vec![0u8; 0];
    for (off, len, seed) in [
        (0, 10000, 1),
        (4000, 200, 2),
        (8192, 4096, 3),
        (4095, 2, 4),
        (12000, 5000, 5),
    ] {
        let d = pattern(len, seed);
        db.write(f, off as u64, &d).unwrap();
        if model.len() < off + len {
            model.resize(off + len, 0);
        }
        model[off..off + len].copy_from_slice(&d);
        assert_eq!(db.all(f), model);
    }
    db.assert_clean();
}

#[test]
fn punch_hole_zeroes_and_drops_chunks() {
    for db in layouts() {
        let cs = db.config().chunk_size;
        let f = db.file(Ino::ROOT, "f");
        let n = (4 * cs + 100) as usize;
        let data = pattern(n, 9);
        db.write(f, 0, &data).unwrap();
        let mode = (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32;
        // From the middle of chunk 0 to the middle of chunk 3.
        let (off, len) = (cs / 2, 3 * cs);
        db.fallocate(f, off, len, mode).unwrap();
        let mut want = data.clone();
        want[off as usize..(off + len) as usize].fill(0);
        assert_eq!(db.all(f), want);
        assert_eq!(db.getattr(f).unwrap().size, n as u64);
        assert_eq!(db.rows(f), 3, "chunks 1 and 2 dropped");
        // Punch the tail past EOF: size stays, last partial row dropped.
        db.fallocate(f, 4 * cs, 1 << 30, mode).unwrap();
        want[(4 * cs) as usize..].fill(0);
        assert_eq!(db.all(f), want);
        assert_eq!(db.rows(f), 2);
        // Inline punch.
        let g = db.file(Ino::ROOT, "g");
        db.write(g, 0, b"abcdef").unwrap();
        db.fallocate(g, 1, 2, mode).unwrap();
        assert_eq!(db.all(g), b"a\0\0def");
        db.assert_clean();
    }
}

#[test]
fn fallocate_modes() {
    let db = fresh();
    let f = db.file(Ino::ROOT, "f");
    db.fallocate(f, 0, 100, 0).unwrap();
    assert_eq!(db.getattr(f).unwrap().size, 100);
    assert_eq!(db.kind(f), 1);
    db.fallocate(f, 0, 200_000, 0).unwrap();
    assert_eq!(db.getattr(f).unwrap().size, 200_000);
    db.fallocate(f, 0, 10, 0).unwrap();
    assert_eq!(db.getattr(f).unwrap().size, 200_000, "mode 0 never shrinks");
    db.fallocate(f, 0, 500_000, libc::FALLOC_FL_KEEP_SIZE as u32)
        .unwrap();
    assert_eq!(db.getattr(f).unwrap().size, 200_000);
    assert_eq!(
        db.fallocate(f, 0, 10, libc::FALLOC_FL_PUNCH_HOLE as u32),
        Err(Errno::EOPNOTSUPP)
    );
    assert_eq!(
        db.fallocate(f, 0, 10, libc::FALLOC_FL_COLLAPSE_RANGE as u32),
        Err(Errno::EOPNOTSUPP)
    );
    assert_eq!(db.fallocate(f, 0, 0, 0), Err(Errno::EINVAL));
    let d = db.dir(Ino::ROOT, "d");
    assert_eq!(db.fallocate(d, 0, 1, 0), Err(Errno::EISDIR));
    db.assert_clean();
}

#[test]
fn seek_data_and_hole() {
    let db = fresh_with(4096, 1024);
    let (data, hole) = (libc::SEEK_DATA as u32, libc::SEEK_HOLE as u32);
    let f = db.file(Ino::ROOT, "f");
    // data [0,4096) hole [4096,8192) data [8192,8292) hole [8292, 12288) data [12288, 12300)
    db.write(f, 0, &pattern(4096, 1)).unwrap();
    db.write(f, 8192, &pattern(100, 2)).unwrap();
    db.write(f, 12288, &pattern(12, 3)).unwrap();
    assert_eq!(db.lseek(f, 0, data).unwrap(), 0);
    assert_eq!(db.lseek(f, 0, hole).unwrap(), 4096);
    assert_eq!(db.lseek(f, 4096, data).unwrap(), 8192);
    assert_eq!(db.lseek(f, 5000, hole).unwrap(), 5000);
    assert_eq!(db.lseek(f, 8192, hole).unwrap(), 8292);
    assert_eq!(db.lseek(f, 8292, data).unwrap(), 12288);
    assert_eq!(db.lseek(f, 12288, hole).unwrap(), 12300);
    assert_eq!(db.lseek(f, 12299, data).unwrap(), 12299);
    assert_eq!(db.lseek(f, 12300, data), Err(Errno::ENXIO));
    assert_eq!(db.lseek(f, 12300, hole), Err(Errno::ENXIO));
    // Trailing hole.
    db.setattr(
        f,
        &SetAttr {
            size: Some(20000),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(db.lseek(f, 12300, data), Err(Errno::ENXIO));
    assert_eq!(db.lseek(f, 12300, hole).unwrap(), 12300);
    assert_eq!(db.lseek(f, 19999, hole).unwrap(), 19999);
    // Inline: all data.
    let g = db.file(Ino::ROOT, "g");
    db.write(g, 0, b"hello").unwrap();
    assert_eq!(db.lseek(g, 2, data).unwrap(), 2);
    assert_eq!(db.lseek(g, 2, hole).unwrap(), 5);
    assert_eq!(db.lseek(g, 5, data), Err(Errno::ENXIO));
    assert_eq!(db.lseek(g, 0, 0), Err(Errno::EINVAL));
}

#[test]
fn copy_file_range_copies_in_one_transaction() {
    for db in layouts() {
        let a = db.file(Ino::ROOT, "a");
        let b = db.file(Ino::ROOT, "b");
        let data = pattern(150_000, 4);
        db.write(a, 0, &data).unwrap();
        assert_eq!(
            db.copy_file_range(a, 1000, b, 10, 100_000).unwrap(),
            100_000
        );
        let mut want = vec![0u8; 10];
        want.extend_from_slice(&data[1000..101_000]);
        assert_eq!(db.all(b), want);
        // Short at EOF of the input.
        assert_eq!(db.copy_file_range(a, 149_000, b, 0, 5000).unwrap(), 1000);
        assert_eq!(db.copy_file_range(a, 200_000, b, 0, 5000).unwrap(), 0);
        // Overlap within one file.
        assert_eq!(db.copy_file_range(a, 0, a, 10, 100), Err(Errno::EINVAL));
        assert_eq!(db.copy_file_range(a, 0, a, 100_000, 100).unwrap(), 100);
        let d = db.dir(Ino::ROOT, "d");
        assert_eq!(db.copy_file_range(a, 0, d, 0, 1), Err(Errno::EISDIR));
        db.assert_clean();
    }
}
