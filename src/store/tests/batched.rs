//! The batched write path through the store: pending bytes are visible at once, never a
//! second authority, and land in the database with the SPEC layout when committed.

use super::*;

fn held() -> Db {
    fresh_cfg(65536, 4096, Some(batching(60_000)))
}

#[test]
fn reads_and_getattr_see_pending_writes_before_any_commit() {
    let db = held();
    let f = db.file(Ino::ROOT, "f");
    db.write(f, 0, &pattern(100_000, 1)).unwrap();
    assert_eq!(
        db.q("SELECT size FROM fs_inode WHERE ino = 2"),
        0,
        "not committed yet"
    );
    assert!(db.pending_bytes() >= 100_000);
    let a = db.getattr(f).unwrap();
    assert_eq!(a.size, 100_000);
    assert!(a.blocks >= 100_000 / 512);
    assert_eq!(db.lookup(Ino::ROOT, b"f").unwrap().size, 100_000);
    let plus = db.readdirplus(Ino::ROOT, 0, 10).unwrap();
    assert!(plus
        .iter()
        .any(|(e, a)| e.name == b"f" && a.size == 100_000));
    assert!(db.all(f) == pattern(100_000, 1));
    db.sync().unwrap();
    assert_eq!(db.pending_bytes(), 0);
    assert_eq!(db.q("SELECT size FROM fs_inode WHERE ino = 2"), 100_000);
    assert!(db.all(f) == pattern(100_000, 1));
    db.assert_clean();
}

#[test]
fn truncate_trims_pending_bytes_and_commits_the_rest() {
    let db = held();
    let f = db.file(Ino::ROOT, "f");
    db.write(f, 0, &pattern(200_000, 2)).unwrap();
    db.setattr(
        f,
        &SetAttr {
            size: Some(70_000),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(db.pending_bytes(), 0, "committed with the truncate");
    assert_eq!(db.rows(f), 2, "nothing past the new size was written");
    assert!(db.all(f) == pattern(200_000, 2)[..70_000]);
    db.assert_clean();
}

#[test]
fn punch_hole_drops_pending_bytes_in_the_range() {
    let db = held();
    let f = db.file(Ino::ROOT, "f");
    db.write(f, 0, &pattern(200_000, 3)).unwrap();
    let mode = (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32;
    db.fallocate(f, 0, 131_072, mode).unwrap();
    assert_eq!(db.rows(f), 2, "the two punched chunks were never stored");
    let mut want = pattern(200_000, 3);
    want[..131_072].fill(0);
    assert!(db.all(f) == want);
    db.assert_clean();
}

#[test]
fn unlinked_and_reaped_inodes_lose_their_pending_bytes() {
    let db = held();
    let f = db.file(Ino::ROOT, "gone");
    db.write(f, 0, &pattern(50_000, 4)).unwrap();
    db.unlink(Ino::ROOT, b"gone", &NoReferences).unwrap();
    assert_eq!(db.pending_bytes(), 0);
    // An orphan keeps them until it is reaped.
    let g = db.file(Ino::ROOT, "orphan");
    db.write(g, 0, &pattern(50_000, 5)).unwrap();
    db.unlink(Ino::ROOT, b"orphan", &Keep).unwrap();
    assert!(db.all(g) == pattern(50_000, 5), "still readable while open");
    db.reap(&[g]).unwrap();
    assert_eq!(db.pending_bytes(), 0);
    db.sync().unwrap();
    assert_eq!(db.q("SELECT count(*) FROM fs_data"), 0);
    db.assert_clean();
}

#[test]
fn the_committer_skips_an_inode_deleted_under_it() {
    let db = held();
    let f = db.file(Ino::ROOT, "f");
    db.write(f, 0, b"bytes").unwrap();
    // Delete the rows behind the batcher's back (as a crash-recovery reap would).
    db.raw()
        .execute_batch("DELETE FROM fs_dentry WHERE ino = 2; DELETE FROM fs_inode WHERE ino = 2;")
        .unwrap();
    db.sync().unwrap();
    assert_eq!(db.q("SELECT count(*) FROM fs_inode WHERE ino = 2"), 0);
    db.assert_clean();
}

#[test]
fn rename_carries_pending_bytes() {
    let db = held();
    let f = db.file(Ino::ROOT, "a");
    db.write(f, 0, &pattern(9000, 6)).unwrap();
    db.rename(
        Ino::ROOT,
        b"a",
        Ino::ROOT,
        b"b",
        RenameFlags::default(),
        &NoReferences,
    )
    .unwrap();
    let b = db.lookup(Ino::ROOT, b"b").unwrap();
    assert_eq!(b.size, 9000);
    db.sync().unwrap();
    assert!(db.all(b.ino) == pattern(9000, 6));
}

#[test]
fn dense_small_files_stay_inline_and_out_of_order_writes_merge() {
    let db = held();
    let f = db.file(Ino::ROOT, "small");
    db.write(f, 100, &[2u8; 100]).unwrap();
    db.write(f, 0, &[1u8; 100]).unwrap();
    db.sync().unwrap();
    assert_eq!(db.kind(f), 1, "dense and small: inline");
    let mut want = vec![1u8; 100];
    want.extend([2u8; 100]);
    assert_eq!(db.all(f), want);
    let g = db.file(Ino::ROOT, "sparse");
    db.write(g, 3000, &[3u8; 10]).unwrap();
    db.sync().unwrap();
    assert_eq!(db.kind(g), 0, "a hole spills to chunks");
    db.assert_clean();
}

#[test]
fn an_explicit_mtime_wins_over_pending_writes() {
    let db = held();
    let f = db.file(Ino::ROOT, "t");
    db.write(f, 0, b"data").unwrap();
    let at = Timespec { sec: 1000, nsec: 5 };
    let a = db
        .setattr(
            f,
            &SetAttr {
                mtime: Some(TimeSet::At(at)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.mtime, at);
    assert_eq!(a.size, 4, "setattr's answer merges pending size");
    assert!(
        db.pending_bytes() > 0,
        "times-only SETATTR keeps bytes pending"
    );
    db.sync().unwrap();
    assert_eq!(db.getattr(f).unwrap().mtime, at);
    assert_eq!(db.all(f), b"data");
}

#[test]
fn whole_chunks_and_partial_chunks_commit_to_the_same_bytes() {
    let db = held();
    let f = db.file(Ino::ROOT, "f");
    db.write(f, 0, &pattern(65536 * 3, 7)).unwrap();
    db.sync().unwrap();
    // Partial writes into committed chunks merge with the stored bytes.
    db.write(f, 10, &[9u8; 20]).unwrap();
    db.write(f, 65536 + 5, &[8u8; 70_000]).unwrap();
    db.sync().unwrap();
    let mut want = pattern(65536 * 3, 7);
    want[10..30].fill(9);
    want[65541..65541 + 70_000].fill(8);
    assert!(db.all(f) == want);
    db.assert_clean();
}

#[test]
fn copy_file_range_and_lseek_see_pending_bytes() {
    let db = held();
    let a = db.file(Ino::ROOT, "a");
    let b = db.file(Ino::ROOT, "b");
    db.write(a, 0, &pattern(100_000, 8)).unwrap();
    assert_eq!(db.copy_file_range(a, 0, b, 0, 100_000).unwrap(), 100_000);
    assert!(db.all(b) == pattern(100_000, 8));
    let c = db.file(Ino::ROOT, "c");
    db.write(c, 200_000, b"x").unwrap();
    assert_eq!(db.lseek(c, 0, libc::SEEK_DATA as u32).unwrap(), 196_608);
    db.assert_clean();
}

/// An operation answers the attributes its transaction returned with the pending bytes folded
/// in, unless bytes left the pending map since it began: attributes read before a commit of
/// the inode's bytes would then answer the size without them.
#[test]
fn an_answer_is_read_again_when_bytes_were_committed_since_its_transaction() {
    let db = held();
    let f = db.file(Ino::ROOT, "t");
    db.write(f, 0, b"data").unwrap();
    let v0 = db.pending_version();
    let before = db.read_tx(|c| inode::attr_of(c, &db.config, f)).unwrap();
    assert_eq!(before.size, 0, "the bytes are only pending");
    assert_eq!(
        db.answer(f, v0, before).unwrap().size,
        4,
        "pending bytes fold in"
    );
    db.sync().unwrap();
    assert_eq!(
        db.answer(f, v0, before).unwrap().size,
        4,
        "the bytes were committed after the read: read again"
    );
}

/// A chmod, chown or utimes, and a group commit, leave the attributes they wrote in the cache
/// (what `tar -x` does to each file before `rm -rf` lists it): the cached copy is what the
/// database holds, pending bytes merged the same way.
#[test]
fn attributes_a_setattr_or_a_commit_wrote_stay_cached_as_stored() {
    let db = held();
    let f = db.file(Ino::ROOT, "f");
    let stored = |what: &str| {
        let a = inode::attr_of(&db.raw(), &db.config, f).unwrap();
        if crate::knobs::get().cache {
            assert_eq!(db.caches.attr(f), Some(a), "{what}: cached as stored");
        }
        a
    };
    db.write(f, 0, &pattern(10_000, 1)).unwrap();
    let set = |set: SetAttr| db.setattr(f, &set).unwrap();
    let a = set(SetAttr {
        mode: Some(0o600),
        ..Default::default()
    });
    assert_eq!(
        (a.mode & 0o7777, a.size),
        (0o600, 10_000),
        "pending size merged"
    );
    assert_eq!(stored("chmod with bytes pending").size, 0);
    let at = Timespec { sec: 1000, nsec: 5 };
    set(SetAttr {
        mtime: Some(TimeSet::At(at)),
        uid: Some(7),
        ..Default::default()
    });
    assert_eq!(stored("chown and utimes").uid, 7);
    assert_eq!(db.getattr(f).unwrap().mtime, at, "the explicit mtime wins");
    db.sync().unwrap();
    let a = stored("committed");
    assert_eq!((a.size, a.mtime), (10_000, at));
    assert_eq!(db.getattr(f).unwrap(), a);
    set(SetAttr {
        size: Some(5),
        ..Default::default()
    });
    assert!(db.caches.attr(f).is_none(), "a size change drops them");
    assert_eq!(db.getattr(f).unwrap().size, 5);
}
