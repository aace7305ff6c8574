//! Differential test: the same random sequence of filesystem operations runs on an AgentFS mount
//! and on a native directory; every result (success or errno) and the final trees must agree.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use common::{fuse_or_skip, scratch_root, Mounted};

/// A small deterministic generator (xorshift64*), so failures reproduce from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const NAMES: [&str; 6] = ["a", "b", "c", "d/e", "d/f", "g/h/i"];
const DIRS: [&str; 3] = ["d", "g", "g/h"];

fn pick<'a>(r: &mut Rng, from: &[&'a str]) -> &'a str {
    from[r.below(from.len() as u64) as usize]
}

fn errno<T>(r: std::io::Result<T>) -> Result<(), i32> {
    r.map(|_| ()).map_err(|e| e.raw_os_error().unwrap_or(-1))
}

/// Apply operation number `op` (with its random arguments) under `root`.
fn apply(root: &Path, op: u64, r: &mut Rng) -> (String, Result<(), i32>) {
    let p = |s: &str| root.join(s);
    match op {
        0 => {
            let n = pick(r, &NAMES);
            let len =
                [0u64, 1, 4095, 4096, 4097, 65535, 65536, 65537, 200_000][r.below(9) as usize];
            let seed = r.below(256) as u8;
            let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_add(seed)).collect();
            (format!("write {n} {len}"), errno(fs::write(p(n), data)))
        }
        1 => {
            let n = pick(r, &NAMES);
            let off = r.below(300_000);
            let len = r.below(70_000) as usize;
            let res = fs::OpenOptions::new()
                .write(true)
                .open(p(n))
                .and_then(|f| f.write_all_at(&vec![0xab; len], off));
            (format!("pwrite {n} {off} {len}"), errno(res))
        }
        2 => {
            let n = pick(r, &NAMES);
            let size = r.below(140_000);
            let res = fs::OpenOptions::new()
                .write(true)
                .open(p(n))
                .and_then(|f| f.set_len(size));
            (format!("truncate {n} {size}"), errno(res))
        }
        3 => {
            let (a, b) = (pick(r, &NAMES), pick(r, &NAMES));
            (format!("rename {a} {b}"), errno(fs::rename(p(a), p(b))))
        }
        4 => {
            let n = pick(r, &NAMES);
            (format!("unlink {n}"), errno(fs::remove_file(p(n))))
        }
        5 => {
            let d = pick(r, &DIRS);
            (format!("mkdir {d}"), errno(fs::create_dir(p(d))))
        }
        6 => {
            let d = pick(r, &DIRS);
            (format!("rmdir {d}"), errno(fs::remove_dir(p(d))))
        }
        7 => {
            let (a, b) = (pick(r, &NAMES), pick(r, &NAMES));
            (format!("link {a} {b}"), errno(fs::hard_link(p(a), p(b))))
        }
        8 => {
            let (a, b) = (pick(r, &NAMES), pick(r, &NAMES));
            (
                format!("symlink {a} {b}"),
                errno(std::os::unix::fs::symlink(a, p(b))),
            )
        }
        9 => {
            let (a, b) = (pick(r, &DIRS), pick(r, &DIRS));
            (format!("rename-dir {a} {b}"), errno(fs::rename(p(a), p(b))))
        }
        _ => {
            let n = pick(r, &NAMES);
            let res = fs::OpenOptions::new()
                .append(true)
                .open(p(n))
                .and_then(|mut f| {
                    f.seek(SeekFrom::End(0))?;
                    f.write_all(b"appended")
                });
            (format!("append {n}"), errno(res))
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Node {
    File { data: Vec<u8>, nlink: u64 },
    Dir,
    Link(PathBuf),
}

fn snapshot(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let path = e.path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            let node = if meta.file_type().is_symlink() {
                Node::Link(fs::read_link(&path).unwrap())
            } else if meta.is_dir() {
                stack.push(path.clone());
                Node::Dir
            } else {
                Node::File {
                    data: fs::read(&path).unwrap(),
                    nlink: meta.nlink(),
                }
            };
            out.insert(rel, node);
        }
    }
    out
}

#[test]
fn random_operations_match_the_native_filesystem() {
    if !fuse_or_skip("random_operations_match_the_native_filesystem") {
        return;
    }
    let mut m = Mounted::new();
    let native = tempfile::tempdir_in(scratch_root()).unwrap();
    for seed in 1..=4u64 {
        let sub = format!("run{seed}");
        let (a, b) = (m.path(&sub), native.path().join(&sub));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        let (mut ra, mut rb) = (Rng(seed * 0x9e37_79b9), Rng(seed * 0x9e37_79b9));
        for step in 0..400 {
            let op = ra.below(11);
            rb.below(11);
            let (what, got) = apply(&a, op, &mut ra);
            let (_, want) = apply(&b, op, &mut rb);
            assert_eq!(got, want, "seed {seed} step {step}: {what}");
        }
        assert_eq!(snapshot(&a), snapshot(&b), "trees differ after seed {seed}");
    }
    m.unmount();
    common::assert_consistent(&m.db);
    m.mount();
    for seed in 1..=4u64 {
        let sub = format!("run{seed}");
        assert_eq!(
            snapshot(&m.path(&sub)),
            snapshot(&native.path().join(&sub)),
            "after remount"
        );
    }
}
