//! The fail-closed filesystem policy: from the declared mode and writable roots to the exact
//! writable set of a launch, or a named refusal before anything starts.
//!
//! Rules (SPEC.md, "Sandbox policy"):
//! - a writable root must be absolute and must not contain `..` (refused, never resolved: a
//!   `..` after a symlink would mean something else on disk than on paper);
//! - it must lie inside an allowed root (the project, a writable bind's destination, the home in
//!   `full` mode); containment compares whole path components, so `/srv/wsX` is not inside
//!   `/srv/ws`, while the root itself and the root with a trailing slash are;
//! - it is resolved component by component on the host; a symlink is followed only while its
//!   target stays inside the same allowed root, one that leads out refuses the launch;
//! - one bad root refuses the whole set; `read-only` with writable roots is a contradiction;
//!   writable roots without a mode mean `workspace-write`; `workspace-write` with no root is
//!   refused (nothing writable declared).

use std::path::{Component, Path, PathBuf};

use super::request::{Policy, PolicyMode};

/// A root inside which writes may be granted: where it appears in the view and the host
/// directory behind it (canonical). For the project and the home both are the same path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedRoot {
    pub view: PathBuf,
    pub host: PathBuf,
}

impl AllowedRoot {
    pub fn same(path: PathBuf) -> Self {
        AllowedRoot {
            view: path.clone(),
            host: path,
        }
    }
}

/// Why a policy was refused. Every variant names the offending path.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("writable root {0} is not an absolute path")]
    NotAbsolute(PathBuf),
    #[error("writable root {0} contains `..`; give the path without it")]
    DotDot(PathBuf),
    #[error("writable root {0} lies outside the project and every writable bind")]
    OutsideRoots(PathBuf),
    #[error("writable root {0} resolves through symlink {1} to outside its allowed root")]
    SymlinkEscape(PathBuf, PathBuf),
    #[error("writable root {0} cannot be resolved: {1}")]
    Unresolvable(PathBuf, String),
    #[error("--policy workspace-write declares nothing writable; add --writable-root PATH")]
    Empty,
    #[error("--policy read-only contradicts --writable-root {0}")]
    Contradiction(PathBuf),
}

impl PolicyError {
    /// A stable snake_case name for the refusal.
    pub fn code(&self) -> &'static str {
        self.kind().as_str()
    }

    /// The error code (src/errors.rs).
    pub fn kind(&self) -> crate::errors::Code {
        use crate::errors::Code;
        match self {
            PolicyError::NotAbsolute(_) => Code::PolicyNotAbsolute,
            PolicyError::DotDot(_) => Code::PolicyDotdot,
            PolicyError::OutsideRoots(_) => Code::PolicyOutsideRoots,
            PolicyError::SymlinkEscape(..) => Code::PolicySymlinkEscape,
            PolicyError::Unresolvable(..) => Code::PolicyUnresolvable,
            PolicyError::Empty => Code::PolicyEmpty,
            PolicyError::Contradiction(_) => Code::PolicyContradiction,
        }
    }
}

/// Most symlinks followed while resolving one root (the kernel's own limit).
const MAX_FOLLOWS: usize = 40;

/// The launch's writable set. Without a mode and roots it is every allowed root (the project,
/// writable binds, a `full` home); otherwise exactly the declared roots, each checked.
pub fn decide(
    mode: Option<PolicyMode>,
    roots: &[PathBuf],
    allowed: &[AllowedRoot],
) -> Result<Policy, PolicyError> {
    let mode = match (mode, roots.first()) {
        (Some(PolicyMode::ReadOnly), Some(r)) => return Err(PolicyError::Contradiction(r.clone())),
        (None, None) => {
            return Ok(Policy {
                mode: None,
                writable: allowed.iter().map(|a| a.view.clone()).collect(),
            })
        }
        (None, Some(_)) => PolicyMode::WorkspaceWrite,
        (Some(m), _) => m,
    };
    if mode == PolicyMode::WorkspaceWrite && roots.is_empty() {
        return Err(PolicyError::Empty);
    }
    let mut writable: Vec<PathBuf> = Vec::new();
    for r in roots {
        let w = check_root(r, allowed)?;
        if !writable.contains(&w) {
            writable.push(w);
        }
    }
    Ok(Policy {
        mode: Some(mode),
        writable,
    })
}

/// `path` without `.` components or a trailing slash; None when it has a `..`.
fn normal(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => return None,
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

/// `path` with `..` applied lexically (used for symlink targets only).
fn collapse(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// One writable root, checked and resolved; the result is the path in the view.
pub fn check_root(root: &Path, allowed: &[AllowedRoot]) -> Result<PathBuf, PolicyError> {
    if !root.is_absolute() {
        return Err(PolicyError::NotAbsolute(root.to_path_buf()));
    }
    let lexical = normal(root).ok_or_else(|| PolicyError::DotDot(root.to_path_buf()))?;
    let within = allowed
        .iter()
        .filter(|a| lexical.starts_with(&a.view))
        .max_by_key(|a| a.view.components().count())
        .ok_or_else(|| PolicyError::OutsideRoots(root.to_path_buf()))?;
    let rest = lexical.strip_prefix(&within.view).unwrap_or(Path::new(""));
    let host = resolve_inside(root, &within.host, rest)?;
    let tail = host.strip_prefix(&within.host).unwrap_or(Path::new(""));
    Ok(within.view.join(tail))
}

/// Walk `rest` from `base` on the host, following symlinks only while they stay inside `base`.
/// Components that do not exist yet are taken as written.
fn resolve_inside(root: &Path, base: &Path, rest: &Path) -> Result<PathBuf, PolicyError> {
    let mut pending: Vec<PathBuf> = rest
        .components()
        .rev()
        .map(|c| PathBuf::from(c.as_os_str()))
        .collect();
    let mut cur = base.to_path_buf();
    let mut follows = 0;
    while let Some(name) = pending.pop() {
        let next = cur.join(&name);
        let md = match std::fs::symlink_metadata(&next) {
            Ok(md) => md,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                cur = next;
                continue;
            }
            Err(e) => return Err(PolicyError::Unresolvable(root.to_path_buf(), e.to_string())),
        };
        if !md.file_type().is_symlink() {
            cur = next;
            continue;
        }
        follows += 1;
        if follows > MAX_FOLLOWS {
            return Err(PolicyError::Unresolvable(
                root.to_path_buf(),
                "too many levels of symbolic links".into(),
            ));
        }
        let target = std::fs::read_link(&next)
            .map_err(|e| PolicyError::Unresolvable(root.to_path_buf(), e.to_string()))?;
        let landed = collapse(&cur.join(target));
        let Ok(inside) = landed.strip_prefix(base) else {
            return Err(PolicyError::SymlinkEscape(root.to_path_buf(), next));
        };
        pending.extend(
            inside
                .components()
                .rev()
                .map(|c| PathBuf::from(c.as_os_str())),
        );
        cur = base.to_path_buf();
    }
    Ok(cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    /// A project directory on disk (canonical) with a subdirectory `sub`.
    fn project() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap().join("ws");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        (d, root)
    }

    fn ww(roots: &[PathBuf], allowed: &[AllowedRoot]) -> Result<Policy, PolicyError> {
        decide(Some(PolicyMode::WorkspaceWrite), roots, allowed)
    }

    #[test]
    fn the_root_itself_and_a_trailing_slash_are_inside() {
        let (_d, ws) = project();
        let allowed = [AllowedRoot::same(ws.clone())];
        let slash = PathBuf::from(format!("{}/", ws.display()));
        let pol = ww(&[ws.clone(), slash, ws.join("sub")], &allowed).unwrap();
        assert_eq!(pol.writable, vec![ws.clone(), ws.join("sub")]);
        assert_eq!(pol.mode, Some(PolicyMode::WorkspaceWrite));
    }

    #[test]
    fn a_path_outside_and_a_sibling_sharing_a_prefix_are_outside() {
        let (_d, ws) = project();
        let allowed = [AllowedRoot::same(ws.clone())];
        let sibling = PathBuf::from(format!("{}X", ws.display()));
        for bad in [p("/etc"), sibling, ws.parent().unwrap().to_path_buf()] {
            let e = ww(std::slice::from_ref(&bad), &allowed).unwrap_err();
            assert_eq!(e.code(), "policy_outside_roots", "{bad:?}");
        }
    }

    #[test]
    fn relative_and_dotdot_paths_are_refused() {
        let (_d, ws) = project();
        let allowed = [AllowedRoot::same(ws.clone())];
        let e = ww(&[p("sub")], &allowed).unwrap_err();
        assert_eq!(e.code(), "policy_not_absolute");
        // Even a `..` that would land back inside is refused, not resolved.
        let e = ww(&[ws.join("sub/../sub")], &allowed).unwrap_err();
        assert_eq!(e.code(), "policy_dotdot");
        let e = ww(&[ws.join("..")], &allowed).unwrap_err();
        assert_eq!(e.code(), "policy_dotdot");
    }

    #[test]
    fn a_symlink_pointing_out_refuses_one_staying_in_resolves() {
        let (d, ws) = project();
        let outside = std::fs::canonicalize(d.path()).unwrap().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("out")).unwrap();
        std::os::unix::fs::symlink("../ws2", ws.join("rel_out")).unwrap();
        std::os::unix::fs::symlink("sub", ws.join("in")).unwrap();
        let allowed = [AllowedRoot::same(ws.clone())];
        for bad in [ws.join("out"), ws.join("out/deeper"), ws.join("rel_out")] {
            let e = ww(std::slice::from_ref(&bad), &allowed).unwrap_err();
            assert_eq!(e.code(), "policy_symlink_escape", "{bad:?}");
        }
        let pol = ww(&[ws.join("in/new")], &allowed).unwrap();
        assert_eq!(pol.writable, vec![ws.join("sub/new")]);
    }

    #[test]
    fn a_symlink_loop_is_an_error_not_a_hang() {
        let (_d, ws) = project();
        std::os::unix::fs::symlink("b", ws.join("a")).unwrap();
        std::os::unix::fs::symlink("a", ws.join("b")).unwrap();
        let e = ww(&[ws.join("a")], &[AllowedRoot::same(ws.clone())]).unwrap_err();
        assert_eq!(e.code(), "policy_unresolvable");
    }

    #[test]
    fn one_bad_root_refuses_the_whole_set() {
        let (_d, ws) = project();
        let allowed = [AllowedRoot::same(ws.clone())];
        let e = ww(&[ws.join("sub"), p("/usr"), ws.clone()], &allowed).unwrap_err();
        assert_eq!(e, PolicyError::OutsideRoots(p("/usr")));
    }

    #[test]
    fn an_empty_set_and_contradictions_are_refused() {
        let (_d, ws) = project();
        let allowed = [AllowedRoot::same(ws.clone())];
        assert_eq!(ww(&[], &allowed).unwrap_err(), PolicyError::Empty);
        let e = decide(
            Some(PolicyMode::ReadOnly),
            std::slice::from_ref(&ws),
            &allowed,
        )
        .unwrap_err();
        assert_eq!(e.code(), "policy_contradiction");
        // No allowed root at all: every declared root is outside.
        assert_eq!(
            ww(std::slice::from_ref(&ws), &[]).unwrap_err().code(),
            "policy_outside_roots"
        );
    }

    #[test]
    fn modes_without_roots_and_roots_without_a_mode() {
        let (_d, ws) = project();
        let allowed = [
            AllowedRoot::same(ws.clone()),
            AllowedRoot::same(p("/home/u")),
        ];
        let ro = decide(Some(PolicyMode::ReadOnly), &[], &allowed).unwrap();
        assert!(ro.writable.is_empty());
        let default = decide(None, &[], &allowed).unwrap();
        assert_eq!(default.mode, None);
        assert_eq!(default.writable, vec![ws.clone(), p("/home/u")]);
        let implied = decide(None, &[ws.join("sub")], &allowed).unwrap();
        assert_eq!(implied.mode, Some(PolicyMode::WorkspaceWrite));
        assert_eq!(implied.writable, vec![ws.join("sub")]);
    }

    #[test]
    fn a_root_under_a_bind_resolves_on_the_bind_source() {
        let (d, ws) = project();
        let src = std::fs::canonicalize(d.path()).unwrap().join("cache");
        std::fs::create_dir_all(src.join("real")).unwrap();
        std::os::unix::fs::symlink("real", src.join("link")).unwrap();
        let allowed = [
            AllowedRoot::same(ws.clone()),
            AllowedRoot {
                view: p("/cache"),
                host: src.clone(),
            },
        ];
        let pol = ww(&[p("/cache/link/x")], &allowed).unwrap();
        assert_eq!(pol.writable, vec![p("/cache/real/x")]);
    }
}
