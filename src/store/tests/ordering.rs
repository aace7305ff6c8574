//! Commit order: a namespace operation never commits ahead of the pending data and
//! attributes of the inodes it names, and a truncate to zero commits with the bytes written
//! after it. "Committed" here is what a second, read-only open of the database sees after the
//! open namespace batch commits on its own (a crash at that moment keeps exactly that).

use super::*;

/// Pending bytes held for a minute; namespace operations held until [`Db::raw`].
fn held() -> Db {
    fresh_cfg(65536, 4096, Some(batching(60_000)))
}

/// The contents of `path` in the committed database, after the open namespace batch commits.
fn committed(db: &Db, path: &str) -> Vec<u8> {
    drop(db.raw());
    let ro = Store::open(&db.path(), true).unwrap();
    let ino = ro.resolve(format!("/{path}").as_bytes()).unwrap();
    let size = ro.getattr(ino).unwrap().size;
    ro.read(ino, 0, u32::try_from(size).unwrap()).unwrap()
}

/// A file `name` in the root whose `content` is committed.
fn committed_file(db: &Db, name: &str, content: &[u8]) -> Ino {
    let f = db.file(Ino::ROOT, name);
    db.write(f, 0, content).unwrap();
    db.sync().unwrap();
    f
}

#[test]
fn a_rename_over_a_file_commits_the_new_contents_with_it() {
    let db = held();
    committed_file(&db, "f", &pattern(20_000, 1));
    let tmp = db.file(Ino::ROOT, ".f.tmp");
    db.write(tmp, 0, &pattern(30_000, 2)).unwrap();
    let none = RenameFlags::default();
    db.rename(Ino::ROOT, b".f.tmp", Ino::ROOT, b"f", none, &NoReferences)
        .unwrap();
    assert!(committed(&db, "f") == pattern(30_000, 2));
    // Small files (inline) and a rename into another directory alike.
    let d = db.dir(Ino::ROOT, "d");
    let small = db.file(Ino::ROOT, "small");
    db.write(small, 0, b"small contents").unwrap();
    db.rename(Ino::ROOT, b"small", d, b"moved", none, &NoReferences)
        .unwrap();
    assert_eq!(committed(&db, "d/moved"), b"small contents");
    db.assert_clean();
}

#[test]
fn a_link_commits_the_contents_with_it() {
    let db = held();
    let tmp = db.file(Ino::ROOT, "tmp_obj");
    db.write(tmp, 0, &pattern(5_000, 3)).unwrap();
    // The link answers attributes that count the bytes it committed.
    assert_eq!(db.link(tmp, Ino::ROOT, b"object").unwrap().size, 5_000);
    db.unlink(Ino::ROOT, b"tmp_obj", &NoReferences).unwrap();
    assert!(committed(&db, "object") == pattern(5_000, 3));
    db.assert_clean();
}

#[test]
fn removing_one_name_of_a_linked_file_commits_its_pending_bytes() {
    let db = held();
    let f = committed_file(&db, "a", b"old");
    db.link(f, Ino::ROOT, b"b").unwrap();
    db.write(f, 0, b"new").unwrap();
    let src = db.file(Ino::ROOT, "src");
    db.rename(
        Ino::ROOT,
        b"src",
        Ino::ROOT,
        b"a",
        RenameFlags::default(),
        &NoReferences,
    )
    .unwrap();
    assert_eq!(committed(&db, "b"), b"new", "rename over one name");
    db.write(f, 0, b"NEW").unwrap();
    db.unlink(Ino::ROOT, b"b", &Keep).unwrap();
    drop(db.raw());
    let ro = Store::open(&db.path(), true).unwrap();
    assert_eq!(
        ro.read(f, 0, 10).unwrap(),
        b"NEW",
        "unlink of the last name"
    );
    assert!(db.getattr(src).is_ok());
}

#[test]
fn a_truncate_to_zero_commits_with_the_bytes_written_after_it() {
    let db = held();
    let old = pattern(100_000, 4);
    let f = committed_file(&db, "f", &old);
    let zero = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    let a = db.setattr(f, &zero).unwrap();
    assert_eq!((a.size, a.blocks), (0, 0));
    assert!(committed(&db, "f") == old, "the cut waits for its data");
    assert!(db.read(f, 0, 100).unwrap().is_empty());
    db.write(f, 10, b"new").unwrap();
    assert_eq!(db.getattr(f).unwrap().size, 13);
    assert_eq!(db.read(f, 0, 100).unwrap(), b"\0\0\0\0\0\0\0\0\0\0new");
    assert!(committed(&db, "f") == old);
    // A rename commits it, together with the bytes.
    let none = RenameFlags::default();
    db.rename(Ino::ROOT, b"f", Ino::ROOT, b"g", none, &NoReferences)
        .unwrap();
    assert_eq!(committed(&db, "g"), b"\0\0\0\0\0\0\0\0\0\0new");
    // fsync commits a cut alone; a SETATTR of times commits a pending cut too.
    db.setattr(f, &zero).unwrap();
    db.fsync(f).unwrap();
    assert!(committed(&db, "g").is_empty());
    db.write(f, 0, &pattern(70_000, 5)).unwrap();
    db.fsync(f).unwrap();
    db.setattr(f, &zero).unwrap();
    db.write(f, 0, b"x").unwrap();
    let t = Timespec { sec: 1000, nsec: 0 };
    let times = SetAttr {
        mtime: Some(TimeSet::At(t)),
        ..Default::default()
    };
    assert_eq!(db.setattr(f, &times).unwrap().mtime, t);
    assert_eq!(committed(&db, "g"), b"x");
    assert_eq!(db.getattr(f).unwrap().mtime, t);
    db.assert_clean();
}

/// The attributes a truncate to zero answers say size 0 even when the cut is committed
/// (here by a concurrent fsync) before they are read: the kernel takes that size as the
/// file's, and with the writeback cache a stale size keeps stale pages that it later writes
/// back over the new contents.
#[test]
fn a_truncate_to_zero_answers_size_zero_while_the_cut_commits_concurrently() {
    let db = std::sync::Arc::new(fresh_cfg(65536, 4096, Some(batching(0))));
    let f = committed_file(&db, "f", &pattern(70_000, 6));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let syncer = {
        let (db, stop) = (db.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                db.fsync(f).unwrap();
            }
        })
    };
    let zero = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    let mut wrong = 0;
    for _ in 0..1000 {
        db.write(f, 0, &pattern(70_000, 7)).unwrap();
        db.fsync(f).unwrap();
        if db.setattr(f, &zero).unwrap().size != 0 {
            wrong += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    syncer.join().unwrap();
    assert_eq!(wrong, 0, "truncates to zero that answered the old size");
}
