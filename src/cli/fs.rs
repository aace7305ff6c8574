//! `agentfs fs DB ls|cat|stat|write|mkdir|rm PATH`: offline access through the store. Safe while
//! the database is mounted (SQLite serialises the writers); the server notices the commit within
//! `AGENTFS_EXTERNAL_POLL_MS` and invalidates its caches and the kernel's. `rm` while mounted
//! keeps unlink-while-open intact: the removed inode stays as an orphan (nlink 0) and the
//! server reaps it once the kernel no longer references it.

use std::io::{Read as _, Write as _};
use std::path::PathBuf;

use crate::errno::Errno;
use crate::store::{Attr, Caller, Ino, Liveness, NoReferences, ServerReaps, SetAttr, Store};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The database.
    pub db: PathBuf,
    #[command(subcommand)]
    pub op: Op,
}

#[derive(clap::Subcommand, Debug)]
pub enum Op {
    /// List a directory.
    Ls { path: String },
    /// Write a file's bytes to standard output.
    Cat { path: String },
    /// Show a file's attributes.
    Stat { path: String },
    /// Replace a file's content with standard input (created when absent).
    Write { path: String },
    /// Create a directory.
    Mkdir { path: String },
    /// Remove a file or an empty directory.
    Rm { path: String },
}

fn split_parent(path: &str) -> Result<(&str, &str), String> {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        Some((_, "")) | None => Err(format!("{path}: need an absolute path below /")),
        Some(("", name)) => Ok(("/", name)),
        Some((parent, name)) => Ok((parent, name)),
    }
}

fn caller() -> Caller {
    let (uid, gid) = crate::sys::ids::effective();
    Caller { uid, gid }
}

fn err(path: &str) -> impl Fn(Errno) -> super::CliError + '_ {
    move |e| super::CliError::new(super::Code::of_errno(e.0), format!("{path}: {e}")).at(path)
}

pub fn run(a: Args) -> super::CliResult {
    let readonly = matches!(a.op, Op::Ls { .. } | Op::Cat { .. } | Op::Stat { .. });
    let store = Store::open(&a.db, readonly)?;
    match &a.op {
        Op::Ls { path } => {
            let ino = store.resolve(path.as_bytes()).map_err(err(path))?;
            let mut offset = 0;
            let mut out = std::io::stdout().lock();
            loop {
                let batch = store.readdir(ino, offset, 512).map_err(err(path))?;
                if batch.is_empty() {
                    break;
                }
                for e in &batch {
                    offset = e.offset;
                    if e.name != b"." && e.name != b".." {
                        let _ = out.write_all(&e.name);
                        let _ = out.write_all(if e.kind == libc::S_IFDIR {
                            b"/\n"
                        } else {
                            b"\n"
                        });
                    }
                }
            }
        }
        Op::Cat { path } => {
            let ino = store.resolve(path.as_bytes()).map_err(err(path))?;
            let size = store.getattr(ino).map_err(err(path))?.size;
            let mut out = std::io::stdout().lock();
            let mut off = 0;
            while off < size {
                let chunk = store.read(ino, off, 1 << 20).map_err(err(path))?;
                if chunk.is_empty() {
                    break;
                }
                off += chunk.len() as u64;
                out.write_all(&chunk).map_err(|e| e.to_string())?;
            }
        }
        Op::Stat { path } => {
            let ino = store.resolve(path.as_bytes()).map_err(err(path))?;
            print_stat(&store.getattr(ino).map_err(err(path))?);
        }
        Op::Write { path } => {
            let mut data = Vec::new();
            std::io::stdin()
                .read_to_end(&mut data)
                .map_err(|e| e.to_string())?;
            let ino = match store.resolve(path.as_bytes()) {
                Ok(ino) => ino,
                Err(e) if e == Errno::ENOENT => {
                    let (parent, name) = split_parent(path)?;
                    let p = store.resolve(parent.as_bytes()).map_err(err(parent))?;
                    match store.mknod(p, name.as_bytes(), libc::S_IFREG | 0o644, 0, caller()) {
                        Ok(a) => a.ino,
                        // A mounted server committed the same name since we looked.
                        Err(e) if e == Errno::EEXIST => {
                            store.resolve(path.as_bytes()).map_err(err(path))?
                        }
                        Err(e) => return Err(err(path)(e)),
                    }
                }
                Err(e) => return Err(err(path)(e)),
            };
            let truncate = SetAttr {
                size: Some(0),
                ..Default::default()
            };
            store.setattr(ino, &truncate).map_err(err(path))?;
            let mut off = 0u64;
            for piece in data.chunks(1 << 20) {
                store.write(ino, off, piece).map_err(err(path))?;
                off += piece.len() as u64;
            }
            store.sync().map_err(err(path))?;
        }
        Op::Mkdir { path } => {
            let (parent, name) = split_parent(path)?;
            let p = store.resolve(parent.as_bytes()).map_err(err(parent))?;
            store
                .mkdir(p, name.as_bytes(), 0o755, caller())
                .map_err(err(path))?;
            store.sync().map_err(err(path))?;
        }
        Op::Rm { path } => {
            let (parent, name) = split_parent(path)?;
            let p = store.resolve(parent.as_bytes()).map_err(err(parent))?;
            let target = store.lookup(p, name.as_bytes()).map_err(err(path))?;
            // Decided by taking the server lock, held until the removal is durable: with no
            // server, none can start meanwhile (one that starts later reaps orphans at start).
            let offline = crate::sys::lock::offline(&a.db)?;
            let live: &dyn Liveness = match offline {
                crate::sys::lock::Offline::Served => &ServerReaps,
                crate::sys::lock::Offline::Alone(_) => &NoReferences,
            };
            if target.mode & libc::S_IFMT == libc::S_IFDIR {
                store.rmdir(p, name.as_bytes(), live).map_err(err(path))?;
            } else {
                store.unlink(p, name.as_bytes(), live).map_err(err(path))?;
            }
            store.sync().map_err(err(path))?;
        }
    }
    Ok(0)
}

fn print_stat(a: &Attr) {
    let Ino(ino) = a.ino;
    println!("ino: {ino}");
    println!("mode: {:o}", a.mode);
    println!("nlink: {}", a.nlink);
    println!("uid: {}  gid: {}", a.uid, a.gid);
    println!("size: {}  blocks: {}", a.size, a.blocks);
    println!("atime: {}.{:09}", a.atime.sec, a.atime.nsec);
    println!("mtime: {}.{:09}", a.mtime.sec, a.mtime.nsec);
    println!("ctime: {}.{:09}", a.ctime.sec, a.ctime.nsec);
    if a.rdev != 0 {
        println!("rdev: {}", a.rdev);
    }
}
