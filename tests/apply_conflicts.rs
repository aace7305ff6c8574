//! `agentfs apply` over a base that changed after the delta saw it: the overlay records what
//! it copied, whited out or replaced (`fs_base_seen`), and apply refuses, before writing, every
//! path where the base is no longer that — unless `--force`. Deltas are made through a real
//! overlay mount.

mod common;

use std::fs;
use std::io::Write;
use std::path::Path;

use common::{agentfs, fuse_or_skip, Mounted};

fn init(db: &Path, base: &Path, extra: &[&str]) {
    let mut args = vec![
        "init",
        db.to_str().unwrap(),
        "--base",
        base.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = agentfs(&args);
    assert!(out.status.success(), "{out:?}");
}

fn apply(db: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["apply", db.to_str().unwrap()];
    args.extend_from_slice(extra);
    agentfs(&args)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The one-line apply_conflict error naming exactly `paths`.
fn assert_conflict(out: &std::process::Output, paths: &[&str]) {
    assert!(!out.status.success(), "apply should refuse: {out:?}");
    let err = text(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("apply_conflict"), "{err}");
    let listed = text(&out.stdout);
    let mut got: Vec<&str> = listed
        .lines()
        .filter_map(|l| l.strip_prefix("conflict "))
        .filter_map(|l| l.split(':').next())
        .collect();
    got.sort();
    assert_eq!(got, paths, "conflicts listed: {listed}");
    for p in paths {
        assert!(err.contains(p), "{err} should name {p}");
    }
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| format!("<{e}>"))
}

/// Commit everything acknowledged so far (fsync of a file is a barrier for the whole batch).
fn barrier(m: &Mounted, rel: &str) {
    fs::File::open(m.path(rel)).unwrap().sync_all().unwrap();
}

#[test]
fn apply_refuses_base_changes_since_the_delta_saw_them() {
    if !fuse_or_skip("apply_refuses_base_changes_since_the_delta_saw_them") {
        return;
    }
    let mut m = Mounted::unmounted();
    let base = m.dir.path().join("base");
    fs::create_dir_all(base.join("dir")).unwrap();
    for (rel, body) in [
        ("edited.txt", "old\n"),
        ("removed.txt", "bye\n"),
        ("untouched.txt", "same\n"),
        ("dir/kept.txt", "kept\n"),
    ] {
        fs::write(base.join(rel), body).unwrap();
    }
    init(&m.db, &base, &[]);
    m.mount();
    fs::write(m.path("edited.txt"), "mine\n").unwrap();
    fs::remove_file(m.path("removed.txt")).unwrap();
    fs::write(m.path("added.txt"), "added by the delta\n").unwrap();
    fs::write(m.path("dir/kept.txt"), "kept, changed in the delta\n").unwrap();
    barrier(&m, "edited.txt");

    // Someone edits the base directly meanwhile.
    fs::write(base.join("edited.txt"), "theirs\n").unwrap();
    fs::write(base.join("removed.txt"), "bye, but edited\n").unwrap();
    fs::write(base.join("added.txt"), "made in the base\n").unwrap();
    fs::write(base.join("untouched.txt"), "edited, no delta change\n").unwrap();
    let conflicts = ["/added.txt", "/edited.txt", "/removed.txt"];

    // A dry run works while the delta is mounted and reports the conflicts.
    let dry = apply(&m.db, &["--dry-run"]);
    assert_conflict(&dry, &conflicts);
    // A real apply still refuses a mounted delta.
    let out = apply(&m.db, &[]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("unmount it before apply"),
        "{out:?}"
    );
    m.unmount();

    let before = read(&base.join("edited.txt"));
    assert_conflict(&apply(&m.db, &[]), &conflicts);
    assert_conflict(&apply(&m.db, &["--dry-run"]), &conflicts);
    // Nothing was written, not even the path without a conflict.
    assert_eq!(before, "theirs\n");
    assert_eq!(read(&base.join("removed.txt")), "bye, but edited\n");
    assert_eq!(read(&base.join("added.txt")), "made in the base\n");
    assert_eq!(read(&base.join("dir/kept.txt")), "kept\n");

    let out = apply(&m.db, &["--force"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(read(&base.join("edited.txt")), "mine\n");
    assert!(!base.join("removed.txt").exists());
    assert_eq!(read(&base.join("added.txt")), "added by the delta\n");
    assert_eq!(
        read(&base.join("dir/kept.txt")),
        "kept, changed in the delta\n"
    );
    assert_eq!(
        read(&base.join("untouched.txt")),
        "edited, no delta change\n",
        "a base change the delta does not touch stays"
    );
    assert!(text(&apply(&m.db, &[]).stdout).starts_with("nothing to do"));

    // More work in the same delta after an apply is not mistaken for a base change.
    m.mount();
    fs::write(m.path("edited.txt"), "mine, again\n").unwrap();
    fs::write(m.path("dir/kept.txt"), "kept, changed twice\n").unwrap();
    m.unmount();
    let out = apply(&m.db, &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(read(&base.join("edited.txt")), "mine, again\n");
    common::assert_consistent(&m.db);
}

/// Base changes of type, permissions and inside a deleted directory are conflicts too; a base
/// file replaced by an identical copy (another inode, same bytes and mode) is not.
#[test]
fn apply_conflicts_in_deleted_trees_modes_and_types() {
    use std::os::unix::fs::PermissionsExt;
    if !fuse_or_skip("apply_conflicts_in_deleted_trees_modes_and_types") {
        return;
    }
    let mut m = Mounted::unmounted();
    let base = m.dir.path().join("base");
    fs::create_dir_all(base.join("tree/sub")).unwrap();
    fs::write(base.join("tree/sub/a"), "a\n").unwrap();
    fs::write(base.join("mode.txt"), "m\n").unwrap();
    fs::write(base.join("kind"), "file\n").unwrap();
    fs::write(base.join("same.txt"), "s\n").unwrap();
    init(&m.db, &base, &[]);
    m.mount();
    fs::remove_dir_all(m.path("tree")).unwrap();
    fs::write(m.path("mode.txt"), "m2\n").unwrap();
    fs::write(m.path("kind"), "file2\n").unwrap();
    // Written in place (no O_TRUNC), so the copy-up reads the whole file and records its hash.
    fs::OpenOptions::new()
        .write(true)
        .open(m.path("same.txt"))
        .and_then(|mut f| f.write_all(b"s2"))
        .unwrap();
    m.unmount();

    fs::write(base.join("tree/sub/new"), "created under a deleted tree\n").unwrap();
    fs::set_permissions(base.join("mode.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::remove_file(base.join("kind")).unwrap();
    fs::create_dir(base.join("kind")).unwrap();
    // Same bytes and mode, new inode: an editor's atomic save that changed nothing.
    fs::write(base.join("same.tmp"), "s\n").unwrap();
    fs::rename(base.join("same.tmp"), base.join("same.txt")).unwrap();
    assert_conflict(&apply(&m.db, &[]), &["/kind", "/mode.txt", "/tree/sub/new"]);
    assert!(base.join("tree/sub/a").exists(), "nothing removed");
    let out = apply(&m.db, &["--force"]);
    assert!(out.status.success(), "{out:?}");
    assert!(!base.join("tree").exists());
    assert_eq!(read(&base.join("kind")), "file2\n");
    assert_eq!(read(&base.join("same.txt")), "s2");
    common::assert_consistent(&m.db);
}

/// A partial-origin file keeps reading its unchanged chunks from the base file, so a changed
/// base file leaves its content undefined: apply refuses it even with --force.
#[test]
fn apply_refuses_a_partial_origin_file_over_a_changed_base() {
    if !fuse_or_skip("apply_refuses_a_partial_origin_file_over_a_changed_base") {
        return;
    }
    let mut m = Mounted::unmounted();
    let base = m.dir.path().join("base");
    fs::create_dir_all(&base).unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(base.join("big.bin"), &big).unwrap();
    init(&m.db, &base, &["--partial-origin", "on"]);
    m.mount();
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new()
            .write(true)
            .open(m.path("big.bin"))
            .unwrap();
        f.write_all_at(b"delta", 70_000).unwrap();
    }
    m.unmount();
    let mut theirs = big.clone();
    theirs[0] = 0xff;
    fs::write(base.join("big.bin"), &theirs).unwrap();
    assert_conflict(&apply(&m.db, &["--dry-run"]), &["/big.bin"]);
    assert_conflict(&apply(&m.db, &[]), &["/big.bin"]);
    let forced = apply(&m.db, &["--force"]);
    assert_conflict(&forced, &["/big.bin"]);
    assert!(
        text(&forced.stderr).contains("--force cannot"),
        "{forced:?}"
    );
    assert_eq!(fs::read(base.join("big.bin")).unwrap(), theirs);
}
