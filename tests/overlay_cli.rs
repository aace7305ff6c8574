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
