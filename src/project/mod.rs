//! Projects: a named delta over one real directory, kept in its own directory under the
//! projects root (`AGENTFS_PROJECTS_DIR`, by default `~/.agentfs`):
//!
//! ```text
//! <root>/defaults.toml        the user's launch defaults (optional)
//! <root>/<name>/config.toml   the source directory and the project's launch settings
//! <root>/<name>/delta.db      an overlay database whose base is the source
//! <root>/<name>/live.json     present while a sandbox of the project runs
//! <root>/<name>/delta.db-apply   present while an apply writes the source (its journal)
//! <root>/<name>/delta.db-enospc  present once a write to the delta was refused for space
//! <root>/<name>/runs/         one JSON record per run: what was enforced
//! ```
//!
//! Snapshot history is kept beside these, in the same directory.

pub mod config;
pub mod launch;

use std::ffi::OsStr;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

pub use crate::errors::Code;
use crate::knobs::Knobs;
use crate::store::overlay::{self, OverlayConfig};
use crate::store::InitOptions;
use config::{ProjectConfig, Settings};

/// A refusal or failure of a project operation: a stable snake_case code and one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: Code,
    pub message: String,
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

impl From<crate::sandbox::policy::PolicyError> for Error {
    fn from(e: crate::sandbox::policy::PolicyError) -> Self {
        Error::new(e.kind(), e.to_string())
    }
}

/// The file names inside a project's directory.
pub const CONFIG: &str = "config.toml";
pub const DELTA: &str = "delta.db";
pub const LIVE: &str = "live.json";
pub const RUNS: &str = "runs";
pub const DEFAULTS: &str = "defaults.toml";
/// The project's snapshot history (a store directory, docs/history.md).
pub const HISTORY: &str = "store";

/// Endings that make an argument a database path, never a project name.
const DB_ENDINGS: [&str; 3] = [".db", ".sqlite", ".sqlite3"];

/// The caller's home directory ($HOME), required by projects and the sandbox.
pub fn home() -> Result<PathBuf, Error> {
    match std::env::var_os("HOME") {
        Some(h) if Path::new(&h).is_absolute() => Ok(PathBuf::from(h)),
        _ => Err(Error::new(
            Code::NoHome,
            "HOME is not set to an absolute path (set it, or AGENTFS_PROJECTS_DIR)",
        )),
    }
}

/// The projects root: the knob when set, else `~/.agentfs`.
pub fn root(knobs: &Knobs) -> Result<PathBuf, Error> {
    if knobs.projects_dir.is_empty() {
        return Ok(home()?.join(".agentfs"));
    }
    std::path::absolute(&knobs.projects_dir)
        .map_err(|e| Error::new(Code::NoHome, format!("AGENTFS_PROJECTS_DIR: {e}")))
}

/// A project name: `[A-Za-z0-9][A-Za-z0-9._-]*`, at most 64 bytes, not ending in a database
/// file's ending (.db, .sqlite, .sqlite3).
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    first_ok
        && name.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !DB_ENDINGS.iter().any(|e| name.ends_with(e))
}

/// The project name `quick` derives from a directory: its basename with every other character
/// replaced by `-` and leading punctuation dropped.
pub fn name_for_dir(dir: &Path) -> Result<String, Error> {
    let base = dir
        .file_name()
        .map(|b| b.to_string_lossy())
        .unwrap_or_default();
    let mut name: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .skip_while(|c| !c.is_ascii_alphanumeric())
        .take(64)
        .collect();
    for e in DB_ENDINGS {
        if let Some(stem) = name.strip_suffix(e) {
            name = format!("{stem}-{}", &e[1..]);
        }
    }
    if valid_name(&name) {
        Ok(name)
    } else {
        Err(Error::new(
            Code::BadName,
            format!(
                "cannot make a project name from {}; give one with --name",
                dir.display()
            ),
        ))
    }
}

/// What an `init` or `mount` argument names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Project(String),
    Database(PathBuf),
}

/// The rule that tells a project name from a database path (README, "Projects"):
/// with `--project` the argument is a project name; an argument with a `/`, a database ending
/// or a character a name may not hold is a database path; a valid name that is also an entry of
/// the working directory is refused as ambiguous; any other valid name is a project.
pub fn classify(arg: &OsStr, force_project: bool) -> Result<Target, Error> {
    classify_in(arg, force_project, Path::new("."))
}

/// [`classify`] with `cwd` as the working directory.
fn classify_in(arg: &OsStr, force_project: bool, cwd: &Path) -> Result<Target, Error> {
    let s = arg.to_str();
    if force_project {
        return match s {
            Some(n) if valid_name(n) => Ok(Target::Project(n.to_string())),
            _ => Err(Error::new(
                Code::BadName,
                format!(
                    "{} is not a project name ([A-Za-z0-9][A-Za-z0-9._-]*)",
                    arg.to_string_lossy()
                ),
            )),
        };
    }
    match s {
        Some(n) if valid_name(n) && !n.contains('/') => {
            if std::fs::symlink_metadata(cwd.join(n)).is_ok() {
                Err(Error::new(
                    Code::AmbiguousName,
                    format!("{n} is both a project name and a file here: use ./{n} for the file or --project {n} for the project"),
                ))
            } else {
                Ok(Target::Project(n.to_string()))
            }
        }
        _ => Ok(Target::Database(PathBuf::from(arg))),
    }
}

/// The delta database an argument names: a database path as it is, a project name as its
/// delta.db (the project must exist and overlay a directory); `force_project` is `--project`.
pub fn delta_path(arg: &Path, force_project: bool, knobs: &Knobs) -> Result<PathBuf, Error> {
    match classify(arg.as_os_str(), force_project)? {
        Target::Database(p) => Ok(p),
        Target::Project(name) => {
            let p = Project::open(&root(knobs)?, &name)?;
            if p.source().is_none() {
                return Err(Error::new(
                    Code::NoSource,
                    format!("project {name} overlays no directory yet: agentfs mount {name} DIR"),
                ));
            }
            Ok(p.db())
        }
    }
}

/// Held while a project is looked up and made, so that two commands making the project of one
/// directory at the same moment end with one project; released on drop.
pub struct RootLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// Wait for the projects root's lock (`<root>/.lock`, an flock), making the root when absent.
pub fn lock_root(root: &Path) -> Result<RootLock, Error> {
    let io = |p: &Path, e: std::io::Error| Error::new(Code::Io, format!("{}: {e}", p.display()));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)
        .map_err(|e| io(root, e))?;
    let path = root.join(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| io(&path, e))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map(|lock| RootLock { _lock: lock })
        .map_err(|(_, e)| io(&path, e.into()))
}

/// The user's defaults (`<root>/defaults.toml`; absent means none).
pub fn defaults(root: &Path) -> Result<Settings, Error> {
    config::load(&root.join(DEFAULTS))
}

/// One project: its name, its directory and its parsed config.toml.
#[derive(Debug, Clone)]
pub struct Project {
    pub name: String,
    pub dir: PathBuf,
    pub config: ProjectConfig,
}

impl Project {
    pub fn db(&self) -> PathBuf {
        self.dir.join(DELTA)
    }

    pub fn live_path(&self) -> PathBuf {
        self.dir.join(LIVE)
    }

    pub fn runs_dir(&self) -> PathBuf {
        self.dir.join(RUNS)
    }

    pub fn source(&self) -> Option<&Path> {
        self.config.project.source.as_deref()
    }

    /// Open the project `name` under `root`.
    pub fn open(root: &Path, name: &str) -> Result<Project, Error> {
        if !valid_name(name) {
            return Err(Error::new(
                Code::BadName,
                format!("{name} is not a project name ([A-Za-z0-9][A-Za-z0-9._-]*)"),
            ));
        }
        let dir = root.join(name);
        let file = dir.join(CONFIG);
        if !file.exists() {
            return Err(Error::new(
                Code::NoProject,
                format!(
                    "no project named {name} (in {}); create it with agentfs init {name} or agentfs quick DIR",
                    root.display()
                ),
            ));
        }
        let config = config::load(&file)?;
        Ok(Project {
            name: name.to_string(),
            dir,
            config,
        })
    }

    /// Every project under `root`, by name; a project whose config is broken comes back as
    /// its error.
    pub fn list(root: &Path) -> Vec<(String, Result<Project, Error>)> {
        let Ok(rd) = std::fs::read_dir(root) else {
            return Vec::new();
        };
        let mut names: Vec<String> = rd
            .flatten()
            .filter(|e| e.path().join(CONFIG).is_file())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| valid_name(n))
            .collect();
        names.sort();
        names
            .into_iter()
            .map(|n| {
                let p = Project::open(root, &n);
                (n, p)
            })
            .collect()
    }

    /// The project whose source is `source` (canonical), if there is one.
    pub fn find_by_source(root: &Path, source: &Path) -> Option<Project> {
        Project::list(root)
            .into_iter()
            .filter_map(|(_, p)| p.ok())
            .find(|p| p.source() == Some(source))
    }

    /// Make the project `name` under `root`, with no source yet.
    pub fn create(root: &Path, name: &str) -> Result<Project, Error> {
        if !valid_name(name) {
            return Err(Error::new(
                Code::BadName,
                format!("{name} is not a project name ([A-Za-z0-9][A-Za-z0-9._-]*)"),
            ));
        }
        let io =
            |p: &Path, e: std::io::Error| Error::new(Code::Io, format!("{}: {e}", p.display()));
        if !root.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(root)
                .map_err(|e| io(root, e))?;
        }
        let dir = root.join(name);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(Error::new(
                    Code::ProjectExists,
                    format!("a project named {name} exists already ({})", dir.display()),
                ))
            }
            Err(e) => return Err(io(&dir, e)),
        }
        let p = Project {
            name: name.to_string(),
            dir,
            config: ProjectConfig::default(),
        };
        if let Err(e) = p.save() {
            let _ = std::fs::remove_dir_all(&p.dir);
            return Err(e);
        }
        Ok(p)
    }

    /// Write config.toml (whole, through a temporary file and a rename).
    pub fn save(&self) -> Result<(), Error> {
        let file = self.dir.join(CONFIG);
        // One temporary file per process: two launches of a new project both record its
        // backend, and with one shared name the second rename found the file gone.
        let tmp = self
            .dir
            .join(format!(".config.toml.{}.tmp", std::process::id()));
        let text = config::render(&self.config)?;
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &file))
            .map_err(|e| Error::new(Code::Io, format!("{}: {e}", file.display())))
    }

    /// Give the project its source: the delta database is made over `cfg.base_path` (check it
    /// with [`overlay::check_base`] against [`Project::db`]). One source per project: every
    /// caller gives one to a project it found without one or has just made, and of two racing
    /// for the same project the second finds the delta database made (`delta_create`).
    pub fn attach(&mut self, cfg: &OverlayConfig, opts: &InitOptions) -> Result<(), Error> {
        let db = self.db();
        overlay::create(&db, opts, cfg).map_err(|e| Error::new(Code::DeltaCreate, e))?;
        self.config.project.source = Some(cfg.base_path.clone());
        if let Err(e) = self.save() {
            let _ = std::fs::remove_file(&db);
            return Err(e);
        }
        Ok(())
    }

    /// How many paths of the delta differ from the real directory, not yet applied (0 for a
    /// project without a source); the error when the delta cannot be read.
    pub fn unapplied(&self) -> Result<usize, String> {
        if self.source().is_none() {
            return Ok(0);
        }
        let changes = crate::delta::Overlay::open(&self.db())?.changes()?;
        let mut paths: Vec<&[u8]> = changes.iter().map(|e| e.path.as_slice()).collect();
        paths.dedup();
        Ok(paths.len())
    }

    /// Bytes the delta takes on disk (the database and its WAL).
    pub fn delta_bytes(&self) -> u64 {
        ["", "-wal"]
            .iter()
            .filter_map(|s| {
                let mut p = self.db().into_os_string();
                p.push(s);
                std::fs::metadata(p).ok()
            })
            .map(|m| m.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn names() {
        for ok in ["api", "a", "api-2", "my.proj_1", "9lives"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "-x",
            ".hidden",
            "a/b",
            "x.db",
            "x.sqlite",
            "x.sqlite3",
            "sp ace",
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
        assert_eq!(name_for_dir(Path::new("/c/My Repo")).unwrap(), "My-Repo");
        assert_eq!(name_for_dir(Path::new("/c/.dots")).unwrap(), "dots");
        assert_eq!(name_for_dir(Path::new("/c/data.db")).unwrap(), "data-db");
        assert_eq!(
            name_for_dir(Path::new("/")).unwrap_err().code,
            Code::BadName
        );
    }

    #[test]
    fn the_name_or_path_rule() {
        let d = tempfile::tempdir().unwrap();
        let c = |s: &str| classify(&OsString::from(s), false);
        assert_eq!(c("api").unwrap(), Target::Project("api".into()));
        assert_eq!(c("./api").unwrap(), Target::Database("./api".into()));
        assert_eq!(c("x.db").unwrap(), Target::Database("x.db".into()));
        assert_eq!(
            c("x.sqlite3").unwrap(),
            Target::Database("x.sqlite3".into())
        );
        assert_eq!(c(".hidden").unwrap(), Target::Database(".hidden".into()));
        let abs = d.path().join("db");
        assert_eq!(
            classify(abs.as_os_str(), false).unwrap(),
            Target::Database(abs.clone())
        );
        // A valid name that is also a file in the working directory is refused.
        std::fs::write(d.path().join("api"), b"").unwrap();
        let e = classify_in(&OsString::from("api"), false, d.path()).unwrap_err();
        assert_eq!(e.code, Code::AmbiguousName);
        assert!(
            e.message.contains("./api") && e.message.contains("--project api"),
            "{e}"
        );
        assert_eq!(
            classify(&OsString::from("api"), true).unwrap(),
            Target::Project("api".into())
        );
        assert_eq!(
            classify(&OsString::from("x.db"), true).unwrap_err().code,
            Code::BadName
        );
    }
}
