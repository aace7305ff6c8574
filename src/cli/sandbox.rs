//! `agentfs quick DIR`, `agentfs run NAME`, `agentfs exec NAME -- CMD`: a command in a
//! project's sandbox. A refusal before launch is `agentfs: <code>: <message>` and exit status
//! 125; otherwise the status is the command's (128+N when a signal N killed it).

use super::Code;
use std::ffi::OsString;
use std::path::PathBuf;

use crate::knobs::Knobs;
use crate::project::config::{
    Backend, BackendChoice, HomeName, NetName, PolicyName, Settings, SymlinkName,
};
use crate::project::{self, launch, Error, Project};
use crate::replica::ReplicaUrl;
use crate::store::overlay::{self, OverlayConfig};
use crate::store::InitOptions;

/// Exit status of a launch refused before the command started.
pub const REFUSED: i32 = 125;

/// The flags every launch takes; config.toml and defaults.toml supply the same keys (flags win,
/// lists add up).
#[derive(clap::Args, Debug)]
pub struct LaunchFlags {
    /// How the home appears: full (read-write), full-ro (read-only) or empty (a private one).
    #[arg(long, value_enum)]
    pub home: Option<HomeName>,
    /// Also mask PATH (shown as an empty read-only file or directory); repeatable.
    #[arg(long = "mask", value_name = "PATH")]
    pub masks: Vec<String>,
    /// Bind host SRC read-write at DST (default: the same path); repeatable.
    #[arg(long = "bind", value_name = "SRC[:DST]")]
    pub binds: Vec<String>,
    /// Bind host SRC read-only at DST (default: the same path); repeatable.
    #[arg(long = "ro-bind", value_name = "SRC[:DST]")]
    pub ro_binds: Vec<String>,
    /// Let the command read host PATH (a read-only bind at the same path); repeatable.
    #[arg(long = "allow-host-read", value_name = "PATH")]
    pub allow_host_read: Vec<String>,
    /// The network: host (the host's) or none (only loopback).
    #[arg(long, value_enum)]
    pub net: Option<NetName>,
    /// Set K=V in the command's environment, or pass the caller's K through; repeatable.
    #[arg(long = "env", value_name = "K[=V]")]
    pub env: Vec<String>,
    /// Filesystem policy: read-only (nothing writable) or workspace-write (only the
    /// --writable-root paths).
    #[arg(long, value_enum)]
    pub policy: Option<PolicyName>,
    /// A path the command may write (absolute, inside the project or a --bind); repeatable;
    /// implies --policy workspace-write.
    #[arg(long = "writable-root", value_name = "PATH")]
    pub writable_roots: Vec<PathBuf>,
    /// Symlinks made in the project: allow (every one, the default) or refuse-escaping (EPERM
    /// and an audit event for a target that resolves outside the project).
    #[arg(long, value_enum)]
    pub symlinks: Option<SymlinkName>,
    /// Replicate the project's databases (delta and history) to this URL with Litestream for
    /// the sandbox's lifetime (overrides `[replicate] url` of config.toml; see `agentfs
    /// replicate`). `exec` joining a live sandbox accepts only that sandbox's own URL.
    #[arg(long, value_name = "URL")]
    pub replicate: Option<String>,
    /// What serves the project: auto (the first of fuse and overlayfs that mounts in a
    /// throwaway namespace), fuse or overlayfs. Chosen at a project's first launch and kept in
    /// its config.toml; asking another one later is refused (backend_mismatch).
    #[arg(long = "mount-backend", value_enum)]
    pub mount_backend: Option<BackendChoice>,
}

impl LaunchFlags {
    fn into_settings(self) -> Settings {
        let mut s = Settings::default();
        s.home.mode = self.home;
        s.sandbox.masks = self.masks;
        s.sandbox.binds = self.binds;
        s.sandbox.ro_binds = self.ro_binds;
        s.sandbox.ro_binds.extend(self.allow_host_read);
        s.sandbox.env = self.env;
        s.sandbox.net = self.net;
        s.policy.mode = self.policy;
        s.policy.writable_roots = self.writable_roots;
        s.policy.symlinks = self.symlinks;
        s
    }

    /// Where to replicate: the flag, else the project's `[replicate] url`.
    fn replica_url(&self, project: &Project) -> Result<Option<ReplicaUrl>, Error> {
        self.replicate
            .as_deref()
            .or(project.config.replicate.as_ref().map(|r| r.url.as_str()))
            .map(ReplicaUrl::parse)
            .transpose()
    }
}

#[derive(clap::Args, Debug)]
pub struct QuickArgs {
    /// The directory to work on (its project is made on first use and reused after).
    pub dir: PathBuf,
    /// The project's name (default: the directory's basename); another name makes another
    /// project of the same directory.
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub launch: LaunchFlags,
    /// The command and its arguments (default: your shell).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The project.
    pub name: String,
    #[command(flatten)]
    pub launch: LaunchFlags,
    /// The command and its arguments (default: your shell, its prompt prefixed [NAME]).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    /// The project.
    pub name: String,
    #[command(flatten)]
    pub launch: LaunchFlags,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Which launch: a new sandbox, or the live one when there is one.
#[derive(Clone, Copy)]
enum How {
    Run,
    Exec,
}

/// Print a refusal and give the refusal's status.
fn refuse(e: &Error) -> i32 {
    super::error::report(&super::CliError::from(e.clone()).exit_with(REFUSED))
}

pub fn quick(a: QuickArgs, knobs: &Knobs) -> super::CliResult {
    Ok(match quick_project(&a.dir, a.name.as_deref(), knobs) {
        Ok((project, created)) => {
            if created {
                eprintln!(
                    "agentfs: project {} made for {} (in {})",
                    project.name,
                    project.source().unwrap_or(&a.dir).display(),
                    project.dir.display()
                );
            }
            launch(&project, a.launch, a.command, How::Run, knobs)
        }
        Err(e) => refuse(&e),
    })
}

/// The project of `dir`: the one named `name` (or the directory's basename), made when absent.
/// An unnamed call reuses any project of the same directory; a name taken by a project of
/// another directory is refused.
fn quick_project(
    dir: &std::path::Path,
    name: Option<&str>,
    knobs: &Knobs,
) -> Result<(Project, bool), Error> {
    let root = project::root(knobs)?;
    let source = std::fs::canonicalize(dir)
        .ok()
        .filter(|p| p.is_dir())
        .ok_or_else(|| {
            Error::new(
                Code::SourceMissing,
                format!("{} is not a directory", dir.display()),
            )
        })?;
    // Two `quick`s of a new directory at once: the second waits here and then finds the
    // project the first made.
    let _lock = project::lock_root(&root)?;
    if name.is_none() {
        if let Some(p) = Project::find_by_source(&root, &source) {
            return Ok((p, false));
        }
    }
    let name = match name {
        Some(n) => n.to_string(),
        None => project::name_for_dir(&source)?,
    };
    match Project::open(&root, &name) {
        Ok(p) if p.source() == Some(source.as_path()) => return Ok((p, false)),
        Ok(p) => {
            return Err(Error::new(
                Code::NameTaken,
                format!(
                    "project {name} belongs to {}; choose another with --name",
                    p.source()
                        .map_or("no directory yet".into(), |s| s.display().to_string())
                ),
            ))
        }
        Err(e) if e.code == Code::NoProject => {}
        Err(e) => return Err(e),
    }
    let mut p = Project::create(&root, &name)?;
    let cfg = overlay::check_base(&p.db(), &source)
        .map(OverlayConfig::new)
        .map_err(|e| Error::new(Code::DeltaCreate, e));
    if let Err(e) = cfg.and_then(|cfg| p.attach(&cfg, &InitOptions::default())) {
        let _ = std::fs::remove_dir_all(&p.dir);
        return Err(e);
    }
    Ok((p, true))
}

pub fn run(a: RunArgs, knobs: &Knobs) -> super::CliResult {
    Ok(open_and_launch(
        &a.name,
        a.launch,
        a.command,
        How::Run,
        knobs,
    ))
}

pub fn exec(a: ExecArgs, knobs: &Knobs) -> super::CliResult {
    Ok(open_and_launch(
        &a.name,
        a.launch,
        a.command,
        How::Exec,
        knobs,
    ))
}

fn open_and_launch(
    name: &str,
    flags: LaunchFlags,
    command: Vec<OsString>,
    how: How,
    knobs: &Knobs,
) -> i32 {
    let opened = project::root(knobs).and_then(|root| Project::open(&root, name));
    match opened {
        Ok(p) => launch(&p, flags, command, how, knobs),
        Err(e) => refuse(&e),
    }
}

/// The project's backend and why: the one its config.toml records (another one asked for is
/// `backend_mismatch`), else the one asked for (`default`, AGENTFS_MOUNT_BACKEND, without the
/// flag), else what `auto` finds; a new choice is written to config.toml.
fn choose_backend(
    project: &Project,
    asked: Option<BackendChoice>,
    default: BackendChoice,
) -> Result<(Backend, String), super::CliError> {
    let named = |c: BackendChoice| match c {
        BackendChoice::Auto => None,
        BackendChoice::Fuse => Some(Backend::Fuse),
        BackendChoice::Overlayfs => Some(Backend::Overlayfs),
    };
    let name = |b: Backend| crate::sandbox::request::MountBackend::from(b).as_str();
    let asked_for = asked.and_then(named);
    if let Some(kept) = project.config.project.backend {
        return match asked_for {
            Some(b) if b != kept => Err(Error::new(
                Code::BackendMismatch,
                format!(
                    "project {} keeps the {} backend its config.toml records; it cannot run on {} (switch it first: agentfs convert {} --to {})",
                    project.name,
                    name(kept),
                    name(b),
                    project.name,
                    name(b)
                ),
            )
            .into()),
            _ => Ok((kept, "config.toml".into())),
        };
    }
    // The flag wins over the knob, `--mount-backend auto` included.
    let (backend, why) = match named(asked.unwrap_or(default)) {
        Some(b) if asked.is_some() => (b, format!("--mount-backend {}", name(b))),
        Some(b) => (b, format!("AGENTFS_MOUNT_BACKEND={}", name(b))),
        None => {
            let c = crate::sandbox::probe::probe(&project.dir)
                .map_err(crate::sandbox::SandboxError::NoMountBackend)?;
            let b = match c.backend {
                crate::sandbox::request::MountBackend::Fuse => Backend::Fuse,
                crate::sandbox::request::MountBackend::Overlayfs => Backend::Overlayfs,
            };
            (b, c.reason)
        }
    };
    let mut chosen = project.clone();
    chosen.config.project.backend = Some(backend);
    chosen.save()?;
    Ok((backend, why))
}

/// Merge defaults, config and flags, build the request and launch it.
fn launch(
    project: &Project,
    flags: LaunchFlags,
    command: Vec<OsString>,
    how: How,
    knobs: &Knobs,
) -> i32 {
    let asked = flags.mount_backend;
    let default = match knobs.mount_backend.as_str() {
        "auto" | "" => BackendChoice::Auto,
        "fuse" => BackendChoice::Fuse,
        "overlayfs" => BackendChoice::Overlayfs,
        other => {
            let e = crate::knobs::KnobError {
                name: "AGENTFS_MOUNT_BACKEND",
                value: other.to_string(),
                why: "expected auto, fuse or overlayfs".into(),
            };
            return super::error::report(&super::CliError::from(e).exit_with(REFUSED));
        }
    };
    let req = project::root(knobs).and_then(|root| {
        let replicate = flags.replica_url(project)?;
        let mut settings = project::defaults(&root)?;
        settings.merge(project.config.settings());
        settings.merge(flags.into_settings());
        let mut req = launch::request(project, &root, settings, command)?;
        req.replicate = replicate;
        Ok(req)
    });
    let mut req = match req {
        Ok(r) => r,
        Err(e) => return refuse(&e),
    };
    match choose_backend(project, asked, default) {
        Ok((backend, why)) => {
            req.backend = backend.into();
            req.backend_reason = why;
        }
        Err(e) => return super::error::report(&e.exit_with(REFUSED)),
    }
    let started = match how {
        How::Run => crate::sandbox::run(&req, knobs),
        How::Exec => crate::sandbox::exec(&req, knobs),
    };
    match started {
        Ok(status) => status,
        Err(e) => super::error::report(&super::CliError::from(e).exit_with(REFUSED)),
    }
}
