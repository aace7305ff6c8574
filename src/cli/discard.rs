//! `agentfs discard NAME [--force] [--json]`: stop the project's sandbox, unmount its delta and
//! remove its directory, the last only once nothing serves the delta any more.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{CliError, Code};
use crate::knobs::Knobs;
use crate::project::{self, Project};
use crate::sandbox::LiveMarker;
use crate::sys::{ns, registry};

/// How long a sandbox asked to stop (or killed) may take to end.
const STOP_WAIT: Duration = Duration::from_secs(10);

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The project.
    pub name: String,
    /// Discard changes that were never applied too, and kill the project's sandbox when it
    /// does not stop when asked (its pid 1, which ends every process of that sandbox and no
    /// other).
    #[arg(long)]
    pub force: bool,
    /// Print what was done as one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args, knobs: &Knobs) -> super::CliResult {
    let root = project::root(knobs)?;
    let p = Project::open(&root, &a.name)?;
    // Changes in an upper directory (a live overlayfs run, or one a run left) are not in the
    // delta, which cannot say what the discard would lose.
    if crate::sandbox::upper_left_over(&p.dir) && !a.force {
        let e = super::history::upper_waits(&p.dir);
        let message = format!("{}; --force discards them", e.message);
        return Err(CliError { message, ..e });
    }
    let unapplied = p.unapplied();
    match (&unapplied, a.force) {
        (_, true) | (Ok(0), _) => {}
        (Ok(n), false) => {
            return Err(CliError::new(
                Code::UnappliedChanges,
                format!(
                    "project {} has {n} change(s) never applied to {}: apply them, or discard \
                     them with --force",
                    p.name,
                    p.source()
                        .map_or_else(String::new, |s| s.display().to_string())
                ),
            )
            .at(&p.dir))
        }
        (Err(e), false) => {
            let e = CliError::from(e.clone());
            return Err(CliError::new(
                e.code,
                format!(
                    "cannot tell whether project {} has unapplied changes ({}); --force discards \
                     it anyway",
                    p.name, e.message
                ),
            )
            .at(p.db()));
        }
    }
    let sandbox = match crate::sandbox::live(&p.dir) {
        Some(m) => Some(stop(&p, &m, a.force)?),
        None => None,
    };
    let db = p.db();
    let mut unmounted = Vec::new();
    for r in registry::live()
        .into_iter()
        .filter(|r| same_file(&r.db, &db))
    {
        super::umount::run(super::umount::Args {
            mount_point: r.mount_point.clone(),
            force: false,
            wait: 60,
        })?;
        unmounted.push(r.mount_point);
    }
    // Nothing may serve the delta while its directory goes (a server this user's registry
    // does not list, in another namespace, still holds the lock).
    let _lock = match db.exists() {
        true => Some(crate::sys::lock::lock_db(&db).map_err(|e| {
            match e {
                crate::sys::lock::LockError::HeldBy { path, pid } => CliError::new(
                    Code::AlreadyMounted,
                    format!("{path} is still served (server pid {pid}); nothing was removed"),
                )
                .at(path),
                e => e.into(),
            }
        })?),
        false => None,
    };
    let _root = project::lock_root(&root)?;
    // config.toml first: a discard killed midway leaves a directory `agentfs recover` knows
    // for an orphan.
    let io = |p: &Path, e: std::io::Error| CliError::new(Code::of_io(&e), e.to_string()).at(p);
    let config = p.dir.join(project::CONFIG);
    std::fs::remove_file(&config).map_err(|e| io(&config, e))?;
    std::fs::remove_dir_all(&p.dir).map_err(|e| io(&p.dir, e))?;
    if a.json {
        super::say(format_args!(
            "{}",
            json!({
                "discarded": p.name,
                "dir": p.dir,
                "unapplied_changes": unapplied.ok(),
                "sandbox": sandbox,
                "unmounted": unmounted,
            })
        ));
    } else {
        if let Some(s) = &sandbox {
            println!(
                "{} the sandbox (supervisor pid {})",
                s["action"], s["supervisor"]
            );
        }
        for m in &unmounted {
            println!("unmounted {}", m.display());
        }
        println!("discarded project {} ({})", p.name, p.dir.display());
    }
    Ok(0)
}

/// Whether two paths name the same file.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => (x.dev(), x.ino()) == (y.dev(), y.ino()),
        _ => false,
    }
}

/// End the project's live sandbox `m`: asked first (SIGTERM to its supervisor, which passes it
/// to the command); with `force`, killed when it does not end (SIGKILL to its pid 1, then to the
/// supervisor if that outlives it). Every signal goes to a process only after checking it is
/// still the one the marker names. What was done, as JSON.
fn stop(p: &Project, m: &LiveMarker, force: bool) -> Result<serde_json::Value, CliError> {
    let report =
        |action: &str| json!({ "action": action, "supervisor": m.supervisor, "pid1": m.pid1 });
    let _ = ns::kill(m.supervisor, libc::SIGTERM);
    if ended(m) {
        return Ok(report("stopped"));
    }
    let busy = |what: String| CliError::new(Code::Busy, what).at(&p.dir);
    if !force {
        return Err(busy(format!(
            "the sandbox of project {} (supervisor pid {}) did not stop within {}s of SIGTERM; \
             nothing was removed (--force kills it)",
            p.name,
            m.supervisor,
            STOP_WAIT.as_secs()
        )));
    }
    if m.running() {
        let _ = ns::kill(m.pid1, libc::SIGKILL);
    }
    if !ended(m) && ns::same_process(m.supervisor, m.started) {
        let _ = ns::kill(m.supervisor, libc::SIGKILL);
    }
    if ended(m) {
        return Ok(report("killed"));
    }
    Err(busy(format!(
        "the sandbox of project {} (supervisor pid {}) did not end when killed; nothing was \
         removed",
        p.name, m.supervisor
    )))
}

/// Wait up to [`STOP_WAIT`] for the sandbox's supervisor to end (it ends after its pid 1).
fn ended(m: &LiveMarker) -> bool {
    let deadline = Instant::now() + STOP_WAIT;
    while ns::same_process(m.supervisor, m.started) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}
