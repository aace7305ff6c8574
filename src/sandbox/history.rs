//! What a run does for the project's history (docs/history.md): a cgroup for the sandbox's
//! processes (the checkpoint freezer), the request socket bound into the view, the checkpoint
//! watcher while the command runs, and the exit snapshot after the server committed.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;

use super::record::HistoryRecord;
use super::request::{Bind, SandboxRequest};
use super::SandboxError;
use crate::history::checkpoint::{self, Activity, FreezeMode, Target, Timing, Watcher};
use crate::history::object::{hex, CommitKind};
use crate::history::{History, Ignore, SnapOptions};
use crate::knobs::Knobs;
use crate::store::Store;
use crate::sys::cgroup::Cgroup;

/// The history side of one run.
pub struct RunHistory {
    project_dir: PathBuf,
    delta: PathBuf,
    source: PathBuf,
    ignore: Ignore,
    timing: Timing,
    cgroup: Option<Arc<Cgroup>>,
    mode: FreezeMode,
    listener: Option<UnixListener>,
    activity: Option<Activity>,
    watcher: Option<Watcher>,
    pub record: HistoryRecord,
}

impl RunHistory {
    /// Before the launch: the ignore patterns, and the cgroup unless freezing is off. Without
    /// a cgroup, `require` refuses and `auto` says once that checkpoints run unfrozen.
    pub fn prepare(req: &SandboxRequest, knobs: &Knobs) -> Result<RunHistory, SandboxError> {
        let ignore = checkpoint::project_ignore(&req.project_dir).map_err(SandboxError::Config)?;
        let mode = FreezeMode::from_knob(&knobs.checkpoint_freeze).map_err(SandboxError::Config)?;
        std::fs::create_dir_all(checkpoint::socket_dir(&req.project_dir))
            .map_err(|e| SandboxError::Io(format!("{}: {e}", req.project_dir.display())))?;
        let mut h = RunHistory {
            project_dir: req.project_dir.clone(),
            delta: req.db.clone(),
            source: req.source.clone(),
            ignore,
            timing: Timing::from_knobs(knobs),
            cgroup: None,
            mode,
            listener: None,
            activity: None,
            watcher: None,
            record: HistoryRecord::default(),
        };
        if mode == FreezeMode::Off {
            h.record.freezer =
                "off (AGENTFS_CHECKPOINT_FREEZE=off): checkpoints are unfrozen".into();
            return Ok(h);
        }
        let name = format!("{}-{}", req.project, std::process::id());
        match Cgroup::create(&name) {
            Ok(cg) => {
                h.record.freezer = format!("cgroup {}", cg.path().display());
                h.cgroup = Some(Arc::new(cg));
            }
            Err(e) => h.unfrozen(&e.to_string())?,
        }
        Ok(h)
    }

    /// No freezer for this run: refused under `require`, said and recorded under `auto`.
    fn unfrozen(&mut self, why: &str) -> Result<(), SandboxError> {
        self.cgroup = None;
        if self.mode == FreezeMode::Require {
            return Err(SandboxError::FreezerUnavailable(why.to_string()));
        }
        crate::errors::warn(
            crate::errors::Code::FreezerUnavailable,
            &format!(
                "checkpoints of this run are not frozen (no cgroup: {why}); \
                 AGENTFS_CHECKPOINT_FREEZE=require refuses instead"
            ),
            None,
        );
        self.record.freezer = format!("unfrozen: {why}");
        Ok(())
    }

    /// The cgroup of the run, when it has one.
    pub fn cgroup_path(&self) -> Option<PathBuf> {
        self.cgroup.as_ref().map(|c| c.path().to_path_buf())
    }

    /// The request socket's directory, bound read-only into the view.
    pub fn view_bind(&self) -> Bind {
        Bind {
            src: checkpoint::socket_dir(&self.project_dir),
            dst: PathBuf::from(checkpoint::SOCKET_DIR_IN_VIEW),
            writable: false,
        }
    }

    /// Move the sandbox's first process into the cgroup before it forks anything.
    pub fn adopt(&mut self, pid: i32) -> Result<(), SandboxError> {
        let added = match &self.cgroup {
            Some(cg) => cg.add(pid),
            None => return Ok(()),
        };
        if let Err(e) = added {
            self.unfrozen(&format!("moving pid {pid} into the cgroup: {e}"))?;
        }
        Ok(())
    }

    /// Once the run holds the delta's lock, before the command starts: the request socket (a
    /// stale one is replaced) and the watcher's view of the delta's commits.
    pub fn listen(&mut self) {
        self.activity = Some(Activity::open(&self.delta));
        let path = self.socket();
        let _ = std::fs::remove_file(&path);
        let bound = UnixListener::bind(&path).and_then(|l| {
            l.set_nonblocking(true)?;
            // The command may run as another user than the supervisor (root's SUDO_UID).
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
            Ok(l)
        });
        match bound {
            Ok(l) => self.listener = Some(l),
            Err(e) => tracing::warn!(
                "no checkpoint requests for this run ({}: {e})",
                path.display()
            ),
        }
    }

    /// The command runs: start the watcher. `import`: what brings the sandbox's changes into
    /// the delta before each checkpoint (overlayfs), if the server does not.
    pub fn start(&mut self, pid1: i32, server: Arc<Store>, import: Option<checkpoint::Importer>) {
        let target = Target {
            delta: self.delta.clone(),
            store_dir: self.project_dir.join(crate::project::HISTORY),
            ignore: self.ignore.clone(),
            server,
            pid1,
            source: self.source.clone(),
            cgroup: self.cgroup.clone(),
            import,
        };
        let activity = self
            .activity
            .take()
            .unwrap_or_else(|| Activity::open(&self.delta));
        match Watcher::start(target, self.timing.clone(), activity, self.listener.take()) {
            Ok(w) => self.watcher = Some(w),
            Err(e) => crate::errors::warn(
                crate::errors::Code::CheckpointUnavailable,
                &format!("no checkpoints for this run: {e}"),
                None,
            ),
        }
    }

    /// The command ended: stop the watcher (it may hold the mount open) before the server is
    /// joined.
    pub fn stop(&mut self) {
        if let Some(w) = self.watcher.take() {
            let s = w.stop();
            self.record.checkpoints = s.taken;
            self.record.frozen_checkpoints = s.frozen;
            self.record.frozen_ms_max = s.frozen_us_max as f64 / 1000.0;
            self.record.walk_nice = s.walk_nice;
        }
        let _ = std::fs::remove_file(self.socket());
    }

    /// The request socket, as the supervisor sees it.
    fn socket(&self) -> PathBuf {
        checkpoint::socket_dir(&self.project_dir).join(checkpoint::SOCKET_NAME)
    }

    /// The exit snapshot, after the server committed everything; recorded in the run record.
    pub fn exit_snapshot(&mut self, code: Option<i32>) -> Result<(), String> {
        let message = match code {
            Some(c) => format!("exit {c}"),
            None => "exit".to_string(),
        };
        let o = SnapOptions {
            kind: CommitKind::Exit,
            ..SnapOptions::manual(&message, &self.ignore)
        };
        let mut h = History::open(&self.project_dir.join(crate::project::HISTORY))?;
        let r = h.snapshot(&self.delta, &o)?;
        self.record.exit_snapshot = r.commit.map(|c| hex(&c));
        if let Err(e) = h.prune_checkpoints(self.timing.keep) {
            tracing::warn!("checkpoint retention failed: {e}");
        }
        Ok(())
    }
}
