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

/// The operations that turn the base into the overlay view, in execution order. `strict`:
/// refuse a copied-up object whose base object is now of another kind (without `--force`).
pub fn plan(changes: &[Entry], strict: bool) -> Result<Vec<Op>, String> {
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
                if let (true, Source::Delta { origin: true, .. }) = (strict, new.source) {
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
        let owners = crate::sys::ids::is_root();
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

/// A path where the base is no longer what the delta saw (see [`Overlay::conflicts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub path: Vec<u8>,
    /// What changed, in words.
    pub why: String,
    /// Whether `--force` may overwrite it (not for a partial-origin file: its unchanged
    /// chunks were to come from the base version that is gone).
    pub forceable: bool,
}

impl Conflict {
    pub fn describe(&self) -> String {
        format!("conflict {}: {}", show(&self.path), self.why)
    }
}

/// The one-line error of an apply refused for `conflicts` (not empty).
pub fn conflict_error(conflicts: &[Conflict], force: bool) -> String {
    let paths: Vec<String> = conflicts.iter().map(|c| show(&c.path)).collect();
    let hint = if conflicts.iter().all(|c| c.forceable) {
        "; --force overwrites them"
    } else if force {
        "; --force cannot apply a partial-origin file whose base file changed"
    } else {
        ""
    };
    format!(
        "the base changed since the delta saw it at {} path(s): {}; nothing was \
         written{hint}",
        paths.len(),
        paths.join(", ")
    )
}

/// st_mode permission bits.
fn perms(mode: u32) -> u32 {
    mode & 0o7777
}

impl Overlay {
    /// Partial-origin files whose base file no longer matches its recorded fingerprint: their
    /// content cannot be read (so neither diffed nor applied), even with `--force`.
    pub fn stale_partials(&self) -> Vec<Conflict> {
        let mut out: Vec<Conflict> = self
            .snap
            .partial
            .values()
            .filter_map(|po| {
                let why = po.check_base().err()?;
                let path = self
                    .snap
                    .delta
                    .entries
                    .iter()
                    .find(|(_, e)| e.meta.ino.0 as i64 == po.delta_ino)
                    .map_or_else(|| po.base_path.as_bytes().to_vec(), |(p, _)| p.clone());
                Some(Conflict {
                    path,
                    why: format!("partial-origin file over a changed base file ({why})"),
                    forceable: false,
                })
            })
            .collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }

    /// The paths of `changes` where the base now differs from what the delta saw when it
    /// copied, whited out or replaced the object there (`fs_base_seen`): another type or
    /// permission bits, other content (by hash when the copy read it whole, otherwise by
    /// inode, size, mtime and ctime), an object created in the base at a path the delta never
    /// saw one, or one removed from the base that the delta had seen. A delta without
    /// records (older than them) has none to compare: empty.
    pub fn conflicts(&self, changes: &[Entry]) -> Result<Vec<Conflict>, String> {
        let Some(seen) = &self.snap.seen else {
            return Ok(Vec::new());
        };
        // Each path once, with the base side when the base has an object there.
        let mut at: std::collections::BTreeMap<&[u8], Option<&Side>> = Default::default();
        for e in changes {
            let slot = at.entry(e.path.as_slice()).or_default();
            if slot.is_none() {
                *slot = e.old.as_ref();
            }
        }
        let mut out = Vec::new();
        for (path, now) in at {
            let why = match (now, seen.get(path)) {
                (None, None) => None,
                (None, Some(_)) => Some("removed from the base".to_string()),
                (Some(now), None) => Some(format!("a {} was created in the base", now.kind.name())),
                (Some(now), Some(was)) => self.differs(path, now, was)?,
            };
            if let Some(why) = why {
                out.push(Conflict {
                    path: path.to_vec(),
                    why,
                    forceable: true,
                });
            }
        }
        Ok(out)
    }

    /// How base object `now` at `path` differs from the record `was`, if it does.
    fn differs(
        &self,
        path: &[u8],
        now: &Side,
        was: &crate::store::overlay::BaseSeen,
    ) -> Result<Option<String>, String> {
        let kind = Kind::of_mode(was.mode);
        if kind != now.kind {
            return Ok(Some(format!(
                "the {} the delta saw is now a {}",
                kind.name(),
                now.kind.name()
            )));
        }
        if perms(was.mode) != perms(now.mode) {
            return Ok(Some(format!(
                "permissions changed from {:04o} to {:04o}",
                perms(was.mode),
                perms(now.mode)
            )));
        }
        if let Some(hash) = &was.sha256 {
            return Ok((*hash != now.hash).then(|| "content changed".to_string()));
        }
        if kind == Kind::Dir {
            return Ok(None); // its entries are compared one by one
        }
        let Some(st) = self.base_stat(path)? else {
            return Ok(Some("removed from the base".to_string()));
        };
        let r = &st.raw;
        let stamp = |s: i64, n: i64| (s, u32::try_from(n).unwrap_or(0));
        let same = r.st_ino == was.ino
            && u64::try_from(r.st_size).ok() == Some(was.size)
            && stamp(r.st_mtime, r.st_mtime_nsec) == (was.mtime.sec, was.mtime.nsec)
            && stamp(r.st_ctime, r.st_ctime_nsec) == (was.ctime.sec, was.ctime.nsec);
        Ok((!same).then(|| "changed (inode, size, mtime or ctime differ)".to_string()))
    }

    /// What `fs_base_seen` should say after steps at `paths` ran: each path's base object now
    /// (content hashed for files and symlinks), or None where the base has nothing.
    pub fn seen_after<'a>(
        &self,
        paths: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<crate::store::overlay::SeenRows, String> {
        let paths: BTreeSet<&[u8]> = paths.into_iter().collect();
        let mut out = Vec::new();
        for path in paths {
            let seen = match self.base_stat(path)? {
                None => None,
                Some(st) => {
                    let (side, _) = self.base_side(path, &st)?;
                    let mut seen = crate::store::overlay::BaseSeen::of_stat(&st.raw);
                    if matches!(side.kind, Kind::File | Kind::Symlink) {
                        seen.sha256 = Some(side.hash);
                    }
                    Some(seen)
                }
            };
            out.push((path.to_vec(), seen));
        }
        Ok(out)
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
