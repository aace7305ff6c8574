//! One injected violation per rule, each expecting exactly that finding.

use super::*;

fn expect_only(db: &Db, rule: &str) {
    let f = db.check().unwrap();
    assert!(!f.is_empty(), "no finding for {rule}");
    assert!(
        f.iter().all(|x| x.rule == rule),
        "expected only {rule}: {f:#?}"
    );
}

/// A populated database: dir d with file f (chunked), inline file i, symlink l, xattr.
fn populated() -> (Db, Ino, Ino, Ino, Ino) {
    let db = fresh_with(4096, 1024);
    let d = db.dir(Ino::ROOT, "d");
    let f = db.file(d, "f");
    db.write(f, 0, &pattern(10_000, 1)).unwrap();
    let i = db.file(Ino::ROOT, "i");
    db.write(i, 0, b"inline").unwrap();
    let l = db.symlink(Ino::ROOT, b"l", b"d/f", ME).unwrap().ino;
    db.setxattr(f, b"user.x", b"1", 0).unwrap();
    db.raw()
        .execute_batch("INSERT INTO fs_whiteout VALUES ('/a/b', '/a', 0), ('/top', '/', 0)")
        .unwrap();
    db.assert_clean();
    (db, d, f, i, l)
}

fn inject(db: &Db, sql: &str) {
    db.raw().execute_batch(sql).unwrap();
}

#[test]
fn root_rule() {
    let (db, ..) = populated();
    inject(&db, "UPDATE fs_inode SET mode = 33188 WHERE ino = 1");
    let f = db.check().unwrap();
    // A non-directory root also makes every top-level entry's parent invalid.
    assert!(f.iter().any(|x| x.rule == "root"));
    assert!(
        f.iter()
            .all(|x| x.rule == "root" || x.rule == "dentry_parent"),
        "{f:#?}"
    );
}

#[test]
fn dentry_inode_rule() {
    let (db, ..) = populated();
    inject(
        &db,
        "INSERT INTO fs_dentry (name, parent_ino, ino) VALUES ('ghost', 1, 9999)",
    );
    expect_only(&db, "dentry_inode");
}

#[test]
fn dentry_parent_rule() {
    let (db, _, f, ..) = populated();
    inject(
        &db,
        &format!("UPDATE fs_dentry SET parent_ino = {} WHERE name = 'i'", f.0),
    );
    expect_only(&db, "dentry_parent");
}

#[test]
fn duplicate_name_rule() {
    let (db, _, _, i, _) = populated();
    // Same bytes, other storage class: SQLite's UNIQUE cannot see it.
    inject(
        &db,
        &format!(
            "INSERT INTO fs_dentry (name, parent_ino, ino) VALUES (x'69', 1, {0});
         UPDATE fs_inode SET nlink = 2 WHERE ino = {0}",
            i.0
        ),
    );
    expect_only(&db, "duplicate_name");
}

#[test]
fn nlink_rule() {
    let (db, _, f, ..) = populated();
    inject(
        &db,
        &format!("UPDATE fs_inode SET nlink = 3 WHERE ino = {}", f.0),
    );
    expect_only(&db, "nlink");
    inject(
        &db,
        &format!("UPDATE fs_inode SET nlink = 1 WHERE ino = {}", f.0),
    );
    inject(&db, "UPDATE fs_inode SET nlink = 2 WHERE ino = 1");
    expect_only(&db, "nlink");
}

#[test]
fn orphan_rule() {
    let (db, ..) = populated();
    db.unlink(Ino::ROOT, b"i", &Keep).unwrap();
    expect_only(&db, "orphan");
}

#[test]
fn dir_links_rule() {
    let (db, d, ..) = populated();
    inject(
        &db,
        &format!(
            "INSERT INTO fs_dentry (name, parent_ino, ino) VALUES ('d2', 1, {0});
         UPDATE fs_inode SET nlink = 2 WHERE ino = {0}",
            d.0
        ),
    );
    expect_only(&db, "dir_links");
}

#[test]
fn mode_rule() {
    let (db, _, _, i, _) = populated();
    // Type bits 0o070000 are no file type. Keep storage rules happy: it is not regular
    // any more, so drop its inline layout too... which the inline rule would flag; use a fifo.
    let p = db
        .mknod(Ino::ROOT, b"p", libc::S_IFIFO | 0o600, 0, ME)
        .unwrap()
        .ino;
    let _ = i;
    inject(
        &db,
        &format!(
            "UPDATE fs_inode SET mode = {} WHERE ino = {}",
            0o070644, p.0
        ),
    );
    expect_only(&db, "mode");
}

#[test]
fn inline_rule() {
    let (db, _, _, i, _) = populated();
    inject(
        &db,
        &format!("UPDATE fs_inode SET size = 99 WHERE ino = {}", i.0),
    );
    expect_only(&db, "inline");
    inject(
        &db,
        &format!(
            "UPDATE fs_inode SET size = 6 WHERE ino = {0};
         INSERT INTO fs_data VALUES ({0}, 0, x'00')",
            i.0
        ),
    );
    expect_only(&db, "inline");
}

#[test]
fn chunked_rule() {
    let (db, _, f, ..) = populated();
    inject(
        &db,
        &format!(
            "UPDATE fs_inode SET data_inline = x'00' WHERE ino = {}",
            f.0
        ),
    );
    expect_only(&db, "chunked");
}

#[test]
fn storage_kind_rule() {
    let (db, _, f, ..) = populated();
    inject(
        &db,
        &format!("UPDATE fs_inode SET storage_kind = 7 WHERE ino = {}", f.0),
    );
    expect_only(&db, "storage_kind");
}

#[test]
fn nonfile_data_rule() {
    let (db, d, ..) = populated();
    inject(
        &db,
        &format!("INSERT INTO fs_data VALUES ({}, 0, x'00')", d.0),
    );
    let f = db.check().unwrap();
    // A directory's size is 0, so the row is also past EOF.
    assert!(f.iter().any(|x| x.rule == "nonfile_data"));
    assert!(
        f.iter()
            .all(|x| x.rule == "nonfile_data" || x.rule == "chunk_past_eof"),
        "{f:#?}"
    );
}

#[test]
fn data_inode_rule() {
    let (db, ..) = populated();
    inject(&db, "INSERT INTO fs_data VALUES (4242, 0, x'00')");
    expect_only(&db, "data_inode");
}

#[test]
fn chunk_past_eof_rule() {
    let (db, _, f, ..) = populated();
    inject(
        &db,
        &format!("INSERT INTO fs_data VALUES ({}, 5, x'00')", f.0),
    );
    expect_only(&db, "chunk_past_eof");
}

#[test]
fn chunk_too_long_rule() {
    let (db, _, f, ..) = populated();
    inject(
        &db,
        &format!(
            "UPDATE fs_data SET data = zeroblob(4097) WHERE ino = {} AND chunk_index = 0",
            f.0
        ),
    );
    expect_only(&db, "chunk_too_long");
}

#[test]
fn symlink_rules() {
    let (db, _, _, i, l) = populated();
    inject(&db, &format!("DELETE FROM fs_symlink WHERE ino = {}", l.0));
    expect_only(&db, "symlink_target");
    inject(
        &db,
        &format!(
            "INSERT INTO fs_symlink VALUES ({}, 'x'), ({}, 'y')",
            l.0, i.0
        ),
    );
    expect_only(&db, "symlink_row");
}

#[test]
fn config_rule() {
    let (db, ..) = populated();
    inject(&db, "DELETE FROM fs_config WHERE key = 'inline_threshold'");
    expect_only(&db, "config");
}

#[test]
fn whiteout_parent_rule() {
    let (db, ..) = populated();
    assert_eq!(crate::store::check::whiteout_parent("/"), "/");
    assert_eq!(crate::store::check::whiteout_parent("/a"), "/");
    assert_eq!(crate::store::check::whiteout_parent("/a/b/c"), "/a/b");
    inject(&db, "INSERT INTO fs_whiteout VALUES ('/x/y', '/', 0)");
    expect_only(&db, "whiteout_parent");
}

#[test]
fn xattr_inode_rule() {
    let (db, ..) = populated();
    inject(&db, "INSERT INTO fs_xattr VALUES (777, x'61', x'62')");
    expect_only(&db, "xattr_inode");
}

#[test]
fn dir_stats_rule() {
    let (db, d, ..) = populated();
    inject(
        &db,
        &format!("INSERT OR REPLACE INTO fs_dir_stats VALUES ({}, 7)", d.0),
    );
    expect_only(&db, "dir_stats");
}

#[test]
fn dir_stats_follow_every_namespace_change() {
    let db = fresh();
    let a = db.dir(Ino::ROOT, "a");
    let b = db.dir(Ino::ROOT, "b");
    let c = db.dir(a, "c");
    db.file(a, "f");
    assert_eq!(db.getattr(Ino::ROOT).unwrap().nlink, 4);
    assert_eq!(db.getattr(a).unwrap().nlink, 3);
    db.rename(a, b"c", b, b"c2", RenameFlags::default(), &NoReferences)
        .unwrap();
    assert_eq!(db.getattr(a).unwrap().nlink, 2);
    assert_eq!(db.getattr(b).unwrap().nlink, 3);
    let exchange = RenameFlags {
        exchange: true,
        ..Default::default()
    };
    db.rename(b, b"c2", a, b"f", exchange, &NoReferences)
        .unwrap();
    assert_eq!(
        db.getattr(a).unwrap().nlink,
        3,
        "the directory moved into a"
    );
    assert_eq!(db.getattr(b).unwrap().nlink, 2, "a file moved into b");
    db.rmdir(a, b"f", &NoReferences).unwrap();
    assert_eq!(db.getattr(a).unwrap().nlink, 2);
    db.assert_clean();
    let _ = c;
}
