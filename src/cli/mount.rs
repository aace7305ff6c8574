//! `agentfs mount DB MNT [-f] [-o opts]` and `agentfs mount NAME DIR`

use super::{CliError, Code};
use std::io::BufRead as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::knobs::Knobs;
use crate::project::{self, Project, Target};
use crate::store::overlay::{self, OverlayConfig};
use crate::store::{InitOptions, QuickCheck, Store};
use crate::sys::mount::{check_mount_point, MountOptions};
use crate::transport::session::{self, PipeReady, SessionConfig};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The database (created with default settings when it does not exist), or a project
    /// name: a database path has a `/` or ends in .db, .sqlite or .sqlite3.
    pub db: PathBuf,
    /// An existing, empty directory to mount on (-o nonempty accepts one with entries, which
    /// the mount then hides). For a project without a directory yet: the directory it
    /// overlays from now on (nothing is mounted).
    pub mount_point: PathBuf,
    /// Take the first argument as a project name even where a file of that name exists here.
    #[arg(long)]
    pub project: bool,
    /// Stay in the foreground and serve until unmounted or interrupted (SIGINT/SIGTERM unmount).
    #[arg(short, long)]
    pub foreground: bool,
    /// Mount options, comma separated: ro, rw, allow_other (default for root), noallow_other,
    /// nonempty, and options passed to the kernel as they are (e.g. noatime).
    #[arg(short = 'o', value_delimiter = ',')]
    pub options: Vec<String>,
    /// Replicate the database (a project's delta with its history) to this URL with
    /// Litestream for the mount's lifetime (see `agentfs replicate`).
    #[arg(long, value_name = "URL")]
    pub replicate: Option<String>,
    /// Internal: run as the background server started by `agentfs mount` and report readiness
    /// on standard output.
    #[arg(long, hide = true)]
    pub daemon_child: bool,
}

fn parse_options(opts: &[String]) -> MountOptions {
    let mut m = MountOptions {
        allow_other: crate::sys::mount::can_mount_directly(),
        ..Default::default()
    };
    for o in opts.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        match o {
            "ro" => m.readonly = true,
            "rw" => m.readonly = false,
            "allow_other" => m.allow_other = true,
            "noallow_other" => m.allow_other = false,
            "nonempty" => m.nonempty = true,
            "default_permissions" => {}
            other => m.extra.push(other.to_string()),
        }
    }
    m
}

/// Whether the database file refuses to be opened for writing (mode bits, the immutable
/// attribute, a read-only filesystem); other failures are left to the real open.
fn read_only_file(db: &Path) -> bool {
    match std::fs::OpenOptions::new().write(true).open(db) {
        Ok(_) => false,
        Err(e) => matches!(
            e.raw_os_error(),
            Some(libc::EACCES | libc::EPERM | libc::EROFS)
        ),
    }
}

pub fn run(mut a: Args, knobs: &Knobs) -> super::CliResult {
    let mut options = parse_options(&a.options);
    let url = match &a.replicate {
        Some(u) => Some(crate::replica::ReplicaUrl::parse(u)?),
        None => None,
    };
    if a.daemon_child {
        return run_child(&a, options, url.as_ref(), knobs);
    }
    if url.is_some() {
        crate::replica::litestream(knobs)?;
    }
    if let Target::Project(name) = project::classify(a.db.as_os_str(), a.project)? {
        match project_delta(&name, &a.mount_point, knobs)? {
            Some(db) => a.db = db,
            None => return Ok(0),
        }
    }
    // Check everything we can before starting a server, so errors come from this process.
    check_mount_point(&a.mount_point, options.nonempty)?;
    if !a.db.exists() {
        if options.readonly {
            return Err(CliError::new(
                Code::NotFound,
                format!(
                    "{}: no such database (cannot create it read-only)",
                    a.db.display()
                ),
            )
            .at(&a.db));
        }
        Store::create(&a.db, &InitOptions::default())?;
    } else {
        drop(Store::open(&a.db, true)?);
        if !options.readonly && read_only_file(&a.db) {
            crate::errors::warn(
                Code::Other,
                &format!(
                    "{} cannot be written (file mode, immutable attribute or read-only filesystem): mounting it read-only",
                    a.db.display()
                ),
                Some(&a.db),
            );
            options.readonly = true;
            a.options.push("ro".into());
        }
    }
    if let Some(pid) = crate::sys::lock::holder_pid(&a.db) {
        return Err(CliError::new(
            Code::AlreadyMounted,
            format!(
                "{} is already mounted by agentfs server pid {pid}",
                a.db.display()
            ),
        )
        .at(&a.db));
    }
    // An upper directory an overlayfs run of this project left is newer than the delta: taken
    // in before a writable mount serves the delta (a held lock is the server's to report).
    if !options.readonly {
        if let Ok(lock) = crate::sys::lock::lock_db(&a.db) {
            if let Some(i) = super::history::settle_upper(&lock, &a.db)? {
                eprintln!("{}", super::history::imported_line(&i));
            }
        }
    }
    // A read-only mount skips the check: it is how files are rescued from a damaged database.
    if !options.readonly && knobs.mount_quick_check {
        let budget = Duration::from_millis(knobs.mount_quick_check_ms);
        if Store::quick_check(&a.db, budget)? == QuickCheck::Stopped {
            crate::errors::warn(
                Code::Other,
                &format!(
                    "{}: the quick check stopped after {} ms and covered only part of the database (agentfs integrity checks it all)",
                    a.db.display(),
                    knobs.mount_quick_check_ms
                ),
                Some(&a.db),
            );
        }
    }
    let cfg = SessionConfig {
        db: a.db.clone(),
        mount_point: a.mount_point.clone(),
        options: options.clone(),
    };
    if a.foreground {
        let rep = replicate(&a.db, url.as_ref(), options.readonly, knobs)?;
        let served = session::run(&cfg, knobs, &mut (), None);
        let stopped = rep.map(|r| r.stop());
        served?;
        stopped.transpose()?;
        return Ok(0);
    }
    launch_background(&a)
}

/// For `mount NAME DIR`: a project with no directory yet is given `dir` (None: done, nothing to
/// mount); otherwise its delta database is what gets mounted at `dir`, which may not lie inside
/// the project's own directory (the server would serve its base through itself).
fn project_delta(name: &str, dir: &Path, knobs: &Knobs) -> Result<Option<PathBuf>, project::Error> {
    let root = project::root(knobs)?;
    let mut p = Project::open(&root, name)?;
    let Some(source) = p.source() else {
        let cfg = overlay::check_base(&p.db(), dir)
            .map(OverlayConfig::new)
            .map_err(|e| project::Error::new(Code::SourceMissing, e))?;
        p.attach(&cfg, &InitOptions::default())?;
        super::say(format_args!(
            "project {name} overlays {}; enter it with: agentfs run {name}",
            cfg.base_path.display()
        ));
        return Ok(None);
    };
    if std::fs::canonicalize(dir).is_ok_and(|d| d.starts_with(source)) {
        return Err(project::Error::new(
            Code::MountInsideSource,
            format!(
                "{} lies inside {}, the directory project {name} overlays: mount it elsewhere, or use agentfs run {name} to see it at its real path",
                dir.display(),
                source.display()
            ),
        ));
    }
    Ok(Some(p.db()))
}

/// Start `agentfs mount ... --daemon-child` in its own process group and wait for its report.
fn launch_background(a: &Args) -> super::CliResult {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg(&a.db)
        .arg(&a.mount_point)
        .arg("--daemon-child");
    if !a.options.is_empty() {
        cmd.arg("-o").arg(a.options.join(","));
    }
    if let Some(u) = &a.replicate {
        cmd.arg("--replicate").arg(u);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start the server: {e}"))?;
    let Some(out) = child.stdout.take() else {
        return Err("cannot read the server's report".into());
    };
    let mut line = String::new();
    let _ = std::io::BufReader::new(out).read_line(&mut line);
    let line = line.trim();
    if line == "ok" {
        let mnt = std::fs::canonicalize(&a.mount_point).unwrap_or_else(|_| a.mount_point.clone());
        super::say(format_args!(
            "{} mounted at {}, server pid {}; stop it with: agentfs umount {}",
            a.db.display(),
            mnt.display(),
            child.id(),
            mnt.display()
        ));
        return Ok(0);
    }
    let _ = child.wait();
    // The server's report names its error's code: `error: CODE\tMESSAGE`.
    match line.strip_prefix("error: ").map(|m| m.split_once('\t')) {
        Some(Some((code, msg))) => {
            Err(CliError::new(Code::named(code).unwrap_or(Code::Other), msg))
        }
        _ => Err(CliError::new(
            Code::ServerFailed,
            "the server exited before the mount was live",
        )),
    }
}

/// Start replicating `db` to `url` for a mount's lifetime (a read-only mount is not replicated:
/// it writes nothing).
fn replicate(
    db: &Path,
    url: Option<&crate::replica::ReplicaUrl>,
    readonly: bool,
    knobs: &Knobs,
) -> Result<Option<crate::replica::Replication>, CliError> {
    match url {
        Some(_) if readonly => Err(CliError::new(
            Code::ReplicateReadonly,
            "a read-only mount writes nothing to replicate",
        )),
        Some(u) => Ok(Some(crate::replica::start(db, u, knobs)?)),
        None => Ok(None),
    }
}

fn run_child(
    a: &Args,
    options: MountOptions,
    url: Option<&crate::replica::ReplicaUrl>,
    knobs: &Knobs,
) -> super::CliResult {
    use std::io::Write as _;
    let readonly = options.readonly;
    let cfg = SessionConfig {
        db: a.db.clone(),
        mount_point: a.mount_point.clone(),
        options,
    };
    let stdout = crate::sys::stdio::take_stdout();
    let mut ready = PipeReady(stdout);
    // Litestream starts before the server opens the database, so the server knows from the
    // first open that checkpoints are Litestream's.
    let rep = match replicate(&a.db, url, readonly, knobs) {
        Ok(r) => r,
        Err(e) => {
            if let Some(mut f) = ready.0.take() {
                let _ = writeln!(f, "error: {}\t{}", e.code, e.message);
            }
            return Err(e);
        }
    };
    // Standard error (the log) goes to a file `agentfs status` names.
    let log = crate::sys::registry::log_path(std::process::id());
    let log = match crate::sys::stdio::stderr_to(&log) {
        Ok(()) => Some(log),
        Err(e) => {
            tracing::warn!("cannot log to {}: {e}", log.display());
            None
        }
    };
    let served = session::run(&cfg, knobs, &mut ready, log);
    if let Some(r) = rep {
        if let Err(e) = r.stop() {
            tracing::error!("{e}");
            // The server left "ok" for `agentfs umount`, which waits for this process: a
            // replica left behind replaces it (a failed server's own outcome stays).
            if served.is_ok() {
                let msg = e.to_string();
                if let Err(e) = crate::sys::registry::record_exit(std::process::id(), Some(&msg)) {
                    tracing::warn!("cannot leave the outcome for agentfs umount: {e}");
                }
            }
        }
    }
    match served {
        Ok(()) => Ok(0),
        Err(e) => {
            let e = CliError::from(e);
            if let Some(mut f) = ready.0.take() {
                let _ = writeln!(f, "error: {}\t{}", e.code, e.message);
            }
            Err(e)
        }
    }
}
