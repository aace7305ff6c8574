//! Automatic checkpoints of a running sandbox: a watcher thread in the supervisor (outside the
//! sandbox's pid namespace, so nothing inside can see or signal it) snapshots the project's
//! upper layer after a pause in writes, at a ceiling while writes never pause, and when a
//! process inside asks through the request socket (`agentfs checkpoint`). Each checkpoint
//! freezes the sandbox's processes when a cgroup was made for them, makes their writes
//! durable, walks, and thaws. docs/history.md states the rules.

use std::io::{Read as _, Write as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::object::{hex, CommitKind};
use super::{History, Ignore, SnapOptions};
use crate::knobs::Knobs;
use crate::store::Store;
use crate::sys::cgroup::Cgroup;

/// Where a sandbox's view shows the directory holding the request socket.
pub const SOCKET_DIR_IN_VIEW: &str = "/run/agentfs";
/// The request socket's name, in the project's `run/` directory and in [`SOCKET_DIR_IN_VIEW`].
pub const SOCKET_NAME: &str = "checkpoint.sock";
/// Most requests waiting for one checkpoint; more connections are closed unanswered.
const MAX_WAITING: usize = 64;

/// The project's directory of the request socket (bound read-only into the view).
pub fn socket_dir(project_dir: &Path) -> PathBuf {
    project_dir.join("run")
}

/// The ignore patterns of the project in `project_dir` (its config.toml's, else the defaults).
pub fn project_ignore(project_dir: &Path) -> Result<Ignore, String> {
    let file = project_dir.join(crate::project::CONFIG);
    if !file.exists() {
        return Ok(Ignore::default());
    }
    let cfg: crate::project::config::ProjectConfig =
        crate::project::config::load(&file).map_err(|e| e.to_string())?;
    Ignore::configured(cfg.project.ignore.as_deref())
}

/// How the run freezes its processes for a checkpoint (`AGENTFS_CHECKPOINT_FREEZE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreezeMode {
    Auto,
    Require,
    Off,
}

impl FreezeMode {
    pub fn from_knob(v: &str) -> Result<FreezeMode, String> {
        match v {
            "auto" | "" => Ok(FreezeMode::Auto),
            "require" => Ok(FreezeMode::Require),
            "off" => Ok(FreezeMode::Off),
            other => {
                let e = crate::knobs::KnobError {
                    name: "AGENTFS_CHECKPOINT_FREEZE",
                    value: other.to_string(),
                    why: "expected auto, require or off".into(),
                };
                Err(format!("{}: {e}", crate::errors::Code::BadKnob))
            }
        }
    }
}

/// When the watcher snapshots.
#[derive(Clone, Debug)]
pub struct Timing {
    /// A pause in writes this long; None: no automatic checkpoints.
    pub idle: Option<Duration>,
    /// The oldest change not in a checkpoint at most this old; None: no ceiling.
    pub ceiling: Option<Duration>,
    pub keep: u64,
    pub freeze_wait: Duration,
    /// Nice value of the walk after the cut (0: the server's priority).
    pub nice: i32,
}

impl Timing {
    pub fn from_knobs(k: &Knobs) -> Timing {
        let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
        Timing {
            idle: nonzero(Duration::from_millis(k.checkpoint_idle_ms)),
            ceiling: nonzero(Duration::from_secs(k.checkpoint_max_s)),
            keep: k.checkpoint_keep,
            freeze_wait: Duration::from_millis(k.checkpoint_freeze_wait_ms),
            nice: i32::try_from(k.checkpoint_nice).unwrap_or(19),
        }
    }

    /// How often the watcher looks at the delta and the socket.
    fn tick(&self) -> Duration {
        let idle = self.idle.unwrap_or(Duration::from_secs(1));
        (idle / 4).clamp(Duration::from_millis(10), Duration::from_millis(250))
    }
}

/// What a checkpoint works on.
pub struct Target {
    pub delta: PathBuf,
    pub store_dir: PathBuf,
    pub ignore: Ignore,
    /// The server's store: its barrier commits every acknowledged write.
    pub server: Arc<Store>,
    /// The sandbox's pid 1: the mount is reached through its root (`/proc/<pid1>/root`).
    pub pid1: i32,
    /// The project's directory as the sandbox mounts it.
    pub source: PathBuf,
    pub cgroup: Option<Arc<Cgroup>>,
    /// Brings the sandbox's changes into the delta while it is frozen, before the barrier
    /// (the overlayfs backend's import of its upper directory); None when the server writes
    /// them there itself.
    pub import: Option<Importer>,
}

/// See [`Target::import`].
pub type Importer = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Why a checkpoint was taken (recorded in its message).
#[derive(Clone, Copy, Debug)]
enum Why {
    Idle,
    Ceiling,
    Requested,
}

/// What the watcher did during a run (kept in the run record).
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Checkpoints taken (including those equal to HEAD, which record nothing).
    pub taken: u64,
    /// Of those, the ones taken with the sandbox frozen.
    pub frozen: u64,
    /// The longest time the sandbox stayed frozen for one, in microseconds.
    pub frozen_us_max: u64,
    /// The nice value the last walk ran at after the cut, as the walk read it back.
    pub walk_nice: Option<i32>,
}

/// The running watcher; [`Watcher::stop`] ends it (before the server is joined: a checkpoint
/// holds the mount open while it runs).
pub struct Watcher {
    /// Dropped to stop the thread: its end of the pair then reads end-of-file.
    stop: UnixStream,
    thread: std::thread::JoinHandle<Stats>,
}

impl Watcher {
    pub fn start(
        target: Target,
        timing: Timing,
        activity: Activity,
        requests: Option<UnixListener>,
    ) -> std::io::Result<Watcher> {
        let (stop, stopped) = UnixStream::pair()?;
        let thread = std::thread::spawn(move || watch(target, timing, activity, requests, stopped));
        Ok(Watcher { stop, thread })
    }

    /// End the watcher (a checkpoint in progress completes first) and say what it did.
    pub fn stop(self) -> Stats {
        drop(self.stop);
        self.thread.join().unwrap_or_default()
    }
}

/// What ended a wait of the watcher.
#[derive(PartialEq)]
enum Woken {
    Stop,
    /// A request arrived, or the tick passed.
    Look,
}

/// Wait up to `tick` for the stop signal or a connection on the request socket, so that a
/// request is served at once rather than at the next tick.
fn wait(stopped: &UnixStream, requests: Option<&UnixListener>, tick: Duration) -> Woken {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd as _;
    let mut fds = vec![PollFd::new(stopped.as_fd(), PollFlags::POLLIN)];
    if let Some(l) = requests {
        fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
    }
    let timeout = PollTimeout::try_from(tick).unwrap_or(PollTimeout::MAX);
    match poll(&mut fds, timeout) {
        Ok(_) if fds[0].any().unwrap_or(true) => Woken::Stop,
        Ok(_) => Woken::Look,
        Err(nix::errno::Errno::EINTR) => Woken::Look,
        // poll cannot fail otherwise on these descriptors; do not spin if it does.
        Err(_) => {
            std::thread::sleep(tick);
            Woken::Look
        }
    }
}

/// Where the delta's change counter stands ([`crate::store::change_seq`]: rows of the
/// filesystem's tables written by anyone), read on a connection of our own. The cheapest sign
/// of writes to the files there is; commits that leave them alone (Litestream's own tables
/// while the project replicates) do not count. A delta without the counter falls back to
/// `PRAGMA data_version`, which every other connection's commit moves. Opened before the
/// command starts, so its first writes count as a change.
pub struct Activity {
    conn: Option<rusqlite::Connection>,
    first: i64,
}

impl Activity {
    pub fn open(delta: &Path) -> Activity {
        let flags =
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut a = Activity {
            conn: rusqlite::Connection::open_with_flags(delta, flags).ok(),
            first: 0,
        };
        a.first = a.version();
        a
    }

    fn version(&self) -> i64 {
        let Some(c) = &self.conn else { return 0 };
        match crate::store::change_seq(c) {
            Ok(Some(seq)) => seq,
            _ => crate::store::data_version(c).unwrap_or(0),
        }
    }
}

fn watch(
    target: Target,
    timing: Timing,
    activity: Activity,
    requests: Option<UnixListener>,
    stopped: UnixStream,
) -> Stats {
    let mut stats = Stats::default();
    let mut history = match History::open(&target.store_dir) {
        Ok(h) => h,
        Err(e) => {
            tracing::error!("checkpoints are off for this run: {e}");
            return stats;
        }
    };
    let mut seen = activity.first;
    let mut last_change = Instant::now();
    let mut dirty_since: Option<Instant> = None;
    let mut waiting: Vec<UnixStream> = Vec::new();
    while wait(&stopped, requests.as_ref(), timing.tick()) == Woken::Look {
        if let Some(l) = &requests {
            accept(l, &mut waiting);
        }
        let now = Instant::now();
        let v = activity.version();
        if v != seen {
            seen = v;
            last_change = now;
            dirty_since.get_or_insert(now);
        }
        let why = if !waiting.is_empty() {
            Some(Why::Requested)
        } else {
            match (dirty_since, timing.idle) {
                (Some(_), Some(idle)) if now - last_change >= idle => Some(Why::Idle),
                (Some(first), Some(_)) if timing.ceiling.is_some_and(|c| now - first >= c) => {
                    Some(Why::Ceiling)
                }
                _ => None,
            }
        };
        let Some(why) = why else { continue };
        let taken = take(&target, &timing, &mut history, &activity, why);
        if let Ok(t) = &taken {
            // Changes committed before the walk began are in this checkpoint.
            if t.version != seen {
                seen = t.version;
                last_change = now;
            }
            dirty_since = None;
            stats.taken += 1;
            stats.walk_nice = t.walk_nice.or(stats.walk_nice);
            if let Some(us) = t.frozen_us {
                stats.frozen += 1;
                stats.frozen_us_max = stats.frozen_us_max.max(us);
            }
        }
        let reply = match &taken {
            Ok(t) => match t.frozen_us {
                Some(us) => format!("ok {} {us}\n", t.commit),
                None => format!("ok {}\n", t.commit),
            },
            Err(e) => {
                tracing::warn!("checkpoint failed: {e}");
                format!("err {e}\n")
            }
        };
        for mut s in waiting.drain(..) {
            let _ = s.write_all(reply.as_bytes());
        }
        if taken.is_ok() {
            if let Err(e) = history.prune_checkpoints(timing.keep) {
                tracing::warn!("checkpoint retention failed: {e}");
            }
        }
    }
    for mut s in waiting {
        let _ = s.write_all(b"err the sandbox ended before the checkpoint\n");
    }
    stats
}

/// Take every pending connection without blocking; each is one request.
fn accept(l: &UnixListener, waiting: &mut Vec<UnixStream>) {
    while let Ok((s, _)) = l.accept() {
        if waiting.len() >= MAX_WAITING || s.set_nonblocking(true).is_err() {
            continue;
        }
        waiting.push(s);
    }
}

/// A checkpoint taken: the commit holding the state (HEAD when nothing changed since), the
/// delta's data version the walk saw at least, and how long the sandbox was frozen.
struct Taken {
    commit: String,
    version: i64,
    /// From the write that froze the cgroup to the end of the write that thawed it.
    frozen_us: Option<u64>,
    /// The walk's nice value after the cut.
    walk_nice: Option<i32>,
}

/// One checkpoint: freeze, make the sandbox's writes durable, snapshot, thaw (always).
fn take(
    t: &Target,
    timing: &Timing,
    history: &mut History,
    activity: &Activity,
    why: Why,
) -> Result<Taken, String> {
    let started = Instant::now();
    let frozen = match &t.cgroup {
        Some(cg) => cg.freeze(timing.freeze_wait).map_err(|e| e.to_string()),
        None => Err("no cgroup for this run".to_string()),
    };
    // Thawed once the walk's read transaction holds its snapshot (the walk then reads a cut
    // nothing can enter any more), or after a failure before that. The rest of the walk,
    // hashing and compressing, then yields to the sandbox's work (see `snapshot`).
    let thawed = parking_lot::Mutex::new(None);
    let thaw = || {
        let mut thawed = thawed.lock();
        if let (Some(cg), Ok(()), None) = (&t.cgroup, &frozen, *thawed) {
            if let Err(e) = cg.thaw() {
                tracing::error!("thawing {}: {e}", cg.path().display());
            }
            *thawed = Some(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
        }
    };
    let walk_nice = parking_lot::Mutex::new(None);
    let on_cut = || {
        thaw();
        use crate::sys::priority;
        match priority::lower_this_thread(timing.nice).and_then(|()| priority::this_thread()) {
            Ok(n) => *walk_nice.lock() = Some(n),
            Err(e) => tracing::debug!("lowering the checkpoint's walk: {e}"),
        }
    };
    let walked = snapshot(t, history, activity, why, &frozen, &on_cut);
    thaw();
    let frozen_us = *thawed.lock();
    let nice = *walk_nice.lock();
    let (commit, version) = walked?;
    Ok(Taken {
        commit,
        version,
        frozen_us,
        walk_nice: nice,
    })
}

fn snapshot(
    t: &Target,
    history: &mut History,
    activity: &Activity,
    why: Why,
    frozen: &Result<(), String>,
    on_cut: &(dyn Fn() + Sync),
) -> Result<(String, i64), String> {
    // Dirty pages of the sandbox's writes go to the server, then its barrier commits them.
    let root = PathBuf::from(format!("/proc/{}/root", t.pid1))
        .join(t.source.strip_prefix("/").unwrap_or(t.source.as_path()));
    match std::fs::File::open(&root) {
        Ok(f) => {
            if let Err(e) = nix::unistd::syncfs(&f) {
                tracing::debug!("syncfs of the sandbox's mount: {e}");
            }
        }
        Err(e) => tracing::debug!("cannot open the sandbox's mount: {e}"),
    }
    if let Some(import) = &t.import {
        import()?;
    }
    t.server
        .sync()
        .map_err(|e| format!("the server's barrier failed: {e}"))?;
    let version = activity.version();
    let message = match frozen {
        Ok(()) => format!("{why:?} (frozen)").to_lowercase(),
        Err(e) => format!("{} (unfrozen: {e})", format!("{why:?}").to_lowercase()),
    };
    // The walk runs on a thread of its own, which `on_cut` lowers: a thread cannot raise its
    // priority back, and the watcher's freeze and the next cut run at the server's.
    let ignore = &t.ignore;
    let delta = &t.delta;
    let walked = std::thread::scope(|s| {
        let walk = std::thread::Builder::new()
            .name("checkpoint-walk".into())
            .spawn_scoped(s, || {
                let o = SnapOptions {
                    kind: CommitKind::Checkpoint,
                    only_if_changed: true,
                    on_cut: Some(on_cut),
                    ..SnapOptions::manual(&message, ignore)
                };
                history.snapshot(delta, &o)
            });
        match walk {
            Ok(w) => w
                .join()
                .unwrap_or_else(|_| Err("the checkpoint's walk panicked".to_string())),
            Err(e) => Err(format!("starting the checkpoint's walk: {e}")),
        }
    });
    let r = walked?;
    let h = match r.commit {
        Some(h) => h,
        None => history.head()?.ok_or("no snapshot")?,
    };
    Ok((hex(&h), version))
}

/// What `agentfs checkpoint` got back.
pub struct Reply {
    pub commit: String,
    /// How long the sandbox was frozen for it, in microseconds (None: unfrozen).
    pub frozen_us: Option<u64>,
}

/// `agentfs checkpoint` inside a sandbox: ask the watcher through the socket and wait for the
/// commit. Ok(None) outside a sandbox.
pub fn request() -> Result<Option<Reply>, String> {
    if std::env::var_os(crate::sandbox::request::SANDBOX_ENV).is_none() {
        return Ok(None);
    }
    let path = Path::new(SOCKET_DIR_IN_VIEW).join(SOCKET_NAME);
    let mut s = UnixStream::connect(&path)
        .map_err(|e| format!("checkpoint_unavailable: {}: {e}", path.display()))?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)
        .map_err(|e| format!("checkpoint_unavailable: {e}"))?;
    match reply.trim_end().split_once(' ') {
        Some(("ok", rest)) => {
            let mut words = rest.split(' ');
            let commit = words.next().unwrap_or_default().to_string();
            let frozen_us = words.next().and_then(|w| w.parse().ok());
            Ok(Some(Reply { commit, frozen_us }))
        }
        Some(("err", e)) => Err(format!("checkpoint_failed: {e}")),
        _ => Err("checkpoint_unavailable: the watcher closed the request unanswered".into()),
    }
}
