//! Open/close coherence gates (validation/noopen-coherence.py, validation/flush-coherence.py,
//! validation/coherence-stress.py) run on the native filesystem (which proves each gate), on
//! AgentFS with its defaults (no-open and no-flush: OPEN/OPENDIR/FLUSH answered with ENOSYS), and
//! with the kill switches that restore the classic exchanges (AGENTFS_FUSE_NOOPEN=0,
//! AGENTFS_FUSE_NOFLUSH=0) or turn the writeback cache on. Every mount is unmounted cleanly and
//! its database checked afterwards.

mod common;

use std::process::Command;
use std::time::Instant;

use common::{fuse_or_skip, scratch_root, Mounted};

const NOOPEN: &str = "validation/noopen-coherence.py";
const FLUSH: &str = "validation/flush-coherence.py";
const STRESS: &str = "validation/coherence-stress.py";
const HARDLINK: &str = "validation/hardlink-race.py";

fn gate(script: &str, dir: &std::path::Path) -> (bool, String) {
    let start = Instant::now();
    let out = Command::new("python3")
        .arg(script)
        .arg(dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("python3");
    let text = format!(
        "{}{}# {script}: {:.1}s\n",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        start.elapsed().as_secs_f64()
    );
    (out.status.success(), text)
}

fn native(script: &str) {
    let dir = tempfile::tempdir_in(scratch_root()).unwrap();
    let (ok, text) = gate(script, dir.path());
    println!("{text}");
    assert!(ok, "{script} fails on the native filesystem:\n{text}");
}

fn on_agentfs(test: &str, script: &str, env: &[(&str, &str)]) {
    if !fuse_or_skip(test) {
        return;
    }
    let mut m = Mounted::with_env(env);
    let (ok, text) = gate(script, &m.mnt);
    println!("{text}");
    m.unmount();
    common::assert_consistent(&m.db);
    assert!(ok, "{script} failed on agentfs with {env:?}:\n{text}");
}

// ---- noopen-coherence.py ----

#[test]
fn noopen_coherence_native() {
    native(NOOPEN);
}

#[test]
fn noopen_coherence_agentfs_default() {
    on_agentfs("noopen_coherence_agentfs_default", NOOPEN, &[]);
}

#[test]
fn noopen_coherence_agentfs_classic_open() {
    on_agentfs(
        "noopen_coherence_agentfs_classic_open",
        NOOPEN,
        &[("AGENTFS_FUSE_NOOPEN", "0")],
    );
}

#[test]
fn noopen_coherence_agentfs_classic_opendir() {
    on_agentfs(
        "noopen_coherence_agentfs_classic_opendir",
        NOOPEN,
        &[("AGENTFS_FUSE_NOOPENDIR", "0")],
    );
}

// ---- flush-coherence.py ----

#[test]
fn flush_coherence_native() {
    native(FLUSH);
}

#[test]
fn flush_coherence_agentfs_default() {
    on_agentfs("flush_coherence_agentfs_default", FLUSH, &[]);
}

#[test]
fn flush_coherence_agentfs_classic_open() {
    on_agentfs(
        "flush_coherence_agentfs_classic_open",
        FLUSH,
        &[("AGENTFS_FUSE_NOOPEN", "0")],
    );
}

#[test]
fn flush_coherence_agentfs_classic_flush() {
    on_agentfs(
        "flush_coherence_agentfs_classic_flush",
        FLUSH,
        &[("AGENTFS_FUSE_NOFLUSH", "0")],
    );
}

// ---- coherence-stress.py (default ~15 s each) ----

#[test]
fn coherence_stress_native() {
    native(STRESS);
}

// The kernel's double nlink drop (kernel-notes/fuse-server-facts.md) can still be hit through
// a LOOKUP or GETATTR reply racing an unlink or rename-over; the server closes only the
// READDIRPLUS path (hardlink-race below). Under the writeback cache this stress trips over it
// now and then, so it runs on demand: `cargo test --test coherence -- --ignored`.
#[test]
#[ignore = "kernel FUSE race: a reply can land between an unlink and the kernel's own nlink drop"]
fn coherence_stress_agentfs_writeback_cache_on() {
    on_agentfs(
        "coherence_stress_agentfs_writeback_cache_on",
        STRESS,
        &[("AGENTFS_FUSE_WRITEBACK_CACHE", "1")],
    );
}

// The kernel's double nlink drop (kernel-notes/fuse-server-facts.md) can still be hit through
// a LOOKUP or GETATTR reply racing an unlink or rename-over; the server closes only the
// READDIRPLUS path (hardlink-race below). Under the writeback cache this stress trips over it
// now and then, so it runs on demand: `cargo test --test coherence -- --ignored`.
#[test]
#[ignore = "kernel FUSE race: a reply can land between an unlink and the kernel's own nlink drop"]
fn coherence_stress_agentfs_classic_open() {
    on_agentfs(
        "coherence_stress_agentfs_classic_open",
        STRESS,
        &[
            ("AGENTFS_FUSE_NOOPEN", "0"),
            ("AGENTFS_FUSE_WRITEBACK_CACHE", "1"),
        ],
    );
}

#[test]
fn coherence_stress_agentfs_default() {
    on_agentfs("coherence_stress_agentfs_default", STRESS, &[]);
}

// ---- hardlink-race.py (10 s each): replies racing the kernel's own nlink drop ----

#[test]
fn hardlink_race_native() {
    native(HARDLINK);
}

#[test]
fn hardlink_race_agentfs_default() {
    on_agentfs("hardlink_race_agentfs_default", HARDLINK, &[]);
}
