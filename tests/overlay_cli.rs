//! The overlay command line: `init --base`, `diff` and `apply` on delta databases built row by
//! row the way the overlay data model describes them.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use agentfs::store::overlay::{self, PartialOriginPolicy};
use agentfs::store::Store;
use common::{agentfs, scratch_root};

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(scratch_root()).unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn one_line_error(out: &std::process::Output, needle: &str) {
    assert!(!out.status.success(), "expected failure");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    assert!(err.contains(needle), "{err:?} should mention {needle:?}");
}

#[test]
fn init_base_records_the_canonical_base_and_policy() {
    let d = scratch();
    let base = d.path().join("base");
    fs::create_dir_all(base.join("sub")).unwrap();
    let db = d.path().join("db.sqlite");
    // A non-canonical spelling is stored canonical.
    let spelled = base.join("sub").join("..");
    let out = agentfs(&[
        "init",
        s(&db),
        "--base",
        s(&spelled),
        "--partial-origin",
        "auto",
        "--partial-origin-threshold-bytes",
        "1000",
    ]);
    assert!(out.status.success(), "{out:?}");
    let store = Store::open(&db, true).unwrap();
    let cfg = store.overlay_config().unwrap().expect("overlay config");
    assert_eq!(cfg.base_path, fs::canonicalize(&base).unwrap());
    assert_eq!(cfg.partial_origin, PartialOriginPolicy::Auto);
    assert_eq!(cfg.partial_origin_threshold_bytes, 1000);
    assert!(!cfg.partial_origin_for(999) && cfg.partial_origin_for(1000));

    // Defaults: partial origin off, 8 MiB threshold; an ordinary database has no config.
    let db2 = d.path().join("db2.sqlite");
    assert!(agentfs(&["init", s(&db2), "--base", s(&base)])
        .status
        .success());
    let cfg = Store::open(&db2, true)
        .unwrap()
        .overlay_config()
        .unwrap()
        .unwrap();
    assert_eq!(cfg.partial_origin, PartialOriginPolicy::Off);
    assert_eq!(
        cfg.partial_origin_threshold_bytes,
        overlay::DEFAULT_PARTIAL_ORIGIN_THRESHOLD
    );
    let plain = d.path().join("plain.sqlite");
    assert!(agentfs(&["init", s(&plain)]).status.success());
    assert_eq!(
        Store::open(&plain, true).unwrap().overlay_config().unwrap(),
        None
    );

    // integrity shows the base.
    let out = agentfs(&["integrity", s(&db2)]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("base {}", cfg.base_path.display()))
    );
}

#[test]
fn init_base_refuses_bad_bases_and_leaves_nothing() {
    let d = scratch();
    let base = d.path().join("base");
    fs::create_dir(&base).unwrap();
    let file = d.path().join("file");
    fs::write(&file, b"x").unwrap();
    let cases: Vec<(PathBuf, PathBuf, &str)> = vec![
        (
            d.path().join("a.sqlite"),
            d.path().join("missing"),
            "missing",
        ),
        (d.path().join("b.sqlite"), file.clone(), "not a directory"),
        (base.join("c.sqlite"), base.clone(), "inside the base"),
        (
            base.join("c.sqlite"),
            d.path().to_path_buf(),
            "inside the base",
        ),
    ];
    for (db, b, needle) in cases {
        one_line_error(&agentfs(&["init", s(&db), "--base", s(&b)]), needle);
        assert!(!db.exists(), "{} left behind", db.display());
    }
    let db = d.path().join("e.sqlite");
    let out = agentfs(&[
        "init",
        s(&db),
        "--base",
        s(&base),
        "--partial-origin",
        "sometimes",
    ]);
    assert!(!out.status.success());
    assert!(!db.exists());
    assert_eq!(fs::read_dir(&base).unwrap().count(), 0);
}

// ---------------------------------------------------------------------------------------------
// A delta built row by row
// ---------------------------------------------------------------------------------------------

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Stdio};

use agentfs::store::{Caller, Ino, SetAttr};

const CHUNK: u64 = 4096;
const ROOT: Caller = Caller { uid: 0, gid: 0 };

fn big_base() -> Vec<u8> {
    (0..10_000u32).map(|i| (i % 251) as u8).collect()
}

fn lines(n: usize, changed: Option<usize>) -> String {
    (1..=n)
        .map(|i| {
            if Some(i) == changed {
                format!("line {i} changed\n")
            } else {
                format!("line {i}\n")
            }
        })
        .collect()
}

/// The base tree every round-trip test starts from.
fn make_base(base: &Path) {
    let w = |p: &str, data: &[u8], mode: u32| {
        let f = base.join(p);
        fs::create_dir_all(f.parent().unwrap()).unwrap();
        fs::write(&f, data).unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(mode)).unwrap();
    };
    fs::create_dir_all(base).unwrap();
    w("keep.txt", b"unchanged\n", 0o644);
    w("edit.txt", lines(20, None).as_bytes(), 0o644);
    w("chmod.sh", b"#!/bin/sh\necho hi\n", 0o644);
    w("revert.txt", b"same\n", 0o644);
    w("gone.txt", b"bye\n", 0o644);
    w("olddir/a.txt", b"a\n", 0o644);
    w("olddir/sub/b.txt", b"b\n", 0o644);
    w("opaque/x.txt", b"x\n", 0o644);
    w("opaque/y.txt", b"y\n", 0o644);
    w("src/main.c", b"int main(void) { return 0; }\n", 0o644);
    w("src/old.c", b"old\n", 0o644);
    w("deep/a/b/f.txt", b"deep\n", 0o644);
    w("deep/a/b/g.txt", b"stays\n", 0o644);
    w("typechg", b"was a file\n", 0o644);
    w("bin.dat", b"\0\x01\x02binary\0", 0o644);
    w("big.bin", &big_base(), 0o644);
    std::os::unix::fs::symlink("keep.txt", base.join("link")).unwrap();
}

/// Writes delta rows the way the overlay model describes them.
struct DeltaBuilder {
    store: Store,
    conn: rusqlite::Connection,
    base: PathBuf,
}

impl DeltaBuilder {
    fn new(db: &Path, base: &Path) -> Self {
        let out = agentfs(&["init", s(db), "--base", s(base), "--chunk-size", "4096"]);
        assert!(out.status.success(), "{out:?}");
        // Rows made by hand, not by a mount: a delta without records of the base objects it
        // saw, as deltas older than those records are (apply then cannot detect base changes).
        rusqlite::Connection::open(db)
            .unwrap()
            .execute_batch("DROP TABLE fs_base_seen")
            .unwrap();
        DeltaBuilder {
            store: Store::open_with(db, false, None, None, agentfs::cache::CacheConfig::OFF)
                .unwrap(),
            conn: rusqlite::Connection::open(db).unwrap(),
            base: base.to_path_buf(),
        }
    }

    fn origin(&self, ino: Ino, rel: &str) {
        let base_ino = fs::symlink_metadata(self.base.join(rel)).unwrap().ino();
        self.conn
            .execute(
                "INSERT INTO fs_origin (delta_ino, base_ino) VALUES (?1, ?2)",
                (ino.0 as i64, base_ino as i64),
            )
            .unwrap();
    }

    fn whiteout(&self, path: &str) {
        let parent = match path.rfind('/') {
            Some(0) => "/".to_string(),
            Some(i) => path[..i].to_string(),
            None => unreachable!(),
        };
        self.conn
            .execute(
                "INSERT INTO fs_whiteout (path, parent_path, created_at) VALUES (?1, ?2, 0)",
                (path, parent),
            )
            .unwrap();
    }

    fn dir(&self, parent: Ino, name: &str, mode: u32, origin: Option<&str>) -> Ino {
        let ino = self
            .store
            .mkdir(parent, name.as_bytes(), mode, ROOT)
            .unwrap()
            .ino;
        if let Some(o) = origin {
            self.origin(ino, o);
        }
        ino
    }

    fn file(&self, parent: Ino, name: &str, data: &[u8], mode: u32, origin: Option<&str>) -> Ino {
        let ino = self
            .store
            .mknod(parent, name.as_bytes(), libc::S_IFREG | mode, 0, ROOT)
            .unwrap()
            .ino;
        self.store.write(ino, 0, data).unwrap();
        if let Some(o) = origin {
            self.origin(ino, o);
        }
        ino
    }

    fn symlink(&self, parent: Ino, name: &str, target: &str, origin: Option<&str>) -> Ino {
        let ino = self
            .store
            .symlink(parent, name.as_bytes(), target.as_bytes(), ROOT)
            .unwrap()
            .ino;
        if let Some(o) = origin {
            self.origin(ino, o);
        }
        ino
    }

    /// A partial-origin copy-up of base file `rel` whose chunk `k` is overridden by `data`.
    fn partial(&self, parent: Ino, name: &str, rel: &str, k: u64, data: &[u8]) {
        let base_file = self.base.join(rel);
        let md = fs::metadata(&base_file).unwrap();
        let ino = self
            .store
            .mknod(parent, name.as_bytes(), libc::S_IFREG | 0o644, 0, ROOT)
            .unwrap()
            .ino;
        let set = SetAttr {
            size: Some(md.len()),
            ..SetAttr::default()
        };
        self.store.setattr(ino, &set).unwrap();
        self.store.write(ino, k * CHUNK, data).unwrap();
        self.origin(ino, rel);
        self.conn
            .execute(
                "INSERT INTO fs_chunk_override (delta_ino, chunk_index) VALUES (?1, ?2)",
                (ino.0 as i64, k as i64),
            )
            .unwrap();
        self.conn
            .execute(
                "INSERT INTO fs_partial_origin (delta_ino, base_ino, base_path, base_size,
                   base_fingerprint_size, base_mtime, base_mtime_nsec, base_ctime, base_ctime_nsec,
                   created_at)
                 VALUES (?1, ?2, ?3, ?4, ?4, ?5, ?6, ?7, ?8, 0)",
                rusqlite::params![
                    ino.0 as i64,
                    md.ino() as i64,
                    fs::canonicalize(&base_file).unwrap().to_str().unwrap(),
                    md.len() as i64,
                    md.mtime(),
                    md.mtime_nsec(),
                    md.ctime(),
                    md.ctime_nsec()
                ],
            )
            .unwrap();
    }
}

/// The delta of the round-trip tests (see `expected_changes` for what it means).
fn make_delta(db: &Path, base: &Path) {
    let b = DeltaBuilder::new(db, base);
    let r = Ino::ROOT;
    b.file(
        r,
        "edit.txt",
        lines(20, Some(10)).as_bytes(),
        0o644,
        Some("edit.txt"),
    );
    b.file(
        r,
        "chmod.sh",
        b"#!/bin/sh\necho hi\n",
        0o755,
        Some("chmod.sh"),
    );
    b.file(r, "revert.txt", b"same\n", 0o644, Some("revert.txt"));
    b.whiteout("/gone.txt");
    b.whiteout("/olddir");
    let op = b.dir(r, "opaque", 0o755, None);
    b.file(op, "y.txt", b"y\n", 0o644, None);
    b.file(op, "z.txt", b"z\n", 0o644, None);
    let src = b.dir(r, "src", 0o755, Some("src"));
    b.file(src, "new.c", b"/* new */\n", 0o644, None);
    b.whiteout("/src/old.c");
    b.whiteout("/deep/a/b/f.txt");
    b.symlink(r, "link", "edit.txt", Some("link"));
    let tc = b.dir(r, "typechg", 0o755, None);
    b.file(tc, "inner.txt", b"inner\n", 0o644, None);
    b.file(
        r,
        "bin.dat",
        b"\0\x01\x02BINARY\0\xff",
        0o644,
        Some("bin.dat"),
    );
    let mut chunk1 = vec![0xabu8; CHUNK as usize];
    chunk1[..5].copy_from_slice(b"hello");
    b.partial(r, "big.bin", "big.bin", 1, &chunk1);
    let nd = b.dir(r, "newdir", 0o755, None);
    b.file(nd, "file.txt", b"in new dir\n", 0o644, None);
    b.file(r, "new.txt", b"no newline at end", 0o644, None);
    b.symlink(r, "newlink", "new.txt", None);
    b.file(r, "name with space.txt", b"spaced\n", 0o644, None);
}

fn expected_changes() -> Vec<&'static str> {
    vec![
        "M /big.bin",
        "M /bin.dat",
        "M /chmod.sh",
        "D /deep/a/b/f.txt",
        "M /edit.txt",
        "D /gone.txt",
        "M /link",
        "A /name with space.txt",
        "A /new.txt",
        "A /newdir",
        "A /newdir/file.txt",
        "A /newlink",
        "D /olddir",
        "D /olddir/a.txt",
        "D /olddir/sub",
        "D /olddir/sub/b.txt",
        "D /opaque/x.txt",
        "A /opaque/z.txt",
        "A /src/new.c",
        "D /src/old.c",
        "D /typechg",
        "A /typechg",
        "A /typechg/inner.txt",
    ]
}

/// Kind, permission bits and content (a symlink's target) of every object under `root`.
type Tree = BTreeMap<String, (char, u32, Vec<u8>)>;

fn tree(root: &Path) -> Tree {
    fn walk(root: &Path, dir: &Path, out: &mut Tree) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_str().unwrap().to_string();
            let md = fs::symlink_metadata(&p).unwrap();
            let perm = md.mode() & 0o7777;
            if md.file_type().is_symlink() {
                let t = fs::read_link(&p).unwrap();
                out.insert(rel, ('l', 0, t.to_str().unwrap().as_bytes().to_vec()));
            } else if md.is_dir() {
                out.insert(rel, ('d', perm, Vec::new()));
                walk(root, &p, out);
            } else {
                out.insert(rel, ('f', perm, fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Tree::new();
    walk(root, root, &mut out);
    out
}

fn expected_tree(base: &Path) -> Tree {
    let mut t = tree(base);
    let f = |d: &[u8]| ('f', 0o644, d.to_vec());
    for gone in [
        "gone.txt",
        "olddir",
        "olddir/a.txt",
        "olddir/sub",
        "olddir/sub/b.txt",
        "opaque/x.txt",
        "src/old.c",
        "deep/a/b/f.txt",
        "typechg",
    ] {
        assert!(t.remove(gone).is_some(), "{gone} in base");
    }
    t.insert("edit.txt".into(), f(lines(20, Some(10)).as_bytes()));
    t.insert(
        "chmod.sh".into(),
        ('f', 0o755, b"#!/bin/sh\necho hi\n".to_vec()),
    );
    t.insert("opaque/z.txt".into(), f(b"z\n"));
    t.insert("src/new.c".into(), f(b"/* new */\n"));
    t.insert("link".into(), ('l', 0, b"edit.txt".to_vec()));
    t.insert("typechg".into(), ('d', 0o755, Vec::new()));
    t.insert("typechg/inner.txt".into(), f(b"inner\n"));
    t.insert("bin.dat".into(), f(b"\0\x01\x02BINARY\0\xff"));
    let mut big = big_base();
    big[CHUNK as usize..2 * CHUNK as usize].fill(0xab);
    big[CHUNK as usize..CHUNK as usize + 5].copy_from_slice(b"hello");
    t.insert("big.bin".into(), f(&big));
    t.insert("newdir".into(), ('d', 0o755, Vec::new()));
    t.insert("newdir/file.txt".into(), f(b"in new dir\n"));
    t.insert("new.txt".into(), f(b"no newline at end"));
    t.insert("newlink".into(), ('l', 0, b"new.txt".to_vec()));
    t.insert("name with space.txt".into(), f(b"spaced\n"));
    t
}

fn copy_tree(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success());
}

/// A copy of `db` whose base is `base` (apply writes the base recorded in the database).
fn db_for(db: &Path, base: &Path, name: &str) -> PathBuf {
    let copy = db.with_file_name(name);
    let st = Command::new("sqlite3")
        .arg(db)
        .arg(format!(".backup {}", s(&copy)))
        .status();
    match st {
        Ok(s) if s.success() => {}
        _ => {
            let out = agentfs(&["backup", s(db), s(&copy), "--materialize"]);
            assert!(out.status.success(), "{out:?}");
        }
    }
    let c = rusqlite::Connection::open(&copy).unwrap();
    c.execute(
        "UPDATE fs_overlay_config SET value = ?1 WHERE key = 'base_path'",
        [fs::canonicalize(base).unwrap().to_str().unwrap()],
    )
    .unwrap();
    copy
}

fn stdout(out: &std::process::Output) -> String {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn git_apply(dir: &Path, patch: &[u8]) {
    let mut child = Command::new("git")
        .args(["apply", "--whitespace=nowarn", "-"])
        .current_dir(dir)
        .env("GIT_CEILING_DIRECTORIES", dir.parent().unwrap())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("git");
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(patch).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "git apply: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(patch)
    );
}

#[test]
fn diff_lists_exactly_the_changes_in_all_forms() {
    let d = scratch();
    let base = d.path().join("base");
    make_base(&base);
    let db = d.path().join("delta.sqlite");
    make_delta(&db, &base);
    let before = tree(&base);

    let text = stdout(&agentfs(&["diff", s(&db)]));
    let got: Vec<&str> = text.lines().collect();
    assert_eq!(got, expected_changes());

    let names = stdout(&agentfs(&["diff", s(&db), "--name-only"]));
    let mut want: Vec<&str> = expected_changes().iter().map(|l| &l[2..]).collect();
    want.dedup();
    assert_eq!(names.lines().collect::<Vec<_>>(), want);

    let json: serde_json::Value =
        serde_json::from_str(&stdout(&agentfs(&["diff", s(&db), "--json"]))).unwrap();
    let arr = json.as_array().unwrap();
    // The type change at /typechg is one object.
    assert_eq!(arr.len(), expected_changes().len() - 1);
    let find = |p: &str, c: &str| {
        arr.iter()
            .find(|o| o["path"] == p && o["change"] == c)
            .unwrap_or_else(|| panic!("{p} {c} in {json}"))
            .clone()
    };
    let edit = find("/edit.txt", "modified");
    assert_eq!(edit["kind"], "file");
    assert_eq!(
        edit["new_hash"],
        agentfs::delta::sha256_hex(lines(20, Some(10)).as_bytes())
    );
    assert_eq!(
        edit["old_hash"],
        agentfs::delta::sha256_hex(lines(20, None).as_bytes())
    );
    let chmod = find("/chmod.sh", "modified");
    assert_eq!(chmod["old_hash"], chmod["new_hash"]);
    assert_eq!(
        (chmod["old_mode"].as_str(), chmod["new_mode"].as_str()),
        (Some("100644"), Some("100755"))
    );
    let link = find("/link", "modified");
    assert_eq!(
        (link["kind"].as_str(), link["new_hash"].clone()),
        (
            Some("symlink"),
            serde_json::json!(agentfs::delta::sha256_hex(b"edit.txt"))
        )
    );
    let typechg = find("/typechg", "type-changed");
    assert_eq!(
        (&typechg["kind"], &typechg["old_type"], &typechg["new_type"]),
        (&"dir".into(), &"file".into(), &"dir".into())
    );
    assert_eq!(typechg["new_oid"], serde_json::Value::Null);
    // Sizes, symlink targets, git blob ids and blake3 of both sides.
    assert_eq!(
        (&link["old_target"], &link["new_target"], &link["new_size"]),
        (&"keep.txt".into(), &"edit.txt".into(), &8.into())
    );
    assert_eq!(
        link["new_oid"], "6e2feb058341dd59b9d164642e37af5e00f7793d",
        "git hash-object of \"edit.txt\""
    );
    assert_eq!(
        edit["new_blake3"],
        blake3::hash(lines(20, Some(10)).as_bytes())
            .to_hex()
            .as_str()
    );
    assert_eq!(edit["old_size"], serde_json::json!(lines(20, None).len()));
    let added = find("/new.txt", "added");
    assert_eq!(
        (&added["old_mode"], &added["old_oid"], &added["new_oid"]),
        (
            &serde_json::Value::Null,
            &serde_json::Value::Null,
            &agentfs::delta::patch::git_blob_id(b"no newline at end").into()
        )
    );
    assert_eq!(added["path_hex"], serde_json::Value::Null);
    assert_eq!(
        find("/olddir/sub", "deleted")["new_hash"],
        serde_json::Value::Null
    );
    assert_eq!(
        find("/newdir", "added")["new_hash"],
        agentfs::delta::sha256_hex(b"")
    );

    // diff reads only: the base and the database are untouched.
    assert_eq!(tree(&base), before);
    common::assert_consistent(&db);
}

#[test]
fn patch_and_apply_produce_the_same_expected_tree() {
    // SAFETY: umask only affects files this test process and its children create.
    unsafe { libc::umask(0o022) };
    let d = scratch();
    let base = d.path().join("base");
    make_base(&base);
    let db = d.path().join("delta.sqlite");
    make_delta(&db, &base);
    let want = expected_tree(&base);
    let base_before = tree(&base);

    let patch = agentfs(&["diff", s(&db), "--patch", "--binary"]);
    assert!(patch.status.success(), "{patch:?}");
    let text = String::from_utf8_lossy(&patch.stdout);
    assert!(text.contains("GIT binary patch"), "{text}");
    assert!(text.contains("\\ No newline at end of file"), "{text}");
    assert!(text.contains("new file mode 120000"), "{text}");
    assert!(text.contains("old mode 100644\nnew mode 100755"), "{text}");
    let by_git = d.path().join("by-git");
    copy_tree(&base, &by_git);
    git_apply(&by_git, &patch.stdout);

    let by_agentfs = d.path().join("by-agentfs");
    copy_tree(&base, &by_agentfs);
    let db2 = db_for(&db, &by_agentfs, "delta2.sqlite");
    let db_bytes = fs::read(&db2).unwrap();

    // --dry-run lists the steps and writes nothing.
    let dry = stdout(&agentfs(&["apply", s(&db2), "--dry-run"]));
    assert!(
        dry.contains("remove /gone.txt") && dry.contains("mkdir /newdir"),
        "{dry}"
    );
    assert_eq!(tree(&by_agentfs), tree(&base));

    let applied = stdout(&agentfs(&["apply", s(&db2)]));
    assert!(applied.contains("applied"), "{applied}");
    assert_eq!(tree(&by_agentfs), want);
    assert_eq!(tree(&by_git), want);
    assert_eq!(
        fs::read(&db2).unwrap(),
        db_bytes,
        "apply leaves the delta unchanged"
    );

    // A second apply finds nothing to do, and diff reports nothing.
    let again = stdout(&agentfs(&["apply", s(&db2)]));
    assert!(again.starts_with("nothing to do"), "{again}");
    assert_eq!(stdout(&agentfs(&["diff", s(&db2)])), "");
    assert_eq!(tree(&by_agentfs), want);
    // The original base was only read.
    assert_eq!(tree(&base), base_before);
}

#[test]
fn apply_refuses_a_base_dir_replaced_by_a_symlink_and_writes_nothing_outside() {
    let d = scratch();
    let base = d.path().join("base");
    make_base(&base);
    let db = d.path().join("delta.sqlite");
    make_delta(&db, &base);
    let outside = d.path().join("outside");
    fs::create_dir_all(outside.join("a/b")).unwrap();
    fs::write(outside.join("old.c"), b"outside\n").unwrap();
    fs::write(outside.join("a/b/f.txt"), b"outside\n").unwrap();
    let outside_before = tree(&outside);

    // The copied-up directory src/ became a symlink to a directory outside the base.
    let copy = d.path().join("copy");
    copy_tree(&base, &copy);
    fs::remove_dir_all(copy.join("src")).unwrap();
    std::os::unix::fs::symlink(&outside, copy.join("src")).unwrap();
    let db2 = db_for(&db, &copy, "delta2.sqlite");
    let copy_before = tree(&copy);
    for args in [vec!["apply", s(&db2)], vec!["apply", s(&db2), "--dry-run"]] {
        one_line_error(&agentfs(&args), "refusing");
    }
    assert_eq!(tree(&copy), copy_before, "nothing written in the base");
    assert_eq!(tree(&outside), outside_before, "nothing written outside");

    // A whiteout beneath a symlinked directory deletes nothing through it.
    let copy3 = d.path().join("copy3");
    copy_tree(&base, &copy3);
    fs::remove_dir_all(copy3.join("deep")).unwrap();
    std::os::unix::fs::symlink(&outside, copy3.join("deep")).unwrap();
    let db3 = db_for(&db, &copy3, "delta3.sqlite");
    let listed = stdout(&agentfs(&["diff", s(&db3)]));
    assert!(!listed.contains("/deep/"), "{listed}");
    stdout(&agentfs(&["apply", s(&db3)]));
    assert_eq!(tree(&outside), outside_before, "nothing written outside");
    assert!(fs::symlink_metadata(copy3.join("deep"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn apply_sets_exact_modes_and_creates_empty_directories() {
    let d = scratch();
    let base = d.path().join("base");
    fs::create_dir_all(base.join("shared")).unwrap();
    fs::set_permissions(base.join("shared"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(base.join("secret"), b"s\n").unwrap();
    fs::set_permissions(base.join("secret"), fs::Permissions::from_mode(0o644)).unwrap();
    let db = d.path().join("delta.sqlite");
    {
        let b = DeltaBuilder::new(&db, &base);
        let r = Ino::ROOT;
        b.dir(r, "shared", 0o700, Some("shared"));
        b.dir(r, "empty", 0o750, None);
        b.file(r, "secret", b"s\n", 0o600, Some("secret"));
        let ro = b.dir(r, "ro", 0o555, None);
        b.file(ro, "inside", b"i\n", 0o400, None);
    }
    let text = stdout(&agentfs(&["diff", s(&db)]));
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        [
            "A /empty",
            "A /ro",
            "A /ro/inside",
            "M /secret",
            "M /shared"
        ]
    );
    stdout(&agentfs(&["apply", s(&db)]));
    let t = tree(&base);
    assert_eq!(t["empty"], ('d', 0o750, Vec::new()));
    assert_eq!(t["shared"], ('d', 0o700, Vec::new()));
    assert_eq!(t["secret"], ('f', 0o600, b"s\n".to_vec()));
    assert_eq!(t["ro"], ('d', 0o555, Vec::new()));
    assert_eq!(t["ro/inside"], ('f', 0o400, b"i\n".to_vec()));
    assert!(stdout(&agentfs(&["apply", s(&db)])).starts_with("nothing to do"));
}

#[test]
fn bad_inputs_give_one_line_errors() {
    let d = scratch();
    let base = d.path().join("base");
    fs::create_dir(&base).unwrap();
    let plain = d.path().join("plain.sqlite");
    assert!(agentfs(&["init", s(&plain)]).status.success());
    one_line_error(&agentfs(&["diff", s(&plain)]), "not an overlay delta");
    one_line_error(&agentfs(&["apply", s(&plain)]), "not an overlay delta");
    let missing = d.path().join("missing.sqlite");
    one_line_error(&agentfs(&["diff", s(&missing)]), "missing.sqlite");
    one_line_error(&agentfs(&["apply", s(&missing)]), "missing.sqlite");
    let junk = d.path().join("junk");
    fs::write(&junk, b"not a database at all, only some text").unwrap();
    one_line_error(&agentfs(&["diff", s(&junk)]), "not");
    // The base directory is gone.
    let db = d.path().join("delta.sqlite");
    assert!(agentfs(&["init", s(&db), "--base", s(&base)])
        .status
        .success());
    fs::remove_dir(&base).unwrap();
    one_line_error(&agentfs(&["diff", s(&db)]), "base");
    one_line_error(&agentfs(&["apply", s(&db)]), "base");
    let out = agentfs(&["diff", s(&db), "--patch", "--json"]);
    assert!(!out.status.success());
}

#[test]
fn apply_refuses_a_mounted_database() {
    if !common::fuse_or_skip("apply_refuses_a_mounted_database") {
        return;
    }
    let m = common::Mounted::new();
    let before = fs::read(&m.db).unwrap_or_default();
    one_line_error(&agentfs(&["apply", s(&m.db)]), "unmount it before apply");
    // A dry run only reads, so it runs while mounted (and finds no overlay here).
    one_line_error(
        &agentfs(&["apply", s(&m.db), "--dry-run"]),
        "not an overlay delta",
    );
    assert_eq!(fs::read(&m.db).unwrap_or_default().len(), before.len());
}
