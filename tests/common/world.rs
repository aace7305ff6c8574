//! A scratch world for project and sandbox tests: a home, source directories, and agentfs run
//! in it as root or as an ordinary user.

use std::fs;
use std::os::unix::fs::{chown, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use super::scratch_root;
use serde_json::Value;

pub const USER: u32 = 65534;

/// A scratch tree with a home and a source directory, and the agentfs command run in it as
/// root or as `USER`, with HOME pointing into it (projects go to the default ~/.agentfs).
pub struct World {
    _tmp: tempfile::TempDir,
    pub base: PathBuf,
    pub home: PathBuf,
    pub user: Option<u32>,
    /// An ordinary user's world needs /dev/fuse open to every user while it lives.
    _dev_fuse: Option<super::DevFuseMode>,
}

impl World {
    pub fn new(user: Option<u32>) -> Self {
        Self::with_fuse(user, true)
    }

    /// A world whose ordinary user is not given /dev/fuse (hold [`super::DevFuseClosed`] to
    /// keep other tests from opening it meanwhile).
    pub fn without_dev_fuse(user: Option<u32>) -> Self {
        Self::with_fuse(user, false)
    }

    fn with_fuse(user: Option<u32>, open: bool) -> Self {
        let tmp = tempfile::tempdir_in(scratch_root()).unwrap();
        let base = fs::canonicalize(tmp.path()).unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).unwrap();
        let home = base.join("home");
        fs::create_dir(&home).unwrap();
        let w = World {
            _tmp: tmp,
            base,
            home,
            user,
            _dev_fuse: user.filter(|_| open).map(|_| super::DevFuseMode::open_up()),
        };
        w.own(&w.base.clone());
        w.own(&w.home.clone());
        w
    }

    /// Give `p` to the world's user.
    pub fn own(&self, p: &Path) {
        if let Some(u) = self.user {
            chown(p, Some(u), Some(u)).unwrap();
        }
    }

    /// A directory under the world, owned by its user, with one file.
    pub fn source(&self, rel: &str) -> PathBuf {
        let d = self.base.join(rel);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("README"), b"hello\n").unwrap();
        for p in [d.clone(), d.join("README")] {
            self.own(&p);
        }
        self.own(d.parent().unwrap());
        d
    }

    pub fn root(&self) -> PathBuf {
        self.home.join(".agentfs")
    }

    /// `program` with `args`, run in the world (its base as working directory, its home, its
    /// user), standard input empty.
    pub fn command(&self, program: &Path, args: &[&str]) -> Command {
        if program == super::bin() && matches!(args.first(), Some(&("quick" | "run" | "exec"))) {
            self.for_the_command();
        }
        let mut c = Command::new(program);
        c.args(args)
            .current_dir(&self.base)
            .env("HOME", &self.home)
            .env_remove("AGENTFS_PROJECTS_DIR")
            .stdin(Stdio::null());
        if let Some(u) = self.user {
            c.uid(u).gid(u).env_remove("XDG_RUNTIME_DIR");
        }
        c
    }

    /// Before a root-started launch on overlayfs, which does not squash owners (docs/sandbox.md):
    /// the world's files outside its home go to the user the command runs as, as a FUSE server
    /// presents them, so that what the command may write is the same on both backends.
    fn for_the_command(&self) {
        if self.user.is_some() || super::backend() != "overlayfs" {
            return;
        }
        let mut stack = vec![self.base.clone()];
        while let Some(p) = stack.pop() {
            if p == self.home {
                continue;
            }
            let _ = std::os::unix::fs::lchown(&p, Some(USER), Some(USER));
            if p.is_dir() && !p.is_symlink() {
                stack.extend(
                    fs::read_dir(&p)
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|e| e.path()),
                );
            }
        }
    }

    pub fn cmd(&self, program: &Path, args: &[&str]) -> Output {
        self.command(program, args).output().unwrap()
    }

    pub fn af(&self, args: &[&str]) -> Output {
        self.cmd(&super::bin(), args)
    }
}

pub fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A refusal: exit status `status`, one line on stderr carrying `code`.
pub fn refused(o: &Output, status: i32, code: &str) {
    let e = err(o);
    assert_eq!(o.status.code(), Some(status), "{e}");
    assert!(e.contains(&format!("agentfs: {code}: ")), "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");
}

/// The failure `o` reports: exit `status`, its last line on stderr one JSON object with class
/// `code` (a notice such as "project made" may come before it).
pub fn failed(o: &Output, status: i32, code: &str) -> Value {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(status), "{err}");
    let last = err.trim_end().lines().last().unwrap_or("");
    let v: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {err}"));
    assert_eq!(v.as_object().unwrap().len(), 1, "{err}");
    let e = &v["error"];
    assert_eq!(e["code"], code, "{err}");
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{err}"
    );
    assert!(e["detail"].is_null() || e["detail"].is_string(), "{err}");
    assert!(e["path"].is_null() || e["path"].is_string(), "{err}");
    assert_eq!(e.as_object().unwrap().len(), 4, "{err}");
    e.clone()
}

/// `o` failed with class `code` and fine code `detail`.
pub fn failed_with(o: &Output, status: i32, code: &str, detail: &str) -> Value {
    let e = failed(o, status, code);
    assert_eq!(e["detail"], detail, "{e}");
    e
}

/// The warnings of a command run with `--json` whose own output on stderr is none: every line
/// of its stderr is one object `{"warning": {"code", "detail", "message", "path"}}` (or the
/// last, on failure, the error object); returns the warnings' bodies.
pub fn warnings(o: &Output) -> Vec<Value> {
    let e = err(o);
    let mut out = Vec::new();
    for line in e.lines() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|x| panic!("a line that is not JSON under --json ({x}): {line}\n{e}"));
        let o = v
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {line}"));
        assert_eq!(o.len(), 1, "{line}");
        if o.contains_key("error") {
            continue;
        }
        let w = &v["warning"];
        assert!(w["code"].is_string(), "{line}");
        assert!(
            w["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{line}"
        );
        assert!(w["detail"].is_null() || w["detail"].is_string(), "{line}");
        assert!(w["path"].is_null() || w["path"].is_string(), "{line}");
        assert_eq!(w.as_object().unwrap().len(), 4, "{line}");
        out.push(w.clone());
    }
    out
}

/// A launch ran its command, which exited 0.
pub fn launched(o: &Output) {
    assert!(o.status.success(), "status {:?}: {}", o.status, err(o));
}

/// The projects `status --json` lists, as (name, source).
pub fn listed(w: &World) -> Vec<(String, String)> {
    let out = w.af(&["status", "--json"]);
    assert!(out.status.success(), "{}", err(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["source"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Whether an ordinary user can run the test binary here.
pub fn user_can_run(test: &str) -> bool {
    let ok = super::readable_by_all(&super::bin()) && super::readable_by_all(&scratch_root());
    if !ok {
        eprintln!("SKIP {test}: the build tree is not reachable by other users");
        assert!(
            !agentfs::knobs::get().require_fuse,
            "the build tree must be world-readable"
        );
    }
    ok && agentfs::sys::ids::is_root()
}
