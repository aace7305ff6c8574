//! What a sandbox launch asks for, fully resolved: every path absolute, defaults, the project's
//! config.toml and the command line merged, the filesystem policy validated. The view is built
//! from this and nothing else.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Set in the command's environment to the project's name: how a program knows it runs in a
/// sandbox. A marker we set, not a knob anything reads.
pub const SANDBOX_ENV: &str = "AGENTFS_SANDBOX";

/// One launch of a command in a project's sandbox.
#[derive(Debug, Clone)]
pub struct SandboxRequest {
    /// The project's name (the prompt prefix and `AGENTFS_SANDBOX`).
    pub project: String,
    /// The project's own directory (`~/.agentfs/<name>`): run records and the live marker go here.
    pub project_dir: PathBuf,
    /// The real directory the project overlays, canonical; the view serves it at this path.
    pub source: PathBuf,
    /// The project's delta database (an overlay database whose base is `source`).
    pub db: PathBuf,
    /// The command and its arguments; empty runs the user's shell with a `[name]` prompt.
    pub command: Vec<OsString>,
    /// Where the command starts: the caller's directory when it lies inside `source`, else
    /// `source`.
    pub cwd: PathBuf,
    /// The user's home directory on the host, and how the view shows it.
    pub home_dir: PathBuf,
    pub home: HomeMode,
    /// Paths shown as an empty read-only file or directory of the same type (absolute; those that
    /// do not exist are skipped).
    pub masks: Vec<PathBuf>,
    /// Host paths bound into the view.
    pub binds: Vec<Bind>,
    /// The filesystem policy, already validated (see [`Policy`]).
    pub policy: Policy,
    /// Refuse symlinks made in the project whose target resolves outside it (opt-in; off by
    /// default, virtualenvs make absolute ones).
    pub refuse_escaping_symlinks: bool,
    pub net: Net,
    /// The command's whole environment (the scrubbed baseline plus `--env`), in order.
    pub env: Vec<(OsString, OsString)>,
    /// Where the project's databases are replicated for the sandbox's lifetime (`--replicate`,
    /// or `[replicate] url` of config.toml), if anywhere.
    pub replicate: Option<crate::replica::ReplicaUrl>,
    /// What serves the project at its real path (docs/sandbox.md, Mount backends).
    pub backend: MountBackend,
    /// Why that backend (recorded in the run record): the project's config.toml, the flag,
    /// or what `auto` tried.
    pub backend_reason: String,
}

/// What serves the project's view inside the sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MountBackend {
    /// Our FUSE server over the delta (the default).
    #[default]
    Fuse,
    /// Kernel overlayfs: the delta exported into an upper directory at launch and imported
    /// back at the end (src/sandbox/upperdir.rs).
    Overlayfs,
}

impl MountBackend {
    pub fn as_str(self) -> &'static str {
        match self {
            MountBackend::Fuse => "fuse",
            MountBackend::Overlayfs => "overlayfs",
        }
    }
}

/// How the user's home appears in the view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HomeMode {
    /// The real home, read-write.
    Full,
    /// The real home, read-only.
    FullRo,
    /// A private, empty home (a tmpfs) with nothing of the user's.
    Empty,
}

/// A host path bound into the view at `dst` (the same path unless given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub src: PathBuf,
    pub dst: PathBuf,
    pub writable: bool,
}

/// The network the command sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    /// The host's network (no network namespace).
    Host,
    /// A new network namespace with only loopback up.
    None,
}

/// Where the command may write. `writable` is the exact set of writable roots; everything else
/// in the view is read-only (EROFS) apart from the private /tmp, /var/tmp and /dev/shm.
///
/// Without `--policy` the set is the project, every writable bind and (home mode `full`) the
/// home. With `--policy workspace-write` it is exactly the declared `--writable-root` paths,
/// each inside the project or a writable bind. With `--policy read-only` it is empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The declared mode; None when no `--policy` was given.
    pub mode: Option<PolicyMode>,
    pub writable: Vec<PathBuf>,
}

impl Policy {
    /// The writable sub-trees of the project at `source` as paths of its mount ("/src"), which
    /// the server fences (docs/sandbox.md); None when the whole project is writable (a root is
    /// the project or holds it).
    pub fn project_roots(&self, source: &Path) -> Option<Vec<PathBuf>> {
        if self.writable.iter().any(|r| source.starts_with(r)) {
            return None;
        }
        let roots = self
            .writable
            .iter()
            .filter_map(|r| r.strip_prefix(source).ok())
            .map(|rel| Path::new("/").join(rel))
            .collect();
        Some(roots)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyMode {
    ReadOnly,
    WorkspaceWrite,
}
