use super::*;

const NONE: RenameFlags = RenameFlags {
    noreplace: false,
    exchange: false,
};
const NOREPLACE: RenameFlags = RenameFlags {
    noreplace: true,
    exchange: false,
};
const EXCHANGE: RenameFlags = RenameFlags {
    noreplace: false,
    exchange: true,
};

#[test]
fn create_lookup_and_errnos() {
    let db = fresh();
    let a = db
        .mknod(Ino::ROOT, b"f", libc::S_IFREG | 0o640, 0, ME)
        .unwrap();
    assert_eq!(
        (a.mode, a.nlink, a.uid, a.gid, a.size),
        (libc::S_IFREG | 0o640, 1, 1000, 1000, 0)
    );
    assert_eq!(
        db.lookup(Ino::ROOT, b"f").unwrap(),
        db.getattr(a.ino).unwrap()
    );
    assert_eq!(
        db.mknod(Ino::ROOT, b"f", libc::S_IFREG | 0o640, 0, ME),
        Err(Errno::EEXIST)
    );
    assert_eq!(db.mkdir(Ino::ROOT, b"f", 0o755, ME), Err(Errno::EEXIST));
    assert_eq!(db.lookup(Ino::ROOT, b"nope"), Err(Errno::ENOENT));
    assert_eq!(db.lookup(a.ino, b"x"), Err(Errno::ENOTDIR));
    assert_eq!(db.lookup(Ino(12345), b"x"), Err(Errno::ENOENT));
    assert_eq!(db.lookup(Ino::ROOT, &[b'a'; 256]), Err(Errno::ENAMETOOLONG));
    assert_eq!(
        db.mkdir(Ino::ROOT, &[b'a'; 256], 0o755, ME),
        Err(Errno::ENAMETOOLONG)
    );
    assert!(db.mkdir(Ino::ROOT, &[b'a'; 255], 0o755, ME).is_ok());
    assert_eq!(db.mkdir(a.ino, b"x", 0o755, ME), Err(Errno::ENOTDIR));
    assert_eq!(db.mkdir(Ino(999), b"x", 0o755, ME), Err(Errno::ENOENT));
    assert_eq!(
        db.mknod(Ino::ROOT, b"d", libc::S_IFDIR | 0o755, 0, ME),
        Err(Errno::EINVAL)
    );
    assert_eq!(db.lookup(Ino::ROOT, b".").unwrap().ino, Ino::ROOT);
    assert_eq!(db.lookup(Ino::ROOT, b"..").unwrap().ino, Ino::ROOT);
    let d = db.dir(Ino::ROOT, "d");
    assert_eq!(db.lookup(d, b"..").unwrap().ino, Ino::ROOT);
    db.assert_clean();
}

#[test]
fn special_files_and_symlinks() {
    let db = fresh();
    for (name, kind, rdev) in [
        ("fifo", libc::S_IFIFO, 0),
        ("chr", libc::S_IFCHR, 0x0103),
        ("blk", libc::S_IFBLK, 0x0801),
        ("sock", libc::S_IFSOCK, 0),
    ] {
        let a = db
            .mknod(Ino::ROOT, name.as_bytes(), kind | 0o600, rdev, ME)
            .unwrap();
        assert_eq!(a.mode, kind | 0o600);
        assert_eq!(a.rdev, rdev);
        assert_eq!(db.kind(a.ino), 0);
    }
    let l = db.symlink(Ino::ROOT, b"l", b"../some/where", ME).unwrap();
    assert_eq!(l.mode, libc::S_IFLNK | 0o777);
    assert_eq!(l.size, 13);
    assert_eq!(db.readlink(l.ino).unwrap(), b"../some/where");
    assert_eq!(db.readlink(Ino::ROOT), Err(Errno::EINVAL));
    // Non-UTF-8 names and targets round-trip.
    let odd = db.symlink(Ino::ROOT, b"\xff\xfe", b"\x80x", ME).unwrap();
    assert_eq!(db.readlink(odd.ino).unwrap(), b"\x80x");
    assert_eq!(db.lookup(Ino::ROOT, b"\xff\xfe").unwrap().ino, odd.ino);
    let names: Vec<Vec<u8>> = db
        .readdir(Ino::ROOT, 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&b"\xff\xfe".to_vec()));
    db.assert_clean();
}

#[test]
fn setgid_directories_pass_on_group() {
    let db = fresh();
    let d = db.dir(Ino::ROOT, "d");
    db.setattr(
        d,
        &SetAttr {
            gid: Some(77),
            mode: Some(0o2775),
            ..Default::default()
        },
    )
    .unwrap();
    let f = db.mknod(d, b"f", libc::S_IFREG | 0o644, 0, ME).unwrap();
    assert_eq!(f.gid, 77);
    assert_eq!(f.mode & libc::S_ISGID, 0);
    let sub = db.mkdir(d, b"sub", 0o755, ME).unwrap();
    assert_eq!(sub.gid, 77);
    assert_ne!(sub.mode & libc::S_ISGID, 0);
    let plain = db.mkdir(Ino::ROOT, b"plain", 0o755, ME).unwrap();
    assert_eq!(plain.gid, 1000);
}

#[test]
fn nlink_reporting_and_hard_links() {
    let db = fresh();
    let a = db.dir(Ino::ROOT, "a");
    let _b = db.dir(a, "b");
    let _c = db.dir(a, "c");
    let f = db.file(a, "f");
    assert_eq!(db.getattr(Ino::ROOT).unwrap().nlink, 3);
    assert_eq!(db.getattr(a).unwrap().nlink, 4);
    assert_eq!(
        db.q(&format!("SELECT nlink FROM fs_inode WHERE ino = {}", a.0)),
        1
    );
    let l = db.link(f, Ino::ROOT, b"f2").unwrap();
    assert_eq!(l.nlink, 2);
    assert_eq!(db.link(f, Ino::ROOT, b"f2"), Err(Errno::EEXIST));
    assert_eq!(db.link(a, Ino::ROOT, b"a2"), Err(Errno::EPERM));
    assert_eq!(db.link(Ino(999), Ino::ROOT, b"zz"), Err(Errno::ENOENT));
    // An unlink names the inode it leaves with other names, and only that one.
    assert_eq!(db.unlink(a, b"f", &NoReferences), Ok(Some(f)));
    assert_eq!(db.getattr(f).unwrap().nlink, 1);
    assert_eq!(db.read(f, 0, 1).unwrap(), b"");
    let g = db.file(a, "g");
    assert_eq!(db.unlink(a, b"g", &Keep), Ok(None));
    assert_eq!(db.getattr(g).unwrap().nlink, 0);
    db.reap(&[g]).unwrap();
    db.rmdir(a, b"b", &NoReferences).unwrap();
    assert_eq!(db.getattr(a).unwrap().nlink, 3);
    db.assert_clean();
}

#[test]
fn parent_times_change_on_entry_changes() {
    let db = fresh();
    let d = db.dir(Ino::ROOT, "d");
    let old = Timespec { sec: 1, nsec: 0 };
    let reset = |ino| {
        db.setattr(
            ino,
            &SetAttr {
                mtime: Some(TimeSet::At(old)),
                ctime: Some(old),
                ..Default::default()
            },
        )
        .unwrap()
    };
    reset(d);
    let f = db.file(d, "f");
    assert!(db.getattr(d).unwrap().mtime.sec > 1);
    reset(d);
    reset(f);
    db.link(f, d, b"g").unwrap();
    let (da, fa) = (db.getattr(d).unwrap(), db.getattr(f).unwrap());
    assert!(da.mtime.sec > 1 && da.ctime.sec > 1 && fa.ctime.sec > 1);
    assert_eq!(fa.mtime, old);
    reset(d);
    reset(f);
    db.unlink(d, b"g", &NoReferences).unwrap();
    assert!(db.getattr(d).unwrap().mtime.sec > 1 && db.getattr(f).unwrap().ctime.sec > 1);
    reset(d);
    reset(f);
    db.rename(d, b"f", d, b"h", NONE, &NoReferences).unwrap();
    assert!(db.getattr(d).unwrap().mtime.sec > 1 && db.getattr(f).unwrap().ctime.sec > 1);
}

/// A name of a non-directory coming or going updates the parent's cached attributes in
/// place (the kernel asks for them after every such change); they must then be what the
/// database holds, and a change that moves a link count (or a no-op rename) must not leave a
/// copy that is wrong.
#[test]
fn a_directorys_cached_attributes_follow_the_names_changed_in_it() {
    let db = fresh();
    let d = db.dir(Ino::ROOT, "d");
    let e = db.dir(Ino::ROOT, "e");
    let same = |what: &str, updated: bool| {
        for p in [d, e] {
            let held = db.caches.attr(p);
            let stored = inode::attr_of(&db.raw(), &db.config, p).unwrap();
            assert_eq!(db.getattr(p).unwrap(), stored, "{what}");
            if updated && crate::knobs::get().cache {
                assert_eq!(
                    held,
                    Some(stored),
                    "{what}: the cache holds the new attributes"
                );
            }
        }
    };
    same("start", false);
    let f = db.file(d, "f");
    same("create", true);
    db.symlink(d, b"s", b"target", ME).unwrap();
    same("symlink", true);
    db.link(f, e, b"g").unwrap();
    same("link", true);
    db.rename(d, b"f", e, b"h", NONE, &NoReferences).unwrap();
    same("rename to another directory", true);
    db.rename(e, b"h", e, b"g", NONE, &NoReferences).unwrap();
    same("rename onto another name of the same inode", false);
    db.rename(d, b"s", e, b"g", EXCHANGE, &NoReferences)
        .unwrap();
    same("exchange", true);
    db.unlink(e, b"h", &NoReferences).unwrap();
    same("unlink", true);
    db.dir(d, "sub");
    same("mkdir", true);
    db.rename(d, b"sub", e, b"sub", NONE, &NoReferences)
        .unwrap();
    same("a directory renamed", false);
    db.rmdir(e, b"sub", &NoReferences).unwrap();
    same("rmdir", true);
    // A copy that may hold a later change is dropped: a later time (changes reporting out of
    // order), or the same ctime with another mtime (a utimes at the same instant).
    let now = db.getattr(d).unwrap().mtime;
    let before = Timespec {
        sec: now.sec - 1,
        nsec: 0,
    };
    db.caches
        .entry_changed_at(d, b"x", before, 0, ListingEdit::Unknown);
    assert_eq!(db.caches.attr(d), None);
    if !crate::knobs::get().cache {
        return;
    }
    let t = Timespec {
        sec: now.sec + 10,
        nsec: 0,
    };
    let moved = |mtime, ctime, links| {
        let a = Attr {
            mtime,
            ctime,
            ..db.getattr(d).unwrap()
        };
        db.caches.put_attr(&db.caches.ticket(), a);
        db.caches
            .entry_changed_at(d, b"x", t, links, ListingEdit::Unknown);
        db.caches
            .attr(d)
            .map(|b| (b.mtime, b.ctime, b.nlink - a.nlink))
    };
    let held = |mtime, ctime| moved(mtime, ctime, 0).map(|(m, c, _)| (m, c));
    assert_eq!(
        held(now, now),
        Some((t, t)),
        "an older copy takes the times"
    );
    assert_eq!(
        held(t, t),
        Some((t, t)),
        "a copy that saw the change is kept"
    );
    assert_eq!(held(now, t), None, "the same ctime with another mtime");
    assert_eq!(
        moved(now, now, 1),
        Some((t, t, 1)),
        "an older copy takes a new subdirectory's link"
    );
    assert_eq!(
        moved(t, t, 1),
        None,
        "a copy that may have counted the link already"
    );
    // After a lost batch the caches are cleared and nothing is updated in place.
    db.failure().lost_ops(Errno::EIO, 1);
    assert_eq!(held(now, now), None, "after a loss");
}

/// A directory's cached listing follows the names created, linked and removed in it (a new
/// entry has the largest cookie), and goes when it cannot follow (a rename brings an entry
/// with an older cookie): whatever it holds is what the database lists.
#[test]
fn a_directorys_cached_listing_follows_the_names_created_and_removed_in_it() {
    let db = fresh();
    let d = db.dir(Ino::ROOT, "d");
    let e = db.dir(Ino::ROOT, "e");
    let same = |what: &str, kept: bool| {
        for p in [d, e] {
            let stored = dir::names(&db.raw(), p, 0, 1000).unwrap();
            match db.caches.listing(p).as_deref() {
                Some(Listing::Entries(held)) => assert_eq!(held, &stored, "{what}"),
                Some(Listing::TooBig) => panic!("{what}: too big"),
                None => assert!(
                    !kept || !crate::knobs::get().cache,
                    "{what}: the listing was dropped"
                ),
            }
            // Listed again, so the next step starts from a cached listing.
            assert_eq!(db.readdir(p, 0, 1000).unwrap(), stored, "{what}");
        }
    };
    same("a new directory's listing is known", true);
    let f = db.file(d, "f");
    same("create", true);
    db.symlink(d, b"s", b"target", ME).unwrap();
    db.dir(d, "sub");
    same("symlink and mkdir", true);
    db.link(f, e, b"g").unwrap();
    same("link", true);
    db.unlink(d, b"f", &NoReferences).unwrap();
    same("unlink", true);
    db.rename(d, b"s", e, b"s", NONE, &NoReferences).unwrap();
    same("rename", false);
    db.rmdir(d, b"sub", &NoReferences).unwrap();
    same("rmdir", true);
    assert_eq!(
        db.rmdir(Ino::ROOT, b"e", &NoReferences),
        Err(Errno::ENOTEMPTY)
    );
    same("a failed rmdir", false);
    db.unlink(e, b"g", &NoReferences).unwrap();
    db.unlink(e, b"s", &NoReferences).unwrap();
    same("emptied", true);
    assert!(!crate::knobs::get().cache || db.caches.empty_dir(e));
    db.rmdir(Ino::ROOT, b"e", &NoReferences).unwrap();
    assert!(
        db.caches.listing(e).is_none(),
        "a removed directory's listing goes"
    );
}

#[test]
fn unlink_and_rmdir_errnos() {
    let db = fresh();
    let d = db.dir(Ino::ROOT, "d");
    let f = db.file(d, "f");
    assert_eq!(
        db.unlink(Ino::ROOT, b"d", &NoReferences),
        Err(Errno::EISDIR)
    );
    assert_eq!(db.rmdir(d, b"f", &NoReferences), Err(Errno::ENOTDIR));
    assert_eq!(
        db.rmdir(Ino::ROOT, b"d", &NoReferences),
        Err(Errno::ENOTEMPTY)
    );
    assert_eq!(db.rmdir(d, b".", &NoReferences), Err(Errno::EINVAL));
    assert_eq!(db.rmdir(d, b"..", &NoReferences), Err(Errno::ENOTEMPTY));
    assert_eq!(db.unlink(d, b"nope", &NoReferences), Err(Errno::ENOENT));
    assert_eq!(db.unlink(f, b"x", &NoReferences), Err(Errno::ENOTDIR));
    db.unlink(d, b"f", &NoReferences).unwrap();
    assert_eq!(db.getattr(f), Err(Errno::ENOENT));
    db.rmdir(Ino::ROOT, b"d", &NoReferences).unwrap();
    assert_eq!(db.getattr(d), Err(Errno::ENOENT));
    db.assert_clean();
}

/// An unnamed regular file (the kernel sends LINK for one only when it came from O_TMPFILE)
/// gets a name back and is no orphan any more; a directory never does.
#[test]
fn an_unnamed_file_can_be_named() {
    let db = fresh();
    let t = db
        .tmpfile(Ino::ROOT, 0o600, crate::store::Caller { uid: 0, gid: 0 })
        .unwrap();
    assert_eq!(t.nlink, 0);
    assert_eq!(db.q("SELECT count(*) FROM fs_dentry"), 0);
    db.write(t.ino, 0, b"tmp").unwrap();
    let a = db.link(t.ino, Ino::ROOT, b"named").unwrap();
    assert_eq!(a.nlink, 1);
    db.reap(&[t.ino]).unwrap();
    assert_eq!(db.lookup(Ino::ROOT, b"named").unwrap().ino, t.ino);
    assert_eq!(db.read(t.ino, 0, 10).unwrap(), b"tmp");
    db.assert_clean();
}

#[test]
fn orphans_are_retained_then_reaped() {
    let db = fresh();
    let f = db.file(Ino::ROOT, "f");
    db.write(f, 0, &pattern(100_000, 1)).unwrap();
    db.setxattr(f, b"user.k", b"v", 0).unwrap();
    db.unlink(Ino::ROOT, b"f", &Keep).unwrap();
    // Still readable and writable through the inode.
    let a = db.getattr(f).unwrap();
    assert_eq!(a.nlink, 0);
    assert_eq!(db.read(f, 0, 10).unwrap(), pattern(10, 1));
    db.write(f, 0, b"zz").unwrap();
    assert_eq!(db.lookup(Ino::ROOT, b"f"), Err(Errno::ENOENT));
    let findings = db.check().unwrap();
    assert_eq!(findings.len(), 1);
    assert_eq!(findings[0].rule, "orphan");
    // Reaped together with a live inode: the orphan goes, the live one stays.
    let g = db.file(Ino::ROOT, "g");
    db.reap(&[g, f]).unwrap();
    assert!(db.getattr(g).is_ok());
    assert_eq!(db.getattr(f), Err(Errno::ENOENT));
    assert_eq!(db.q("SELECT count(*) FROM fs_data"), 0);
    assert_eq!(db.q("SELECT count(*) FROM fs_xattr"), 0);
    db.assert_clean();
    // Orphaned directory, and reap_orphans at mount start.
    let d = db.dir(Ino::ROOT, "d");
    db.rmdir(Ino::ROOT, b"d", &Keep).unwrap();
    assert_eq!(db.getattr(d).unwrap().nlink, 0);
    assert_eq!(db.mknod(d, b"x", libc::S_IFREG, 0, ME), Err(Errno::ENOENT));
    let h = db.file(Ino::ROOT, "h");
    db.rename(Ino::ROOT, b"g", Ino::ROOT, b"h", NONE, &Keep)
        .unwrap();
    assert_eq!(db.getattr(h).unwrap().nlink, 0);
    assert_eq!(db.reap_orphans().unwrap(), 2);
    assert_eq!(db.reap_orphans().unwrap(), 0);
    assert!(db.getattr(Ino::ROOT).is_ok());
    db.assert_clean();
}

/// Whatever kind an inode is (chunked or inline file, symlink, FIFO, directory, each with an
/// extended attribute), the last name's removal leaves none of its rows behind.
#[test]
fn every_kind_of_inode_leaves_no_rows_when_it_dies() {
    let db = fresh();
    let chunked = db.file(Ino::ROOT, "chunked");
    db.write(chunked, 0, &pattern(200_000, 3)).unwrap();
    let inline = db.file(Ino::ROOT, "inline");
    db.write(inline, 0, b"small").unwrap();
    let link = db.symlink(Ino::ROOT, b"link", b"chunked", ME).unwrap().ino;
    let fifo = db
        .mknod(Ino::ROOT, b"fifo", libc::S_IFIFO | 0o644, 0, ME)
        .unwrap()
        .ino;
    let dir = db.dir(Ino::ROOT, "dir");
    for ino in [chunked, inline, link, fifo, dir] {
        db.setxattr(ino, b"user.k", b"v", 0).unwrap();
    }
    assert!(db.q("SELECT count(*) FROM fs_data") > 0);
    assert_eq!(db.q("SELECT count(*) FROM fs_symlink"), 1);
    for name in ["chunked", "inline", "link", "fifo"] {
        db.unlink(Ino::ROOT, name.as_bytes(), &NoReferences)
            .unwrap();
    }
    db.rmdir(Ino::ROOT, b"dir", &NoReferences).unwrap();
    for table in ["fs_data", "fs_symlink", "fs_xattr"] {
        assert_eq!(db.q(&format!("SELECT count(*) FROM {table}")), 0, "{table}");
    }
    assert_eq!(db.q("SELECT count(*) FROM fs_inode"), 1);
    db.assert_clean();
}

#[test]
fn rename_basic_and_over_targets() {
    let db = fresh();
    let a = db.dir(Ino::ROOT, "a");
    let b = db.dir(Ino::ROOT, "b");
    let f = db.file(a, "f");
    db.rename(a, b"f", b, b"g", NONE, &NoReferences).unwrap();
    assert_eq!(db.lookup(b, b"g").unwrap().ino, f);
    assert_eq!(db.lookup(a, b"f"), Err(Errno::ENOENT));
    // Over an existing file: the target loses its name and is deleted.
    let t = db.file(b, "t");
    db.write(t, 0, &pattern(70_000, 1)).unwrap();
    db.rename(b, b"g", b, b"t", NONE, &NoReferences).unwrap();
    assert_eq!(db.lookup(b, b"t").unwrap().ino, f);
    assert_eq!(db.getattr(t), Err(Errno::ENOENT));
    assert_eq!(db.rows(t), 0);
    // Same inode (hard links): no-op, both names stay.
    db.link(f, b, b"t2").unwrap();
    db.rename(b, b"t", b, b"t2", NONE, &NoReferences).unwrap();
    assert_eq!(db.lookup(b, b"t").unwrap().ino, f);
    assert_eq!(db.lookup(b, b"t2").unwrap().ino, f);
    // Dir over empty dir; dir moves change ".." and parent nlink.
    let e = db.dir(Ino::ROOT, "e");
    db.rename(Ino::ROOT, b"a", Ino::ROOT, b"e", NONE, &NoReferences)
        .unwrap();
    assert_eq!(db.getattr(e), Err(Errno::ENOENT));
    db.rename(Ino::ROOT, b"e", b, b"a", NONE, &NoReferences)
        .unwrap();
    assert_eq!(db.lookup(a, b"..").unwrap().ino, b);
    assert_eq!(db.getattr(b).unwrap().nlink, 3);
    assert_eq!(db.getattr(Ino::ROOT).unwrap().nlink, 3);
    db.assert_clean();
}

#[test]
fn rename_errnos() {
    let db = fresh();
    let a = db.dir(Ino::ROOT, "a");
    let sub = db.dir(a, "sub");
    let _deep = db.dir(sub, "deep");
    let full = db.dir(Ino::ROOT, "full");
    db.file(full, "x");
    let _f = db.file(Ino::ROOT, "f");
    let n = &NoReferences;
    let r = |p, s: &[u8], np, ns: &[u8], fl| db.rename(p, s, np, ns, fl, n);
    assert_eq!(
        r(Ino::ROOT, b"nope", Ino::ROOT, b"x", NONE),
        Err(Errno::ENOENT)
    );
    assert_eq!(
        r(Ino::ROOT, b"a", Ino::ROOT, b"full", NONE),
        Err(Errno::ENOTEMPTY)
    );
    assert_eq!(
        r(Ino::ROOT, b"a", Ino::ROOT, b"f", NONE),
        Err(Errno::ENOTDIR)
    );
    assert_eq!(
        r(Ino::ROOT, b"f", Ino::ROOT, b"a", NONE),
        Err(Errno::EISDIR)
    );
    assert_eq!(r(Ino::ROOT, b"a", sub, b"x", NONE), Err(Errno::EINVAL));
    assert_eq!(r(Ino::ROOT, b"a", a, b"x", NONE), Err(Errno::EINVAL));
    assert_eq!(
        r(Ino::ROOT, b"f", Ino::ROOT, b"a", NOREPLACE),
        Err(Errno::EEXIST)
    );
    assert_eq!(
        r(
            Ino::ROOT,
            b"f",
            Ino::ROOT,
            b"a",
            RenameFlags {
                noreplace: true,
                exchange: true
            }
        ),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        r(Ino::ROOT, b"f", Ino::ROOT, b"zzz", EXCHANGE),
        Err(Errno::ENOENT)
    );
    assert_eq!(r(Ino::ROOT, b"f", Ino(999), b"x", NONE), Err(Errno::ENOENT));
    let fino = db.lookup(Ino::ROOT, b"f").unwrap().ino;
    assert_eq!(r(Ino::ROOT, b"f", fino, b"x", NONE), Err(Errno::ENOTDIR));
    // ENOTDIR for either parent comes before ENOENT for the source.
    assert_eq!(r(Ino::ROOT, b"nope", fino, b"x", NONE), Err(Errno::ENOTDIR));
    assert_eq!(r(fino, b"nope", Ino::ROOT, b"x", NONE), Err(Errno::ENOTDIR));
    assert_eq!(r(Ino(999), b"f", Ino::ROOT, b"f", NONE), Err(Errno::ENOENT));
    assert_eq!(
        r(Ino::ROOT, b"f", Ino::ROOT, &[b'x'; 256], NONE),
        Err(Errno::ENAMETOOLONG)
    );
    // Exchange that would put a directory inside itself.
    assert_eq!(
        r(Ino::ROOT, b"a", sub, b"deep", EXCHANGE),
        Err(Errno::EINVAL)
    );
    // noreplace to a free name works.
    r(Ino::ROOT, b"f", Ino::ROOT, b"g", NOREPLACE).unwrap();
    db.assert_clean();
}

#[test]
fn rename_exchange_swaps_atomically() {
    let db = fresh();
    let a = db.dir(Ino::ROOT, "a");
    let b = db.dir(Ino::ROOT, "b");
    let d = db.dir(a, "d");
    let f = db.file(b, "f");
    db.rename(a, b"d", b, b"f", EXCHANGE, &NoReferences)
        .unwrap();
    assert_eq!(db.lookup(a, b"d").unwrap().ino, f);
    assert_eq!(db.lookup(b, b"f").unwrap().ino, d);
    assert_eq!(db.lookup(d, b"..").unwrap().ino, b);
    assert_eq!(db.getattr(a).unwrap().nlink, 2);
    assert_eq!(db.getattr(b).unwrap().nlink, 3);
    // Exchanging an entry with itself (hard link) is a no-op.
    db.link(f, a, b"f2").unwrap();
    db.rename(a, b"d", a, b"f2", EXCHANGE, &NoReferences)
        .unwrap();
    db.assert_clean();
}

#[test]
fn readdir_lists_dot_dotdot_and_entries_with_cookies() {
    let db = fresh();
    let d = db.dir(Ino::ROOT, "d");
    let x = db.file(d, "x");
    let y = db.dir(d, "y");
    let all = db.readdir(d, 0, 100).unwrap();
    let names: Vec<&[u8]> = all.iter().map(|e| e.name.as_slice()).collect();
    assert_eq!(names, [&b"."[..], b"..", b"x", b"y"]);
    assert_eq!(all[0].ino, d);
    assert_eq!(all[1].ino, Ino::ROOT);
    assert_eq!((all[2].ino, all[2].kind), (x, libc::S_IFREG));
    assert_eq!((all[3].ino, all[3].kind), (y, libc::S_IFDIR));
    for i in 0..all.len() {
        let rest = db.readdir(d, all[i].offset, 100).unwrap();
        assert_eq!(rest, all[i + 1..]);
    }
    let root = db.readdir(Ino::ROOT, 0, 2).unwrap();
    assert_eq!(root[1].ino, Ino::ROOT);
    assert_eq!(db.readdir(x, 0, 10), Err(Errno::ENOTDIR));
    let plus = db.readdirplus(d, 0, 100).unwrap();
    assert_eq!(plus.len(), 4);
    assert_eq!(plus[3].1, db.getattr(y).unwrap());
    assert_eq!(plus[0].1.nlink, 3);
}

#[test]
fn readdir_paging_survives_concurrent_changes() {
    let db = fresh();
    let d = db.dir(Ino::ROOT, "d");
    for i in 0..60 {
        db.file(d, &format!("f{i:02}"));
    }
    let mut seen: Vec<Vec<u8>> = Vec::new();
    let mut removed_unseen: Vec<Vec<u8>> = Vec::new();
    let mut cookie = 0;
    let mut round = 0;
    loop {
        let page = db.readdir(d, cookie, 7).unwrap();
        if page.is_empty() {
            break;
        }
        cookie = page.last().unwrap().offset;
        seen.extend(page.into_iter().map(|e| e.name));
        // Between pages: delete one already listed and one not yet listed, add one.
        round += 1;
        assert!(
            round < 200,
            "listing does not end: {:?}",
            &seen[seen.len().saturating_sub(20)..]
        );
        let listed = format!("f{:02}", round - 1).into_bytes();
        if seen.contains(&listed) {
            db.unlink(d, &listed, &NoReferences).unwrap();
        }
        let ahead = format!("f{:02}", 60 - round).into_bytes();
        if !seen.contains(&ahead) && db.unlink(d, &ahead, &NoReferences).is_ok() {
            removed_unseen.push(ahead);
        }
        if round <= 5 {
            db.file(d, &format!("new{round}"));
        }
    }
    let mut uniq = seen.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), seen.len(), "an entry was listed twice");
    assert!(!removed_unseen.is_empty());
    for i in 0..60 {
        let n = format!("f{i:02}").into_bytes();
        let shown = seen.contains(&n);
        if removed_unseen.contains(&n) {
            assert!(!shown, "entry removed before its page was listed");
        } else {
            assert!(shown, "survivor {} skipped", String::from_utf8_lossy(&n));
        }
    }
    // New entries are listed (they sort after every existing id).
    assert!(seen.iter().any(|n| n.starts_with(b"new")));
}

#[test]
fn readdirplus_pages_carry_each_entrys_current_attributes() {
    // A listing larger than one page, read with READDIRPLUS: the listing comes from the
    // cache, the attributes from the cache where they are (some entries were stat'ed, some
    // written since) and from the database for a page with any missing; every page must
    // agree with getattr and with the plain listing.
    let db = fresh();
    let d = db.dir(Ino::ROOT, "d");
    let mut files = Vec::new();
    for i in 0..300 {
        files.push(db.file(d, &format!("f{i:03}")));
    }
    db.dir(d, "sub");
    for (i, f) in files.iter().enumerate() {
        if i % 3 == 0 {
            db.write(*f, 0, &vec![7u8; 1 + i * 40]).unwrap();
        }
    }
    let plain = db.readdir(d, 0, 1000).unwrap();
    for (i, f) in files.iter().enumerate() {
        if i % 2 == 0 {
            db.getattr(*f).unwrap();
        }
    }
    let mut cookie = 0;
    let mut listed = Vec::new();
    loop {
        let page = db.readdirplus(d, cookie, 64).unwrap();
        let Some((last, _)) = page.last() else { break };
        cookie = last.offset;
        for (e, a) in page {
            assert_eq!(a.ino, e.ino);
            assert_eq!(
                a,
                db.getattr(e.ino).unwrap(),
                "{}",
                String::from_utf8_lossy(&e.name)
            );
            listed.push(e);
        }
    }
    assert_eq!(listed, plain);
    let big = db.getattr(files[297]).unwrap();
    assert_eq!(
        (big.size, big.blocks),
        (1 + 297 * 40, (1 + 297 * 40u64).div_ceil(512))
    );
    assert_eq!(db.getattr(files[1]).unwrap().blocks, 0);
}

#[test]
fn readdir_pages_large_directory() {
    let db = fresh();
    let d = db.dir(Ino::ROOT, "big");
    let n = 3000;
    for i in 0..n {
        db.file(d, &format!("entry{i}"));
    }
    let started = std::time::Instant::now();
    let mut cookie = 0;
    let mut count = 0;
    loop {
        let page = db.readdir(d, cookie, 50).unwrap();
        let Some(last) = page.last() else { break };
        cookie = last.offset;
        count += page.len();
    }
    assert_eq!(count, n + 2);
    assert!(started.elapsed().as_secs() < 10);
}

/// A file this store created is known to have no extended attribute (the kernel asks for
/// `security.capability` before its first write) until anything about it changes; the answer
/// from memory must match the database's, and a set attribute must be seen at once.
#[test]
fn a_new_files_missing_attributes_are_answered_until_it_changes() {
    let db = fresh();
    let f = db.file(Ino::ROOT, "f");
    assert_eq!(db.caches.bare(f), crate::knobs::get().cache);
    assert_eq!(db.getxattr(f, b"security.capability"), Err(Errno::ENODATA));
    assert_eq!(db.getxattr(f, &[b'n'; 256]), Err(Errno::ERANGE));
    assert_eq!(db.listxattr(f).unwrap(), b"");
    db.setxattr(f, b"security.capability", b"caps", 0).unwrap();
    assert!(!db.caches.bare(f));
    assert_eq!(db.getxattr(f, b"security.capability").unwrap(), b"caps");
    assert_eq!(db.listxattr(f).unwrap(), b"security.capability\0");
    let g = db.file(Ino::ROOT, "g");
    db.setattr(
        g,
        &SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        db.caches.bare(g),
        crate::knobs::get().cache,
        "a SETATTR adds no extended attribute: the mark stays"
    );
    assert_eq!(db.getxattr(g, b"security.capability"), Err(Errno::ENODATA));
    db.write(g, 0, b"data").unwrap();
    assert_eq!(
        db.caches.bare(g),
        crate::knobs::get().cache,
        "nor does a write: the mark stays"
    );
    db.setxattr(g, b"user.a", b"1", 0).unwrap();
    db.setattr(
        g,
        &SetAttr {
            mode: Some(0o644),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        !db.caches.bare(g),
        "a set attribute drops the mark for good"
    );
    assert_eq!(db.getxattr(g, b"user.a").unwrap(), b"1");
    let h = db.file(Ino::ROOT, "h");
    db.unlink(Ino::ROOT, b"h", &NoReferences).unwrap();
    assert!(!db.caches.bare(h));
    assert_eq!(db.getxattr(h, b"user.a"), Err(Errno::ENOENT));
    // A clear between a create's start and its mark (its batch lost, another process's
    // change) takes the mark back.
    let k = db.file(Ino::ROOT, "k");
    db.caches.inode_changed(k);
    let before = db.caches.clears();
    db.caches.clear();
    db.caches.put_bare(k, before);
    assert!(!db.caches.bare(k));
}

#[test]
fn xattrs() {
    let db = fresh();
    let f = db.file(Ino::ROOT, "f");
    assert_eq!(db.getxattr(f, b"user.a"), Err(Errno::ENODATA));
    db.setxattr(f, b"user.b", b"2", 0).unwrap();
    db.setxattr(f, b"user.a", b"1", libc::XATTR_CREATE as u32)
        .unwrap();
    assert_eq!(
        db.setxattr(f, b"user.a", b"x", libc::XATTR_CREATE as u32),
        Err(Errno::EEXIST)
    );
    assert_eq!(
        db.setxattr(f, b"user.c", b"x", libc::XATTR_REPLACE as u32),
        Err(Errno::ENODATA)
    );
    db.setxattr(f, b"user.a", b"one", libc::XATTR_REPLACE as u32)
        .unwrap();
    assert_eq!(db.getxattr(f, b"user.a").unwrap(), b"one");
    assert_eq!(db.listxattr(f).unwrap(), b"user.a\0user.b\0");
    db.setxattr(f, b"user.empty", b"", 0).unwrap();
    assert_eq!(db.getxattr(f, b"user.empty").unwrap(), b"");
    assert_eq!(db.setxattr(f, &[b'n'; 256], b"", 0), Err(Errno::ERANGE));
    assert_eq!(
        db.setxattr(f, b"user.big", &vec![0; 65537], 0),
        Err(Errno::E2BIG)
    );
    db.setxattr(f, b"user.max", &vec![7; 65536], 0).unwrap();
    db.removexattr(f, b"user.a").unwrap();
    assert_eq!(db.removexattr(f, b"user.a"), Err(Errno::ENODATA));
    assert_eq!(db.listxattr(f).unwrap(), b"user.b\0user.empty\0user.max\0");
    assert_eq!(db.getxattr(Ino(999), b"user.a"), Err(Errno::ENOENT));
    db.setxattr(Ino::ROOT, b"trusted.x", b"\0\xff", 0).unwrap();
    assert_eq!(db.getxattr(Ino::ROOT, b"trusted.x").unwrap(), b"\0\xff");
    db.unlink(Ino::ROOT, b"f", &NoReferences).unwrap();
    assert_eq!(db.q("SELECT count(*) FROM fs_xattr"), 1);
    db.assert_clean();
}

#[test]
fn resolve_paths() {
    let db = fresh();
    let a = db.dir(Ino::ROOT, "a");
    let b = db.dir(a, "b");
    let f = db.file(b, "f");
    db.symlink(a, b"l", b"b", ME).unwrap();
    assert_eq!(db.resolve(b"/").unwrap(), Ino::ROOT);
    assert_eq!(db.resolve(b"/a/b/f").unwrap(), f);
    assert_eq!(db.resolve(b"//a/./b/../b/f").unwrap(), f);
    assert_eq!(db.resolve(b"/a/b/").unwrap(), b);
    assert_eq!(db.resolve(b"/a/l/f"), Err(Errno::ENOTDIR));
    assert_eq!(db.resolve(b"/a/nope"), Err(Errno::ENOENT));
    assert_eq!(db.resolve(b"a/b"), Err(Errno::EINVAL));
    assert_eq!(db.resolve(b"/a/b/f/x"), Err(Errno::ENOTDIR));
}

#[test]
fn failed_operations_leave_no_trace() {
    let db = fresh();
    let n_inodes = db.q("SELECT count(*) FROM fs_inode");
    assert_eq!(db.mkdir(Ino::ROOT, b"a/b", 0o755, ME), Err(Errno::EINVAL));
    assert_eq!(db.symlink(Ino::ROOT, b"s", b"", ME), Err(Errno::ENOENT));
    assert_eq!(db.q("SELECT count(*) FROM fs_inode"), n_inodes);
    db.assert_clean();
}

#[test]
fn a_failing_statement_rolls_back_the_whole_operation() {
    let db = fresh();
    let f = db.file(Ino::ROOT, "f");
    let data = pattern(100_000, 1);
    db.write(f, 0, &data).unwrap();
    // Make the final size update of a write fail after its chunk rows were written.
    db.raw()
        .execute_batch(
            "CREATE TRIGGER boom BEFORE UPDATE OF size ON fs_inode
             BEGIN SELECT RAISE(ABORT, 'injected'); END;",
        )
        .unwrap();
    assert!(db.write(f, 0, &vec![9u8; 200_000]).is_err());
    assert!(db
        .setattr(
            f,
            &SetAttr {
                size: Some(5),
                ..Default::default()
            }
        )
        .is_err());
    db.raw().execute_batch("DROP TRIGGER boom").unwrap();
    assert_eq!(db.all(f), data);
    assert_eq!(db.rows(f), 2);
    // Same for a rename over a target whose deletion fails.
    let g = db.file(Ino::ROOT, "g");
    db.raw()
        .execute_batch(
            "CREATE TRIGGER boom2 BEFORE DELETE ON fs_inode
             BEGIN SELECT RAISE(ABORT, 'injected'); END;",
        )
        .unwrap();
    assert!(db
        .rename(Ino::ROOT, b"f", Ino::ROOT, b"g", NONE, &NoReferences)
        .is_err());
    db.raw().execute_batch("DROP TRIGGER boom2").unwrap();
    assert_eq!(db.lookup(Ino::ROOT, b"f").unwrap().ino, f);
    assert_eq!(db.lookup(Ino::ROOT, b"g").unwrap().ino, g);
    db.assert_clean();
}

/// A create answers with attributes it does not read back; they must be the row's.
#[test]
fn a_creates_answer_is_the_row_it_stored() {
    let db = fresh();
    let d = db.mkdir(Ino::ROOT, b"d", 0o2775, ME).unwrap();
    let grp = SetAttr {
        gid: Some(4242),
        ..Default::default()
    };
    assert_eq!(
        db.setattr(d.ino, &grp).unwrap().mode & libc::S_ISGID,
        libc::S_ISGID
    );
    let made = [
        db.mknod(Ino::ROOT, b"top", 0o644, 0, ME).unwrap(),
        db.mknod(d.ino, b"f", 0o640, 0, ME).unwrap(),
        db.mknod(d.ino, b"fifo", libc::S_IFIFO | 0o600, 0, ME)
            .unwrap(),
        db.mknod(d.ino, b"chr", libc::S_IFCHR | 0o600, 0x0103, ME)
            .unwrap(),
        db.mkdir(d.ino, b"sub", 0o700, ME).unwrap(),
        db.symlink(d.ino, b"l", b"../target", ME).unwrap(),
        db.tmpfile(d.ino, 0o600, ME).unwrap(),
    ];
    let other = db.raw();
    let cfg = db.config();
    for a in made {
        let stored = inode::attr_of(&other, &cfg, a.ino).unwrap();
        assert_eq!(a, stored, "inode {}", a.ino.0);
    }
    // The setgid directory passes its group on (and its bit to a subdirectory).
    assert_eq!(made[0].gid, ME.gid);
    assert!(made[1..].iter().all(|a| a.gid == 4242));
    assert_eq!(made[4].mode & libc::S_ISGID, libc::S_ISGID);
}

/// A SETATTR answers the attributes it computed (one UPDATE, no read back unless the size
/// changed); they must be the row's, whatever mix of fields it set.
#[test]
fn a_setattrs_answer_is_the_row_it_stored() {
    let db = fresh();
    let f = db.file(Ino::ROOT, "f");
    let d = db.dir(Ino::ROOT, "d");
    let at = |sec| Some(TimeSet::At(Timespec { sec, nsec: 7 }));
    let sets = [
        (
            f,
            SetAttr {
                mode: Some(0o4751),
                ..Default::default()
            },
        ),
        (
            f,
            SetAttr {
                uid: Some(5),
                gid: Some(6),
                ..Default::default()
            },
        ),
        (
            f,
            SetAttr {
                atime: at(100),
                mtime: at(200),
                ..Default::default()
            },
        ),
        (
            f,
            SetAttr {
                mtime: Some(TimeSet::Now),
                ctime: Some(Timespec { sec: 300, nsec: 1 }),
                ..Default::default()
            },
        ),
        (
            f,
            SetAttr {
                size: Some(70_000),
                ..Default::default()
            },
        ),
        (
            f,
            SetAttr {
                size: Some(10),
                mtime: at(400),
                ..Default::default()
            },
        ),
        (
            d,
            SetAttr {
                mode: Some(0o700),
                gid: Some(9),
                ..Default::default()
            },
        ),
        (d, SetAttr::default()),
    ];
    for (ino, set) in sets {
        let a = db.setattr(ino, &set).unwrap();
        let stored = inode::attr_of(&db.raw(), &db.config(), ino).unwrap();
        assert_eq!(a, stored, "{set:?}");
    }
    let a = db.getattr(f).unwrap();
    assert_eq!(
        (a.size, a.mtime.sec, a.uid, a.mode & 0o7777),
        (10, 400, 5, 0o4751)
    );
}
