//! Differential test: the same random sequence of filesystem operations (tests/common/ops.rs)
//! runs on an AgentFS mount and on a native directory; every result (success or errno) and
//! the final trees (content, link counts, modes, user xattrs) must agree.

mod common;

use std::fs;

use common::ops::{apply, snapshot, Rng, KINDS};
use common::{fuse_or_skip, scratch_root, Mounted};

#[test]
fn random_operations_match_the_native_filesystem() {
    if !fuse_or_skip("random_operations_match_the_native_filesystem") {
        return;
    }
    let mut m = Mounted::new();
    let native = tempfile::tempdir_in(scratch_root()).unwrap();
    for seed in 1..=8u64 {
        let sub = format!("run{seed}");
        let (a, b) = (m.path(&sub), native.path().join(&sub));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        let (mut ra, mut rb) = (Rng(seed * 0x9e37_79b9), Rng(seed * 0x9e37_79b9));
        for step in 0..400 {
            let op = ra.below(KINDS);
            rb.below(KINDS);
            let (what, got) = apply(&a, op, &mut ra);
            let (_, want) = apply(&b, op, &mut rb);
            assert_eq!(got, want, "seed {seed} step {step}: {what}");
        }
        assert_eq!(snapshot(&a), snapshot(&b), "trees differ after seed {seed}");
    }
    m.unmount();
    common::assert_consistent(&m.db);
    m.mount();
    for seed in 1..=8u64 {
        let sub = format!("run{seed}");
        assert_eq!(
            snapshot(&m.path(&sub)),
            snapshot(&native.path().join(&sub)),
            "after remount"
        );
    }
}
