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

/// A tmpfs mounted for a test; detached when dropped (lazily: a server that still holds the
/// base open when a failed test unwinds must not keep it mounted).
struct Tmpfs(std::path::PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Inode numbers of objects made in the overlay never equal those of base objects, even when
/// both count from 1: a fresh tmpfs numbers its inodes 1, 2, 3, ... and so does a fresh delta.
/// Each name's d_ino is its st_ino, and a copy keeps the base's.
#[test]
fn overlay_inode_numbers_never_collide_with_the_base() {
    use std::collections::HashMap;
    use std::os::unix::fs::{DirEntryExt, MetadataExt};
    if !fuse_or_skip("overlay_inode_numbers_never_collide_with_the_base") {
        return;
    }
    let mut m = common::Mounted::unmounted();
    let base = m.dir.path().join("base");
    std::fs::create_dir(&base).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "none"])
        .arg(&base)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mount tmpfs");
    let _tmpfs = Tmpfs(base.clone());
    for i in 0..40 {
        std::fs::write(base.join(format!("b{i:02}")), b"base").unwrap();
    }
    std::fs::create_dir(base.join("bdir")).unwrap();
    let base_inos: Vec<u64> = (0..40)
        .map(|i| {
            std::fs::metadata(base.join(format!("b{i:02}")))
                .unwrap()
                .ino()
        })
        .collect();
    assert!(
        base_inos.iter().all(|&i| i < 100),
        "tmpfs numbers from 1: {base_inos:?}"
    );
    common::init_overlay(&m.db, &base);
    m.mount();
    for i in 0..40 {
        std::fs::write(m.path(&format!("n{i:02}")), b"new").unwrap();
    }
    std::fs::create_dir(m.path("ndir")).unwrap();
    // A copy-up (chmod) keeps the base's number.
    std::fs::set_permissions(
        m.path("b07"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    assert_eq!(
        std::fs::metadata(m.path("b07")).unwrap().ino(),
        base_inos[7]
    );
    let mut seen: HashMap<u64, String> = HashMap::new();
    for e in std::fs::read_dir(&m.mnt).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().to_string();
        let ino = std::fs::symlink_metadata(e.path()).unwrap().ino();
        assert_eq!(e.ino(), ino, "d_ino of {name}");
        if let Some(other) = seen.insert(ino, name.clone()) {
            panic!("{name} and {other} share st_ino {ino}");
        }
    }
    assert_eq!(seen.len(), 82, "every name listed once");
    m.unmount();
    common::assert_consistent(&m.db);
}

/// A kernel overlayfs mount for a test; unmounted (lazily) when dropped.
struct KernelOverlay(std::path::PathBuf);

impl Drop for KernelOverlay {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The starting base of the overlay differential test: some of the names the random
/// operations use already exist there (files of several chunk counts, nested directories).
fn random_base(root: &std::path::Path) {
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::create_dir_all(root.join("g/h")).unwrap();
    std::fs::write(
        root.join("a"),
        (0..5000u32).map(|i| i as u8).collect::<Vec<u8>>(),
    )
    .unwrap();
    std::fs::write(
        root.join("d/e"),
        (0..70_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>(),
    )
    .unwrap();
    std::fs::write(root.join("g/h/i"), b"deep").unwrap();
}

/// The same random operations on kernel overlayfs and on an AgentFS overlay of identical
/// bases: every result (success or errno) and the merged trees must agree, also after a
/// remount; the base stays untouched; and `agentfs apply` then turns the base into the merged
/// tree (hard links become separate files there, so link counts are not compared).
#[test]
fn random_operations_match_kernel_overlayfs() {
    use common::ops::{apply, snapshot, Node, Rng, KINDS};
    if !fuse_or_skip("random_operations_match_kernel_overlayfs") {
        return;
    }
    for seed in 1..=4u64 {
        let mut m = common::Mounted::unmounted();
        let top = m.dir.path().to_path_buf();
        let (lower, base) = (top.join("lower"), top.join("base"));
        random_base(&lower);
        random_base(&base);
        for d in ["upper", "work", "ovl"] {
            std::fs::create_dir(top.join(d)).unwrap();
        }
        let opts = format!(
            "lowerdir={},upperdir={},workdir={},redirect_dir=off,index=off,metacopy=off",
            lower.display(),
            top.join("upper").display(),
            top.join("work").display()
        );
        let ok = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(top.join("ovl"))
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount overlayfs");
        let kernel = KernelOverlay(top.join("ovl"));
        common::init_overlay(&m.db, &base);
        let pristine = snapshot(&base);
        m.mount();
        let (mut ra, mut rb) = (Rng(seed * 0x51_7cc1), Rng(seed * 0x51_7cc1));
        for step in 0..300 {
            let op = ra.below(KINDS);
            rb.below(KINDS);
            let (what, got) = apply(&m.mnt, op, &mut ra);
            let (_, want) = apply(&kernel.0, op, &mut rb);
            assert_eq!(got, want, "seed {seed} step {step}: {what}");
        }
        let merged = snapshot(&kernel.0);
        assert_eq!(snapshot(&m.mnt), merged, "merged trees differ, seed {seed}");
        m.unmount();
        drop(kernel);
        assert_eq!(snapshot(&base), pristine, "the base changed, seed {seed}");
        m.mount();
        assert_eq!(snapshot(&m.mnt), merged, "after a remount, seed {seed}");
        m.unmount();
        common::assert_consistent(&m.db);
        let out = common::agentfs(&["apply", m.db.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let applied = |t: std::collections::BTreeMap<std::path::PathBuf, Node>| {
            t.into_iter()
                .map(|(p, n)| (p, n.into_applied()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        assert_eq!(
            applied(snapshot(&base)),
            applied(merged),
            "the applied base differs from the merged tree, seed {seed}"
        );
    }
}

/// `agentfs apply`, run as root, writes a changed file back with the owner it has in the
/// overlay (its base owner, kept by copy-up) instead of making it root's, and gives the files,
/// directories and symlinks it creates the owner they have in the overlay.
#[test]
fn apply_keeps_and_carries_owners() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    if !fuse_or_skip("apply_keeps_and_carries_owners") {
        return;
    }
    let (uid, gid) = (12345u32, 12346u32);
    let mut m = common::Mounted::unmounted();
    let base = m.dir.path().join("base");
    std::fs::create_dir_all(base.join("pub")).unwrap();
    std::fs::set_permissions(base.join("pub"), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(base.join("own.txt"), b"old").unwrap();
    std::os::unix::fs::chown(base.join("own.txt"), Some(uid), Some(gid)).unwrap();
    common::init_overlay(&m.db, &base);
    m.mount();
    std::fs::write(m.path("own.txt"), b"rewritten by root").unwrap();
    std::fs::write(m.path("rootfile"), b"root's").unwrap();
    let ok = Command::new("sh")
        .args([
            "-c",
            "echo mine > pub/mine && mkdir pub/sub && ln -s mine pub/link",
        ])
        .current_dir(&m.mnt)
        .uid(uid)
        .gid(gid)
        .status()
        .unwrap()
        .success();
    assert!(ok, "the user's changes through the mount");
    m.unmount();
    let out = common::agentfs(&["apply", m.db.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let owner = |rel: &str| {
        let md = std::fs::symlink_metadata(base.join(rel)).unwrap();
        (md.uid(), md.gid())
    };
    assert_eq!(
        std::fs::read(base.join("own.txt")).unwrap(),
        b"rewritten by root"
    );
    assert_eq!(
        owner("own.txt"),
        (uid, gid),
        "a rewritten file keeps its owner"
    );
    for rel in ["pub/mine", "pub/sub", "pub/link"] {
        assert_eq!(owner(rel), (uid, gid), "owner of {rel}");
    }
    assert_eq!(owner("rootfile"), (0, 0));
}
