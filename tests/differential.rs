//! Differential tests: the same random sequence of filesystem operations (tests/common/ops.rs)
//! runs on an AgentFS mount and on a native directory; every result (success or errno) and
//! the final trees (content, link counts, modes, user xattrs) must agree. And the same
//! sequences run in sandboxes on the FUSE and the overlayfs backend must give the same delta.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use agentfs::history::object::{Entry, Target};
use common::ops::{apply, snapshot, Rng, DIRS, KINDS, NAMES};
use common::world::{err, launched, user_can_run, World, USER};
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

/// The sequence [`ops_entry`] applies inside a sandbox: "SEED STEPS DIR".
const OPS_IN_VIEW: &str = "DIFFERENTIAL_OPS";

/// One mtime for everything a sequence may have changed and for the whole source, so that two
/// runs' snapshots (whose entries keep mtimes) can hash alike.
const FIXED_MTIME: &str = "@1700000000";

/// Where the view shows this test binary (the build tree is not in the view).
const EXE_IN_VIEW: &str = "/tmp/agentfs-differential";

/// Inside a sandbox: this binary started again with [`OPS_IN_VIEW`] applies the sequence under
/// DIR, prints each operation and its result, then sets every path the sequence can have
/// touched (and DIR) to [`FIXED_MTIME`].
#[test]
fn ops_entry() {
    let Ok(spec) = std::env::var(OPS_IN_VIEW) else {
        return;
    };
    let mut words = spec.splitn(3, ' ');
    let mut next = || words.next().expect("SEED STEPS DIR");
    let (seed, steps): (u64, u64) = (next().parse().unwrap(), next().parse().unwrap());
    let dir = PathBuf::from(next());
    let mut r = Rng(seed);
    for step in 0..steps {
        let op = r.below(KINDS);
        let (what, got) = apply(&dir, op, &mut r);
        println!("OP {step} {what}: {got:?}");
    }
    fix_mtimes(&dir);
}

/// Every path of [`NAMES`] and [`DIRS`] under `dir` that exists, files before directories and
/// deeper directories first, then `dir` itself, set to [`FIXED_MTIME`] (symlinks themselves).
fn fix_mtimes(dir: &Path) {
    let mut dirs = DIRS.to_vec();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.len()));
    let paths: Vec<PathBuf> = NAMES
        .iter()
        .chain(&dirs)
        .map(|n| dir.join(n))
        .filter(|p| fs::symlink_metadata(p).is_ok())
        .chain([dir.to_path_buf()])
        .collect();
    let out = Command::new("/usr/bin/touch")
        .args(["-h", "-d", FIXED_MTIME])
        .args(&paths)
        .output()
        .unwrap();
    assert!(out.status.success(), "touch: {out:?}");
}

/// A tmpfs mounted at a directory for the life of the value. A fresh tmpfs numbers its inodes
/// from the start, so two filled alike hold the same inode numbers: the base objects copied
/// up in two projects over them keep the same origins, and their snapshots can hash alike.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path) -> Tmpfs {
        fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                "mode=0755,uid=65534,gid=65534",
                "tmpfs",
            ])
            .arg(at)
            .output()
            .unwrap();
        assert!(out.status.success(), "mount tmpfs: {out:?}");
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The base the sequences start from: objects at some of the generator's names and all of its
/// directories (so operations copy up, white out and hide base objects), and one file no
/// operation names; all of it owned by the command's user, every mtime [`FIXED_MTIME`].
fn fill_base(src: &Path) {
    for d in DIRS {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    fs::write(src.join("a"), b"base a\n").unwrap();
    fs::write(src.join("d/e"), vec![5u8; 70_000]).unwrap();
    fs::write(src.join("g/h/i"), b"base i\n").unwrap();
    fs::write(src.join("keep"), b"untouched\n").unwrap();
    let all = ["a", "d/e", "g/h/i", "keep", "g/h", "g", "d"];
    for p in all.iter().map(|n| src.join(n)) {
        std::os::unix::fs::lchown(&p, Some(USER), Some(USER)).unwrap();
    }
    fix_mtimes(src);
    let out = Command::new("/usr/bin/touch")
        .args(["-h", "-d", FIXED_MTIME])
        .arg(src.join("keep"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// Every entry under tree `hex` of the project store `store`, by path, a directory's tree
/// hash zeroed: what makes two tree hashes differ.
fn tree_entries(store: &Path, hex: &str) -> Vec<(String, Entry)> {
    use agentfs::history::{db, object};
    let c = rusqlite::Connection::open(store).unwrap();
    let hash: object::Hash = (0..32)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect::<Vec<u8>>()
        .try_into()
        .unwrap();
    let mut out = Vec::new();
    let mut stack = vec![(String::new(), hash)];
    while let Some((dir, h)) = stack.pop() {
        for mut e in object::decode_tree(&db::get(&c, &h).unwrap().1).unwrap() {
            let path = format!("{dir}/{}", String::from_utf8_lossy(&e.name));
            if let Target::Dir { tree } = e.target {
                stack.push((path.clone(), tree));
                e.target = Target::Dir { tree: [0; 32] };
            }
            out.push((path, e));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Each object of the base by path ("/a"): its inode number and type bits.
fn base_objects(src: &Path) -> BTreeMap<String, (u64, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let md = fs::symlink_metadata(e.path()).unwrap();
            if md.is_dir() {
                stack.push(e.path());
            }
            let rel = e.path().strip_prefix(src).unwrap().display().to_string();
            out.insert(format!("/{rel}"), (md.ino(), md.mode() & libc::S_IFMT));
        }
    }
    out
}

/// The two exit snapshots agree entry by entry, but for the difference docs/sandbox.md
/// documents: a file copied up on overlayfs and then renamed keeps no trace of the base object
/// it came from, so the import gives it the origin of the base object of its type at its new
/// path, or none, where the FUSE delta keeps the one it came from. Without such a file the
/// tree hashes are equal too.
fn same_snapshot(seed: u64, base: &BTreeMap<String, (u64, u32)>, fuse: &Outcome, ovl: &Outcome) {
    let paths = |o: &Outcome| {
        o.exit_entries
            .iter()
            .map(|(p, _)| p.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        paths(fuse),
        paths(ovl),
        "seed {seed}: the exit snapshot's paths"
    );
    let mut renamed = Vec::new();
    for ((path, f), (_, o)) in fuse.exit_entries.iter().zip(&ovl.exit_entries) {
        if f == o {
            continue;
        }
        let at_path = base
            .get(path)
            .filter(|(_, kind)| *kind == f.mode & libc::S_IFMT)
            .map(|(ino, _)| *ino);
        let origin_of = |entries: &[(String, Entry)], name: &[u8]| {
            let name = String::from_utf8_lossy(name);
            entries
                .iter()
                .find(|(p, _)| *p == name)
                .and_then(|(_, e)| e.origin)
        };
        let origins_as_documented = match &f.target {
            Target::Dir { .. } => false,
            // Another name of a file: the origin of the file it names, on each side.
            Target::Link { path: to } => {
                f.origin == origin_of(&fuse.exit_entries, to)
                    && o.origin == origin_of(&ovl.exit_entries, to)
            }
            _ => f.origin.is_some() && f.origin != at_path && o.origin == at_path,
        };
        let documented = origins_as_documented
            && Entry {
                origin: None,
                ..f.clone()
            } == Entry {
                origin: None,
                ..o.clone()
            };
        assert!(
            documented,
            "seed {seed}: exit snapshot at {path}:\n fuse {f:?}\n overlayfs {o:?}"
        );
        renamed.push(path.clone());
    }
    if renamed.is_empty() {
        assert_eq!(fuse.exit_tree, ovl.exit_tree, "seed {seed}: exit snapshot");
    } else {
        eprintln!("seed {seed}: renamed copies (origins differ as documented): {renamed:?}");
    }
}

/// What one backend gave for one sequence: the operations' results, `diff --json` (the source
/// path replaced), the exit snapshot's entries and tree hash, and the tree `apply` wrote.
#[derive(Debug, PartialEq)]
struct Outcome {
    results: Vec<String>,
    diff: String,
    exit_entries: Vec<(String, Entry)>,
    exit_tree: String,
    applied: std::collections::BTreeMap<PathBuf, common::ops::Node>,
}

fn run_on(w: &World, src: &Path, backend: &str, seed: u64, steps: u64) -> Outcome {
    let name = src.file_name().unwrap().to_str().unwrap();
    let exe = std::env::current_exe().unwrap();
    let bind = format!("{}:{EXE_IN_VIEW}", exe.display());
    let ops = format!("{OPS_IN_VIEW}={seed} {steps} {}", src.display());
    let o = w.af(&[
        "quick",
        src.to_str().unwrap(),
        "--mount-backend",
        backend,
        "--ro-bind",
        &bind,
        "--env",
        &ops,
        "--",
        EXE_IN_VIEW,
        "--exact",
        "ops_entry",
        "--nocapture",
        "--test-threads=1",
        "-q",
    ]);
    launched(&o);
    let results: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with("OP "))
        .map(str::to_string)
        .collect();
    assert_eq!(results.len() as u64, steps, "{backend}: {}", err(&o));
    let d = w.af(&["diff", "--project", name, "--json"]);
    assert!(d.status.success(), "{}", err(&d));
    let diff = String::from_utf8_lossy(&d.stdout).replace(src.to_str().unwrap(), "SRC");
    let l = w.af(&["log", name, "--json"]);
    assert!(l.status.success(), "{}", err(&l));
    let log: serde_json::Value = serde_json::from_slice(&l.stdout).unwrap();
    let head = &log[0];
    assert_eq!(head["kind"], "exit", "{log}");
    let exit_tree = head["tree"].as_str().unwrap().to_string();
    let store = w.root().join(name).join("store/history.db");
    let exit_entries = tree_entries(&store, &exit_tree);
    let a = w.af(&["apply", "--project", name]);
    assert!(a.status.success(), "{}", err(&a));
    Outcome {
        results,
        diff,
        exit_entries,
        exit_tree,
        applied: snapshot(src),
    }
}

/// The same random sequences through a FUSE project and an overlayfs project over two sources
/// filled alike: the same results, `diff --json`, exit snapshot tree and applied tree.
fn both_backends_give_the_same_delta(user: Option<u32>) {
    let w = World::new(user);
    for seed in 1..=8u64 {
        let steps = 80;
        let mut outcomes = Vec::new();
        let mut mounts = Vec::new();
        let mut bases = Vec::new();
        for backend in ["fuse", "overlayfs"] {
            let src = w.base.join(format!("s{seed}-{backend}"));
            mounts.push(Tmpfs::mount(&src));
            fill_base(&src);
            bases.push(base_objects(&src));
            outcomes.push(run_on(&w, &src, backend, seed * 0x9e37_79b9, steps));
        }
        assert_eq!(bases[0], bases[1], "the two bases are not alike");
        let (fuse, ovl) = (&outcomes[0], &outcomes[1]);
        for (step, (f, o)) in fuse.results.iter().zip(&ovl.results).enumerate() {
            assert_eq!(f, o, "seed {seed} step {step}: the operation's result");
        }
        assert_eq!(fuse.diff, ovl.diff, "seed {seed}: diff --json");
        same_snapshot(seed, &bases[0], fuse, ovl);
        assert_eq!(fuse.applied, ovl.applied, "seed {seed}: applied trees");
    }
}

#[test]
fn random_operations_give_the_same_delta_on_both_backends_as_root() {
    if !fuse_or_skip("random_operations_give_the_same_delta_on_both_backends_as_root") {
        return;
    }
    both_backends_give_the_same_delta(None);
}

#[test]
fn random_operations_give_the_same_delta_on_both_backends_as_a_user() {
    let test = "random_operations_give_the_same_delta_on_both_backends_as_a_user";
    if !user_can_run(test) {
        return;
    }
    if !common::readable_by_all(&std::env::current_exe().unwrap()) {
        eprintln!("SKIP {test}: the test binary is not reachable by other users");
        return;
    }
    both_backends_give_the_same_delta(Some(USER));
}
