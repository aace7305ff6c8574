//! Random filesystem operations for differential tests: the same seed drives the same
//! sequence on two directory trees, whose results and final contents are then compared.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A small deterministic generator (xorshift64*), so failures reproduce from the seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

pub const NAMES: [&str; 6] = ["a", "b", "c", "d/e", "d/f", "g/h/i"];
pub const DIRS: [&str; 3] = ["d", "g", "g/h"];

fn pick<'a>(r: &mut Rng, from: &[&'a str]) -> &'a str {
    from[r.below(from.len() as u64) as usize]
}

fn errno<T>(r: std::io::Result<T>) -> Result<(), i32> {
    r.map(|_| ()).map_err(|e| e.raw_os_error().unwrap_or(-1))
}

/// Apply operation number `op` (with its random arguments) under `root`.
pub fn apply(root: &Path, op: u64, r: &mut Rng) -> (String, Result<(), i32>) {
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
        10 => {
            let n = pick(r, &NAMES);
            let mode = [0o600, 0o644, 0o755, 0o700, 0o4755][r.below(5) as usize];
            let res = fs::set_permissions(p(n), fs::Permissions::from_mode(mode));
            (format!("chmod {n} {mode:o}"), errno(res))
        }
        11 => {
            let n = pick(r, &NAMES);
            let value = vec![b'v'; 1 + r.below(3) as usize];
            let path = cpath(&p(n));
            // SAFETY: NUL-terminated path and name; the value is read for its length.
            let rc = unsafe {
                libc::setxattr(
                    path.as_ptr(),
                    c"user.t".as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    0,
                )
            };
            (format!("setxattr {n} {}", value.len()), rc_errno(rc))
        }
        12 => {
            let n = pick(r, &NAMES);
            let path = cpath(&p(n));
            // SAFETY: NUL-terminated path and name.
            let rc = unsafe { libc::removexattr(path.as_ptr(), c"user.t".as_ptr()) };
            (format!("removexattr {n}"), rc_errno(rc))
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

fn cpath(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn rc_errno(rc: libc::c_int) -> Result<(), i32> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(-1))
    }
}

/// The user.* extended attributes of `p` itself (not following a symlink), sorted.
fn user_xattrs(p: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let path = cpath(p);
    let mut names = vec![0u8; 4096];
    // SAFETY: NUL-terminated path; the call writes at most names.len() bytes.
    let n = unsafe { libc::llistxattr(path.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    let mut out = BTreeMap::new();
    if n <= 0 {
        return out;
    }
    names.truncate(n as usize);
    for name in names.split(|b| *b == 0).filter(|n| n.starts_with(b"user.")) {
        let cname = std::ffi::CString::new(name).unwrap();
        let mut value = vec![0u8; 4096];
        // SAFETY: NUL-terminated strings; the call writes at most value.len() bytes.
        let m = unsafe {
            libc::lgetxattr(
                path.as_ptr(),
                cname.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if m >= 0 {
            value.truncate(m as usize);
            out.insert(name.to_vec(), value);
        }
    }
    out
}

#[derive(Debug, PartialEq, Eq)]
pub enum Node {
    File {
        data: Vec<u8>,
        nlink: u64,
        mode: u32,
        xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    },
    Dir {
        mode: u32,
        xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    },
    Link(PathBuf),
}

impl Node {
    /// What a tree written back by `agentfs apply` keeps: content, type and mode, but not
    /// hard links (each name becomes its own file) or extended attributes.
    pub fn into_applied(self) -> Node {
        match self {
            Node::File { data, mode, .. } => Node::File {
                data,
                nlink: 1,
                mode,
                xattrs: BTreeMap::new(),
            },
            Node::Dir { mode, .. } => Node::Dir {
                mode,
                xattrs: BTreeMap::new(),
            },
            other => other,
        }
    }
}

pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Node> {
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
                Node::Dir {
                    mode: meta.mode(),
                    xattrs: user_xattrs(&path),
                }
            } else {
                Node::File {
                    data: fs::read(&path).unwrap(),
                    nlink: meta.nlink(),
                    mode: meta.mode(),
                    xattrs: user_xattrs(&path),
                }
            };
            out.insert(rel, node);
        }
    }
    out
}

/// How many kinds of operation [`apply`] knows.
pub const KINDS: u64 = 14;
