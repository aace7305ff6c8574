//! `agentfs apply`: make the base directory equal to the overlay view. The only code that
//! writes the base.
//!
//! The plan is the list of changes turned into operations, checked whole before anything is
//! written: no special files, no copied-up directory whose base object is no longer a
//! directory, and every operation's parent is either created by the plan or a real directory
//! reached without a symlink. Then: removals (deepest first), creations and writes (parents
//! first; file contents go to a new file in the same directory that is synced and renamed
//! over the old one), and last the permission bits of directories (deepest first), so a
//! read-only directory is filled before it is closed. Run as root, every file, directory and
//! symlink it creates or rewrites gets the delta's owner (a rewritten file would otherwise
//! become root's); run as anyone else, they are the caller's, as with cp. Times are not
//! carried.

use std::collections::BTreeSet;

use super::{rel, Change, Entry, Kind, Overlay, Side, Source};

/// One step of an apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Remove a file or symlink (`dir`: an empty directory).
    Remove {
        path: Vec<u8>,
        dir: bool,
    },
    Mkdir {
        path: Vec<u8>,
        owner: (u32, u32),
    },
    /// Write the delta side's bytes as the file at `path` (with its permission bits).
    Write {
        path: Vec<u8>,
        side: Side,
    },
    Symlink {
        path: Vec<u8>,
        side: Side,
    },
    Chmod {
        path: Vec<u8>,
        mode: u32,
    },
}

impl Op {
    pub fn path(&self) -> &[u8] {
        match self {
            Op::Remove { path, .. }
            | Op::Mkdir { path, .. }
            | Op::Write { path, .. }
            | Op::Symlink { path, .. }
            | Op::Chmod { path, .. } => path,
        }
    }

    /// One line describing the step.
    pub fn describe(&self) -> String {
        let p = String::from_utf8_lossy(self.path());
        match self {
            Op::Remove { dir: true, .. } => format!("rmdir {p}"),
            Op::Remove { .. } => format!("remove {p}"),
            Op::Mkdir { .. } => format!("mkdir {p}"),
            Op::Write { side, .. } => format!("write {p} (mode {:04o})", side.mode & 0o7777),
            Op::Symlink { .. } => format!("symlink {p}"),
            Op::Chmod { mode, .. } => format!("chmod {:04o} {p}", mode & 0o7777),
        }
    }
}

fn show(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

/// The operations that turn the base into the overlay view, in execution order.
pub fn plan(changes: &[Entry]) -> Result<Vec<Op>, String> {
    let mut removes = Vec::new();
    let mut creates = Vec::new();
    let mut dir_modes = Vec::new();
    let replaced: BTreeSet<&[u8]> = changes
        .iter()
        .filter(|e| e.change == Change::Deleted)
        .map(|e| e.path.as_slice())
        .collect();
    for e in changes {
        if e.kind() == Kind::Special {
            return Err(format!(
                "{} is a special file (device, FIFO or socket); apply does not create or change those",
                show(&e.path)
            ));
        }
        let path = e.path.clone();
        match (e.change, &e.old, &e.new) {
            (Change::Deleted, Some(old), _) => removes.push(Op::Remove {
                path,
                dir: old.kind == Kind::Dir,
            }),
            (Change::Added, _, Some(new)) => {
                if let Source::Delta { origin: true, .. } = new.source {
                    if replaced.contains(e.path.as_slice()) {
                        return Err(format!(
                            "the base changed under the delta: {} was copied up as a {} and is \
                             now another kind of object in the base; refusing to apply",
                            show(&e.path),
                            new.kind.name()
                        ));
                    }
                }
                match new.kind {
                    Kind::Dir => {
                        creates.push(Op::Mkdir {
                            path: path.clone(),
                            owner: new.owner,
                        });
                        dir_modes.push(Op::Chmod {
                            path,
                            mode: new.mode,
                        });
                    }
                    Kind::Symlink => creates.push(Op::Symlink {
                        path,
                        side: new.clone(),
                    }),
                    _ => creates.push(Op::Write {
                        path,
                        side: new.clone(),
                    }),
                }
            }
            (Change::Modified, Some(old), Some(new)) => match new.kind {
                Kind::Dir => dir_modes.push(Op::Chmod {
                    path,
                    mode: new.mode,
                }),
                Kind::Symlink => {
                    removes.push(Op::Remove {
                        path: path.clone(),
                        dir: false,
                    });
                    creates.push(Op::Symlink {
                        path,
                        side: new.clone(),
                    });
                }
                _ if old.hash == new.hash => creates.push(Op::Chmod {
                    path,
                    mode: new.mode,
                }),
                _ => creates.push(Op::Write {
                    path,
                    side: new.clone(),
                }),
            },
            _ => return Err(format!("inconsistent change at {}", show(&e.path))),
        }
    }
    // Deepest first: reverse path order puts every child before its parent.
    removes.sort_by(|a, b| b.path().cmp(a.path()));
    dir_modes.sort_by(|a, b| b.path().cmp(a.path()));
    let mut ops = removes;
    ops.extend(creates);
    ops.extend(dir_modes);
    Ok(ops)
}

/// The proper ancestors of a path below the root ("/a/b/c" -> "/a", "/a/b").
fn ancestors(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.iter()
        .enumerate()
        .skip(1)
        .filter(|(_, b)| **b == b'/')
        .map(move |(i, _)| &path[..i])
}

impl Overlay {
    /// Refuse a plan that would reach outside the base: every ancestor of every step must be a
    /// directory the plan creates, or a real directory of the base now, reached without a
    /// symlink and not removed by the plan.
    pub fn check_plan(&self, ops: &[Op]) -> Result<(), String> {
        let made: BTreeSet<&[u8]> = ops
            .iter()
            .filter(|o| matches!(o, Op::Mkdir { .. }))
            .map(Op::path)
            .collect();
        let mut seen = BTreeSet::new();
        for op in ops {
            for anc in ancestors(op.path()) {
                if made.contains(anc) || !seen.insert(anc.to_vec()) {
                    continue;
                }
                let st = match self.base().lstat(rel(anc)) {
                    Ok(st) => st,
                    Err(e) if crate::sys::beneath::is_escape(&e) => {
                        return Err(format!(
                            "refusing to apply: {} would be reached through a symlink in the base \
                             (at or above {})",
                            show(op.path()),
                            show(anc)
                        ))
                    }
                    Err(e) => return Err(format!("base {}: {e}", show(anc))),
                };
                match st {
                    Some(st) if st.kind() == libc::S_IFDIR => {}
                    Some(_) => {
                        return Err(format!(
                            "refusing to apply: {} is not a directory in the base, so {} cannot be \
                             written beneath it",
                            show(anc),
                            show(op.path())
                        ))
                    }
                    None => {
                        return Err(format!(
                            "refusing to apply: {} is missing from the base",
                            show(anc)
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    /// Run one step. `owners`: give what is created the delta's owner (root only).
    fn run(&self, op: &Op, owners: bool) -> Result<(), String> {
        let base = self.base();
        let r = rel(op.path());
        let io = |e: std::io::Error| format!("{}: {}: {e}", op.describe(), show(op.path()));
        let owner = |o: (u32, u32)| owners.then_some(o);
        match op {
            Op::Remove { dir, .. } => base.remove(r, *dir).map_err(io),
            Op::Mkdir { owner: o, .. } => base
                .mkdir(r, 0o700)
                .and_then(|()| base.chown(r, owner(*o)))
                .map_err(io),
            Op::Write { path, side } => {
                let data = self.content(path, side)?;
                base.write_file(r, &data, side.mode, owner(side.owner))
                    .map_err(io)
            }
            Op::Symlink { path, side } => {
                let target = self.content(path, side)?;
                base.symlink(&target, r)
                    .and_then(|()| base.chown(r, owner(side.owner)))
                    .map_err(io)
            }
            Op::Chmod { mode, .. } => base.chmod(r, *mode).map_err(io),
        }
    }

    /// Run a checked plan, calling `each` before every step; the directories touched are
    /// synced at the end.
    pub fn execute(&self, ops: &[Op], mut each: impl FnMut(&Op)) -> Result<(), String> {
        self.check_plan(ops)?;
        // SAFETY: geteuid has no preconditions.
        let owners = unsafe { libc::geteuid() } == 0;
        let mut dirs = BTreeSet::new();
        for op in ops {
            each(op);
            self.run(op, owners)?;
            dirs.insert(super::parent(op.path()).to_vec());
        }
        for d in dirs {
            // A directory removed later in the plan is gone; nothing to sync then.
            match self.base().sync_dir(rel(&d)) {
                Ok(()) => {}
                Err(e) if crate::sys::beneath::is_missing(&e) => {}
                Err(e) => return Err(format!("sync {}: {e}", show(&d))),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestors_of_a_path() {
        let a: Vec<&[u8]> = ancestors(b"/a/b/c").collect();
        assert_eq!(a, vec![&b"/a"[..], b"/a/b"]);
        assert_eq!(ancestors(b"/a").count(), 0);
    }
}
