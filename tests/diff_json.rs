//! `agentfs diff --json` on a real overlay mount: paths that are not UTF-8, and one consistent
//! cut while the mount keeps writing.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt as _;

use agentfs::delta::{sha256_hex, Change, Overlay};
use common::{agentfs, fuse_or_skip};

/// Write `data` to `path` and fsync it (committed to the database when this returns).
fn write_synced(path: &std::path::Path, data: &[u8]) {
    let mut f = fs::File::create(path).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn diff_reads_one_cut_and_escapes_non_utf8_paths() {
    if !fuse_or_skip("diff_reads_one_cut_and_escapes_non_utf8_paths") {
        return;
    }
    let mut m = common::Mounted::unmounted();
    let base = m.dir.path().join("base");
    fs::create_dir(&base).unwrap();
    fs::write(base.join("keep.txt"), b"keep\n").unwrap();
    common::init_overlay(&m.db, &base);
    m.mount();

    write_synced(&m.path("cut.txt"), b"one\n");
    let odd = m.mnt.join(OsStr::from_bytes(b"latin1-\xe9 name.txt"));
    write_synced(&odd, b"odd\n");

    // A reader opened now keeps seeing this moment while the mount goes on writing.
    let overlay = Overlay::open(&m.db).unwrap();
    write_synced(&m.path("cut.txt"), b"two\n");
    write_synced(&m.path("later.txt"), b"later\n");
    let changes = overlay.changes().unwrap();
    let paths: Vec<&[u8]> = changes.iter().map(|e| e.path.as_slice()).collect();
    assert_eq!(
        paths,
        [&b"/cut.txt"[..], b"/latin1-\xe9 name.txt"],
        "the cut has neither later.txt nor anything else"
    );
    let cut = &changes[0];
    assert_eq!(cut.change, Change::Added);
    let new = cut.new.as_ref().unwrap();
    assert_eq!(new.hash, sha256_hex(b"one\n"));
    assert_eq!(overlay.content(&cut.path, new).unwrap(), b"one\n");
    drop(overlay);
    m.unmount();

    let out = agentfs(&["diff", m.db.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let odd = json
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["path"] == "/latin1-\\xe9 name.txt")
        .unwrap_or_else(|| panic!("escaped path in {json}"));
    assert_eq!(
        odd["path_hex"],
        agentfs::delta::hex(b"/latin1-\xe9 name.txt")
    );
    assert_eq!(
        (&odd["change"], &odd["new_size"], &odd["new_oid"]),
        (
            &"added".into(),
            &4.into(),
            &agentfs::delta::patch::git_blob_id(b"odd\n").into()
        )
    );
}
