//! The view as data: an ordered list of mount operations built from a request, applied in order
//! by `view.rs`, and printed as it is in the run record.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::request::{HomeMode, MountBackend, SandboxRequest};

/// What a host path is, as far as the plan cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink(PathBuf),
}

/// Answers what exists on the host (the real file system, or a fake one in unit tests).
pub trait Host {
    fn kind(&self, path: &Path) -> Option<Kind>;
}

/// The host as it is.
pub struct RealHost;

impl Host for RealHost {
    fn kind(&self, path: &Path) -> Option<Kind> {
        let m = std::fs::symlink_metadata(path).ok()?;
        if m.file_type().is_symlink() {
            return std::fs::read_link(path).ok().map(Kind::Symlink);
        }
        Some(if m.is_dir() { Kind::Dir } else { Kind::File })
    }
}

/// One step of building the view. Paths are paths in the view; `src` paths are host paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Op {
    /// A fresh tmpfs (the root, /dev, the private /tmp, an empty home). `owned`: given to the
    /// command's user rather than left to the mounting one.
    Tmpfs {
        path: PathBuf,
        mode: u32,
        owned: bool,
    },
    /// A host tree bound read-only.
    RoBind { src: PathBuf, path: PathBuf },
    /// A host tree bound read-write.
    Bind { src: PathBuf, path: PathBuf },
    /// A symbolic link recreated in the view (`/bin -> usr/bin`).
    Symlink { target: PathBuf, path: PathBuf },
    /// A fresh proc of the sandbox's pid namespace.
    Proc { path: PathBuf },
    /// A host device node bound at the same path.
    DevNode { path: PathBuf },
    /// A private devpts instance.
    Devpts { path: PathBuf },
    /// The project, served by our server from its delta over the host directory.
    Fuse { path: PathBuf },
    /// The project as kernel overlayfs: the host directory at `path` under the `upper` (and
    /// `work`) directory the delta was exported into (host paths).
    Overlayfs {
        path: PathBuf,
        upper: PathBuf,
        work: PathBuf,
    },
    /// An empty read-only file over a file.
    MaskFile { path: PathBuf },
    /// An empty read-only directory over a directory.
    MaskDir { path: PathBuf },
    /// A writable root bound onto itself, so it can stay writable under a read-only parent.
    SelfBind { path: PathBuf },
    /// Every mount of the view made read-only.
    ReadOnly { path: PathBuf },
    /// One mount made writable again (a writable root, the private /tmp, /var/tmp, /dev/shm).
    Writable { path: PathBuf },
}

impl Op {
    pub fn path(&self) -> &Path {
        match self {
            Op::Tmpfs { path, .. }
            | Op::RoBind { path, .. }
            | Op::Bind { path, .. }
            | Op::Symlink { path, .. }
            | Op::Proc { path }
            | Op::DevNode { path }
            | Op::Devpts { path }
            | Op::Fuse { path }
            | Op::Overlayfs { path, .. }
            | Op::MaskFile { path }
            | Op::MaskDir { path }
            | Op::SelfBind { path }
            | Op::ReadOnly { path }
            | Op::Writable { path } => path,
        }
    }

    /// The operation's name as the record and errors print it.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Tmpfs { .. } => "tmpfs",
            Op::RoBind { .. } => "ro-bind",
            Op::Bind { .. } => "bind",
            Op::Symlink { .. } => "symlink",
            Op::Proc { .. } => "proc",
            Op::DevNode { .. } => "dev-node",
            Op::Devpts { .. } => "devpts",
            Op::Fuse { .. } => "fuse",
            Op::Overlayfs { .. } => "overlayfs",
            Op::MaskFile { .. } => "mask-file",
            Op::MaskDir { .. } => "mask-dir",
            Op::SelfBind { .. } => "self-bind",
            Op::ReadOnly { .. } => "read-only",
            Op::Writable { .. } => "writable",
        }
    }
}

/// Every operation's name, and "setup" for the steps around them.
const NAMES: [&str; 15] = [
    "tmpfs",
    "ro-bind",
    "bind",
    "symlink",
    "proc",
    "dev-node",
    "devpts",
    "fuse",
    "overlayfs",
    "mask-file",
    "mask-dir",
    "self-bind",
    "read-only",
    "writable",
    "setup",
];

/// The static name of an operation named `s` (read back from a process of the sandbox).
pub fn op_name(s: &str) -> &'static str {
    NAMES.iter().find(|n| **n == s).copied().unwrap_or("setup")
}

/// The system trees shown read-only (symlinks among them recreated as symlinks).
pub const SYSTEM: [&str; 9] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

/// Device nodes bound from the host.
pub const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// The private trees that stay writable whatever the policy.
pub const PRIVATE: [&str; 3] = ["/tmp", "/var/tmp", "/dev/shm"];

/// Whether `path` is `root` or lies below it, by whole components.
pub fn inside(path: &Path, root: &Path) -> bool {
    path.starts_with(root)
}

fn depth(p: &Path) -> usize {
    p.components().count()
}

/// The ordered operations that build the view of `req`.
pub fn build(req: &SandboxRequest, host: &dyn Host) -> Vec<Op> {
    let p = PathBuf::from;
    let mut ops = vec![Op::Tmpfs {
        path: p("/"),
        mode: 0o755,
        owned: false,
    }];
    // Trees whose content the view shows from the host: (view path, host path).
    let mut windows: Vec<(PathBuf, PathBuf)> = Vec::new();
    for s in SYSTEM {
        match host.kind(Path::new(s)) {
            Some(Kind::Symlink(target)) => ops.push(Op::Symlink { target, path: p(s) }),
            Some(Kind::Dir) => {
                ops.push(Op::RoBind {
                    src: p(s),
                    path: p(s),
                });
                windows.push((p(s), p(s)));
            }
            _ => {}
        }
    }
    ops.push(Op::Proc { path: p("/proc") });
    if host.kind(Path::new("/sys")) == Some(Kind::Dir) {
        ops.push(Op::RoBind {
            src: p("/sys"),
            path: p("/sys"),
        });
    }
    ops.push(Op::Tmpfs {
        path: p("/dev"),
        mode: 0o755,
        owned: false,
    });
    for d in DEVICES {
        ops.push(Op::DevNode {
            path: Path::new("/dev").join(d),
        });
    }
    ops.push(Op::Devpts {
        path: p("/dev/pts"),
    });
    for (target, path) in [
        ("pts/ptmx", "/dev/ptmx"),
        ("/proc/self/fd", "/dev/fd"),
        ("/proc/self/fd/0", "/dev/stdin"),
        ("/proc/self/fd/1", "/dev/stdout"),
        ("/proc/self/fd/2", "/dev/stderr"),
    ] {
        ops.push(Op::Symlink {
            target: p(target),
            path: p(path),
        });
    }
    for t in PRIVATE {
        ops.push(Op::Tmpfs {
            path: p(t),
            mode: 0o1777,
            owned: false,
        });
    }
    let home = &req.home_dir;
    if home.is_absolute() && depth(home) > 1 {
        match req.home {
            HomeMode::Full => ops.push(Op::Bind {
                src: home.clone(),
                path: home.clone(),
            }),
            HomeMode::FullRo => ops.push(Op::RoBind {
                src: home.clone(),
                path: home.clone(),
            }),
            HomeMode::Empty => ops.push(Op::Tmpfs {
                path: home.clone(),
                mode: 0o700,
                owned: true,
            }),
        }
        if req.home != HomeMode::Empty {
            windows.push((home.clone(), home.clone()));
        }
    }
    let mut binds = req.binds.clone();
    binds.sort_by_key(|b| depth(&b.dst));
    for b in binds {
        windows.retain(|(v, _)| !inside(v, &b.dst));
        windows.push((b.dst.clone(), b.src.clone()));
        ops.push(if b.writable {
            Op::Bind {
                src: b.src,
                path: b.dst,
            }
        } else {
            Op::RoBind {
                src: b.src,
                path: b.dst,
            }
        });
    }
    ops.push(match req.backend {
        MountBackend::Fuse => Op::Fuse {
            path: req.source.clone(),
        },
        MountBackend::Overlayfs => Op::Overlayfs {
            path: req.source.clone(),
            upper: super::upperdir::upper_dir(&req.project_dir),
            work: super::upperdir::work_dir(&req.project_dir),
        },
    });
    windows.retain(|(v, _)| !inside(v, &req.source));
    windows.push((req.source.clone(), req.source.clone()));
    // A mask shows only where the view shows host content; the deepest window decides.
    for m in &req.masks {
        let Some((view, src)) = windows
            .iter()
            .filter(|(v, _)| inside(m, v))
            .max_by_key(|(v, _)| depth(v))
        else {
            continue;
        };
        let Ok(rel) = m.strip_prefix(view) else {
            continue;
        };
        let host_path = if rel.as_os_str().is_empty() {
            src.clone()
        } else {
            src.join(rel)
        };
        match host.kind(&host_path) {
            Some(Kind::Dir) => ops.push(Op::MaskDir { path: m.clone() }),
            Some(Kind::File) => ops.push(Op::MaskFile { path: m.clone() }),
            // A mount over a symlink would land on its target: the link itself stays, and
            // where it points is masked or outside the view.
            _ => {}
        }
    }
    let mut roots = req.policy.writable.clone();
    roots.sort_by_key(|r| depth(r));
    roots.dedup();
    for r in &roots {
        ops.push(Op::SelfBind { path: r.clone() });
    }
    ops.push(Op::ReadOnly { path: p("/") });
    // proc stays as the kernel guards it: a nested user namespace writes its uid_map there.
    ops.push(Op::Writable { path: p("/proc") });
    for t in PRIVATE {
        ops.push(Op::Writable { path: p(t) });
    }
    // A writable set that does not cover the project is fenced by the server, which sees and
    // logs what it refuses: the project's mount stays writable for it to do so. Overlayfs has
    // no server: its mount stays read-only and the kernel refuses (unlogged).
    if req.backend == MountBackend::Fuse && req.policy.project_roots(&req.source).is_some() {
        ops.push(Op::Writable {
            path: req.source.clone(),
        });
    }
    for r in roots {
        ops.push(Op::Writable { path: r });
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::request::{Bind, Net, Policy, PolicyMode};
    use std::collections::HashMap;

    struct Fake(HashMap<PathBuf, Kind>);

    impl Host for Fake {
        fn kind(&self, path: &Path) -> Option<Kind> {
            self.0.get(path).cloned()
        }
    }

    fn host() -> Fake {
        let mut m = HashMap::new();
        for d in [
            "/usr",
            "/etc",
            "/lib",
            "/sys",
            "/home/u",
            "/home/u/.ssh",
            "/srv/data",
        ] {
            m.insert(PathBuf::from(d), Kind::Dir);
        }
        m.insert(PathBuf::from("/bin"), Kind::Symlink("usr/bin".into()));
        m.insert(PathBuf::from("/home/u/.netrc"), Kind::File);
        m.insert(PathBuf::from("/srv/data/secret"), Kind::File);
        m.insert(PathBuf::from("/srv/p/.env"), Kind::File);
        Fake(m)
    }

    fn request() -> SandboxRequest {
        SandboxRequest {
            project: "p".into(),
            project_dir: "/home/u/.agentfs/p".into(),
            source: "/srv/p".into(),
            db: "/home/u/.agentfs/p/delta.db".into(),
            command: vec!["true".into()],
            cwd: "/srv/p".into(),
            home_dir: "/home/u".into(),
            home: HomeMode::FullRo,
            masks: vec![
                "/home/u/.ssh".into(),
                "/home/u/.netrc".into(),
                "/home/u/.aws".into(),
                "/srv/p/.env".into(),
                "/srv/mnt/secret".into(),
            ],
            binds: vec![Bind {
                src: "/srv/data".into(),
                dst: "/srv/mnt".into(),
                writable: true,
            }],
            policy: Policy {
                mode: None,
                writable: vec!["/srv/p".into(), "/srv/mnt".into()],
            },
            refuse_escaping_symlinks: false,
            net: Net::Host,
            env: vec![],
            replicate: None,
            backend: MountBackend::Fuse,
            backend_reason: String::new(),
        }
    }

    fn pos(ops: &[Op], want: &Op) -> usize {
        ops.iter()
            .position(|o| o == want)
            .unwrap_or_else(|| panic!("{want:?} missing from {ops:#?}"))
    }

    #[test]
    fn system_trees_are_read_only_and_symlinks_stay_symlinks() {
        let ops = build(&request(), &host());
        assert_eq!(ops[0].name(), "tmpfs");
        assert_eq!(ops[0].path(), Path::new("/"));
        pos(
            &ops,
            &Op::RoBind {
                src: "/usr".into(),
                path: "/usr".into(),
            },
        );
        pos(
            &ops,
            &Op::Symlink {
                target: "usr/bin".into(),
                path: "/bin".into(),
            },
        );
        // Absent trees are skipped, never invented.
        assert!(!ops.iter().any(|o| o.path() == Path::new("/opt")));
        // No /dev/fuse inside.
        assert!(!ops.iter().any(|o| o.path() == Path::new("/dev/fuse")));
    }

    #[test]
    fn masks_take_the_type_of_what_they_cover_and_skip_what_is_not_shown() {
        let ops = build(&request(), &host());
        pos(
            &ops,
            &Op::MaskDir {
                path: "/home/u/.ssh".into(),
            },
        );
        pos(
            &ops,
            &Op::MaskFile {
                path: "/home/u/.netrc".into(),
            },
        );
        pos(
            &ops,
            &Op::MaskFile {
                path: "/srv/p/.env".into(),
            },
        );
        // Through the bind: /srv/mnt/secret is /srv/data/secret on the host.
        pos(
            &ops,
            &Op::MaskFile {
                path: "/srv/mnt/secret".into(),
            },
        );
        assert!(!ops.iter().any(|o| o.path() == Path::new("/home/u/.aws")));
    }

    #[test]
    fn an_empty_home_shows_nothing_of_the_user_and_needs_no_masks() {
        let mut req = request();
        req.home = HomeMode::Empty;
        let ops = build(&req, &host());
        pos(
            &ops,
            &Op::Tmpfs {
                path: "/home/u".into(),
                mode: 0o700,
                owned: true,
            },
        );
        assert!(!ops.iter().any(|o| o.path().starts_with("/home/u/.ssh")));
    }

    #[test]
    fn the_order_puts_the_project_over_binds_and_masks_over_the_project() {
        let ops = build(&request(), &host());
        let home = pos(
            &ops,
            &Op::RoBind {
                src: "/home/u".into(),
                path: "/home/u".into(),
            },
        );
        let bind = pos(
            &ops,
            &Op::Bind {
                src: "/srv/data".into(),
                path: "/srv/mnt".into(),
            },
        );
        let fuse = pos(
            &ops,
            &Op::Fuse {
                path: "/srv/p".into(),
            },
        );
        let mask = pos(
            &ops,
            &Op::MaskFile {
                path: "/srv/p/.env".into(),
            },
        );
        let tmp = pos(
            &ops,
            &Op::Tmpfs {
                path: "/tmp".into(),
                mode: 0o1777,
                owned: false,
            },
        );
        assert!(tmp < home && home < bind && bind < fuse && fuse < mask);
    }

    #[test]
    fn only_the_writable_roots_and_private_trees_are_writable_after_the_read_only_step() {
        let mut req = request();
        req.policy = Policy {
            mode: Some(PolicyMode::WorkspaceWrite),
            writable: vec!["/srv/p/src".into(), "/srv/p".into()],
        };
        let ops = build(&req, &host());
        let ro = pos(&ops, &Op::ReadOnly { path: "/".into() });
        let outer = pos(
            &ops,
            &Op::SelfBind {
                path: "/srv/p".into(),
            },
        );
        let inner = pos(
            &ops,
            &Op::SelfBind {
                path: "/srv/p/src".into(),
            },
        );
        assert!(outer < inner && inner < ro, "outer roots are bound first");
        let writable = writable_after(&ops);
        assert_eq!(
            writable,
            [
                "/proc",
                "/tmp",
                "/var/tmp",
                "/dev/shm",
                "/srv/p",
                "/srv/p/src"
            ]
            .map(Path::new)
            .to_vec()
        );
        // The writable bind is not a root under this policy: it stays read-only.
        assert!(!writable.contains(&Path::new("/srv/mnt")));
    }

    /// Writable mounts after the read-only step.
    fn writable_after(ops: &[Op]) -> Vec<&Path> {
        let ro = pos(ops, &Op::ReadOnly { path: "/".into() });
        ops[ro..]
            .iter()
            .filter(|o| matches!(o, Op::Writable { .. }))
            .map(|o| o.path())
            .collect()
    }

    #[test]
    fn a_read_only_policy_leaves_the_private_trees_writable_and_the_project_to_its_server() {
        let mut req = request();
        req.policy = Policy {
            mode: Some(PolicyMode::ReadOnly),
            writable: vec![],
        };
        let ops = build(&req, &host());
        assert!(!ops.iter().any(|o| matches!(o, Op::SelfBind { .. })));
        assert_eq!(
            writable_after(&ops),
            ["/proc", "/tmp", "/var/tmp", "/dev/shm", "/srv/p"].map(Path::new)
        );
    }

    #[test]
    fn roots_inside_the_project_leave_its_mount_to_its_server() {
        let mut req = request();
        req.policy = Policy {
            mode: Some(PolicyMode::WorkspaceWrite),
            writable: vec!["/srv/p/src".into()],
        };
        let ops = build(&req, &host());
        assert_eq!(
            writable_after(&ops),
            [
                "/proc",
                "/tmp",
                "/var/tmp",
                "/dev/shm",
                "/srv/p",
                "/srv/p/src"
            ]
            .map(Path::new)
        );
        // A root that holds the project: nothing to fence, the mount is a root like others.
        req.policy.writable = vec!["/srv".into()];
        assert_eq!(req.policy.project_roots(&req.source), None);
        assert_eq!(
            writable_after(&build(&req, &host())),
            ["/proc", "/tmp", "/var/tmp", "/dev/shm", "/srv"].map(Path::new)
        );
        req.policy.writable = vec!["/srv/p/src".into(), "/srv/mnt".into()];
        assert_eq!(
            req.policy.project_roots(&req.source),
            Some(vec![PathBuf::from("/src")])
        );
    }

    #[test]
    fn overlayfs_mounts_the_exported_upper_and_keeps_a_fenced_project_read_only() {
        let mut req = request();
        req.backend = MountBackend::Overlayfs;
        req.policy = Policy {
            mode: Some(PolicyMode::WorkspaceWrite),
            writable: vec!["/srv/p/src".into()],
        };
        let ops = build(&req, &host());
        let ovl = pos(
            &ops,
            &Op::Overlayfs {
                path: "/srv/p".into(),
                upper: "/home/u/.agentfs/p/upper".into(),
                work: "/home/u/.agentfs/p/work".into(),
            },
        );
        let mask = pos(
            &ops,
            &Op::MaskFile {
                path: "/srv/p/.env".into(),
            },
        );
        assert!(ovl < mask);
        assert!(!ops.iter().any(|o| matches!(o, Op::Fuse { .. })));
        // No server to fence the project: only the root is writable again.
        assert_eq!(
            writable_after(&ops),
            ["/proc", "/tmp", "/var/tmp", "/dev/shm", "/srv/p/src"].map(Path::new)
        );
    }

    #[test]
    fn containment_is_by_components() {
        assert!(inside(Path::new("/srv/ws"), Path::new("/srv/ws")));
        assert!(inside(Path::new("/srv/ws/"), Path::new("/srv/ws")));
        assert!(inside(Path::new("/srv/ws/a"), Path::new("/srv/ws")));
        assert!(!inside(Path::new("/srv/wsX"), Path::new("/srv/ws")));
    }
}
