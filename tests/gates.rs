//! The validation gates, run against real mounts (and the POSIX gate against the native
//! filesystem too, which proves the gate itself).

mod common;

use common::{fuse_or_skip, scratch_root, Mounted};

fn gate(args: &[&str]) -> (bool, String) {
    gate_env(args, &[])
}

/// Run a gate with extra environment (inherited by the servers it starts).
fn gate_env(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    common::python(args, env)
}

#[test]
fn posix_gate_passes_on_the_native_filesystem() {
    let dir = tempfile::tempdir_in(scratch_root()).unwrap();
    let (ok, text) = gate(&["validation/posix_gate.py", dir.path().to_str().unwrap()]);
    assert!(ok, "posix gate fails on the native filesystem:\n{text}");
}

#[test]
fn posix_gate_passes_on_agentfs() {
    if !fuse_or_skip("posix_gate_passes_on_agentfs") {
        return;
    }
    let mut m = Mounted::new();
    let (ok, text) = gate(&["validation/posix_gate.py", m.mnt.to_str().unwrap()]);
    println!("{text}");
    assert!(ok, "posix gate failed on agentfs:\n{text}");
    m.unmount();
    common::assert_consistent(&m.db);
}

#[test]
fn posix_gate_passes_with_the_writeback_cache_on() {
    if !fuse_or_skip("posix_gate_passes_with_the_writeback_cache_on") {
        return;
    }
    // The kernel buffers writes and owns the write times; WRITEs arrive from its writeback.
    let mut m = Mounted::with_env(&[("AGENTFS_FUSE_WRITEBACK_CACHE", "1")]);
    let (ok, text) = gate(&["validation/posix_gate.py", m.mnt.to_str().unwrap()]);
    println!("{text}");
    assert!(ok, "posix gate failed with the writeback cache:\n{text}");
    m.unmount();
    common::assert_consistent(&m.db);
}

#[test]
fn posix_gate_passes_with_batching_off() {
    if !fuse_or_skip("posix_gate_passes_with_batching_off") {
        return;
    }
    // Both kill switches: one SQLite transaction per WRITE and per namespace operation.
    let mut m = Mounted::with_env(&[("AGENTFS_BATCH", "0"), ("AGENTFS_BATCH_NAMESPACE", "0")]);
    let (ok, text) = gate(&["validation/posix_gate.py", m.mnt.to_str().unwrap()]);
    println!("{text}");
    assert!(ok, "posix gate failed with batching off:\n{text}");
    m.unmount();
    common::assert_consistent(&m.db);
}

#[test]
fn posix_gate_passes_batched_without_the_writeback_cache() {
    if !fuse_or_skip("posix_gate_passes_batched_without_the_writeback_cache") {
        return;
    }
    // Every small write reaches the batcher: reads and getattr must merge pending bytes.
    let mut m = Mounted::with_env(&[
        ("AGENTFS_FUSE_WRITEBACK_CACHE", "0"),
        ("AGENTFS_BATCH_WINDOW_MS", "10000"),
    ]);
    let (ok, text) = gate(&["validation/posix_gate.py", m.mnt.to_str().unwrap()]);
    println!("{text}");
    assert!(
        ok,
        "posix gate failed (batched, write-through kernel):\n{text}"
    );
    m.unmount();
    common::assert_consistent(&m.db);
}

fn crash_gate(rounds: &str, env: &[(&str, &str)]) {
    let dir = tempfile::tempdir_in(scratch_root()).unwrap();
    let (ok, text) = gate_env(
        &[
            "validation/crash_gate.py",
            "--agentfs",
            env!("CARGO_BIN_EXE_agentfs"),
            "--rounds",
            rounds,
            "--workdir",
            dir.path().to_str().unwrap(),
        ],
        env,
    );
    println!("{text}");
    assert!(ok, "crash gate ({env:?}) failed:\n{text}");
}

/// kill -9 under four writers, 20 rounds, batching on (the default).
#[test]
fn crash_gate_passes() {
    if !fuse_or_skip("crash_gate_passes") {
        return;
    }
    crash_gate("20", &[("AGENTFS_BATCH", "1")]);
}

/// A long group-commit window: at each kill most acknowledged bytes are still pending and
/// most acknowledged operations are in the open namespace batch.
#[test]
fn crash_gate_passes_with_a_long_batch_window() {
    if !fuse_or_skip("crash_gate_passes_with_a_long_batch_window") {
        return;
    }
    crash_gate("4", &[("AGENTFS_BATCH_WINDOW_MS", "2000")]);
}

/// Both kill switches: one transaction per WRITE and per namespace operation.
#[test]
fn crash_gate_passes_with_batching_off() {
    if !fuse_or_skip("crash_gate_passes_with_batching_off") {
        return;
    }
    crash_gate(
        "4",
        &[("AGENTFS_BATCH", "0"), ("AGENTFS_BATCH_NAMESPACE", "0")],
    );
}
