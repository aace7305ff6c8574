//! The overlay gate (validation/overlay_gate.py): a read-only base seen through a copy-on-write
//! mount. Kernel overlayfs and fuse-overlayfs are the reference legs (they prove the gate);
//! the AgentFS leg runs on both transports.

mod common;

use std::process::Command;

use common::{fuse_or_skip, scratch_root, UringParam};

/// Run the gate's `kind` leg with extra arguments; returns (success, output).
fn overlay_gate(kind: &str, extra: &[&str]) -> (bool, String) {
    let work = tempfile::tempdir_in(scratch_root()).expect("tempdir");
    let workdir = work.path().to_str().unwrap();
    let bin = env!("CARGO_BIN_EXE_agentfs");
    let mut args = vec!["validation/overlay_gate.py", "--kind", kind, "--quick"];
    args.extend(["--workdir", workdir, "--agentfs", bin]);
    args.extend_from_slice(extra);
    common::python(&args, &[])
}

fn assert_leg(kind: &str, extra: &[&str]) {
    let (ok, text) = overlay_gate(kind, extra);
    println!("{text}");
    assert!(ok, "overlay gate, {kind} leg, failed:\n{text}");
    assert!(
        !text.contains("\n0 passed"),
        "overlay gate ran nothing:\n{text}"
    );
}

#[test]
fn overlay_gate_passes_on_kernel_overlayfs() {
    if !fuse_or_skip("overlay_gate_passes_on_kernel_overlayfs") {
        return;
    }
    assert_leg("kernel-overlay", &[]);
}

#[test]
fn overlay_gate_passes_on_fuse_overlayfs() {
    if !fuse_or_skip("overlay_gate_passes_on_fuse_overlayfs") {
        return;
    }
    let installed = Command::new("fuse-overlayfs")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        assert!(
            !agentfs::knobs::get().require_fuse,
            "fuse-overlayfs is not installed (validation/install-deps.sh installs it)"
        );
        eprintln!("SKIP: fuse-overlayfs is not installed");
        return;
    }
    assert_leg("fuse-overlayfs", &[]);
}

/// The AgentFS leg, every check, with the kernel's io_uring switch set to `uring` ("Y"/"N").
fn agentfs_leg(test: &str, uring: &str) {
    if !fuse_or_skip(test) {
        return;
    }
    let Some(_param) = UringParam::set(uring) else {
        assert!(
            uring == "N" || !agentfs::knobs::get().require_fuse,
            "cannot set enable_uring"
        );
        eprintln!("SKIP {test}: enable_uring not writable");
        return;
    };
    assert_leg("agentfs", &[]);
}

#[test]
fn overlay_gate_passes_on_agentfs_over_dev_fuse() {
    agentfs_leg("overlay_gate_passes_on_agentfs_over_dev_fuse", "N");
}

#[test]
fn overlay_gate_passes_on_agentfs_over_io_uring() {
    agentfs_leg("overlay_gate_passes_on_agentfs_over_io_uring", "Y");
}
