//! The processes of a sandbox and how they talk.
//!
//! - The supervisor (the caller of [`run`]) forks the outer child before it starts any thread,
//!   opens the project's database, then serves the FUSE connection it receives, forwards
//!   signals to pid 1, and records the run.
//! - The outer child creates the user namespace (rootless), then the mount and pid (and net)
//!   namespaces, forks pid 1 and passes its exit status on.
//! - Pid 1 opens /dev/fuse, builds the view (mounting the project and sending the connection to
//!   the supervisor over SCM_RIGHTS), pivots into it, starts the command with no capabilities,
//!   reaps orphans, forwards signals, and exits with the command's status.
//!
//! Messages inside→supervisor on a SOCK_SEQPACKET pair: `P<pid1>`, `F` + descriptor (answered
//! `A` once the server runs), `R` (the command started), `E<code\top\tpath\terror>`.

use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nix::sched::CloneFlags;

use super::audit::{self, AuditLog};
use super::history::RunHistory;
use super::plan::{self, Op};
use super::record::{self, LiveMarker, ReplicationRecord, RunRecord};
use super::request::{HomeMode, MountBackend, Net, SandboxRequest};
use super::upperdir;
use super::view::{self, Failure};
use super::{preflight, SandboxError};
use crate::dispatch::guard::Guard;
use crate::history::checkpoint::FreezeMode;
use crate::knobs::Knobs;
use crate::server::{self, ServeOptions};
use crate::store::upper::UpperError;
use crate::sys::ns::{self, Forked};

/// Who the command runs as.
#[derive(Clone, Copy)]
struct Ids {
    uid: u32,
    gid: u32,
    /// Started by root: the view is built as root, then the command's ids are taken.
    root: bool,
}

impl Ids {
    /// The caller's own ids; for root, SUDO_UID/SUDO_GID when set, else 65534 (never host uid
    /// 0 under another name).
    fn for_command() -> Ids {
        let (uid, gid) = crate::sys::ids::effective();
        if uid != 0 {
            return Ids {
                uid,
                gid,
                root: false,
            };
        }
        let var = |k: &str| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse::<u32>().ok())
                .filter(|v| *v != 0)
        };
        Ids {
            uid: var("SUDO_UID").unwrap_or(65534),
            gid: var("SUDO_GID").unwrap_or(65534),
            root: true,
        }
    }
}

fn io_err(what: &str, e: std::io::Error) -> SandboxError {
    SandboxError::Io(format!("{what}: {e}"))
}

fn send(sock: &UnixStream, msg: &[u8]) {
    let _ = (&*sock).write_all(msg);
}

fn send_failure(sock: &UnixStream, f: &Failure) {
    send(sock, format!("E{}", f.wire()).as_bytes());
}

/// Start a sandbox for `req`, run its command and tear everything down; returns the status to
/// propagate (the command's code, 128+N when killed by signal N).
pub fn run(req: &SandboxRequest, knobs: &Knobs) -> Result<i32, SandboxError> {
    preflight::check(req)?;
    // Litestream starts before the server and the history open their databases, so both leave
    // checkpoints to it from the first open. A replication that cannot start refuses the
    // launch: the command never runs unreplicated when replication was asked for.
    let replication = match &req.replicate {
        Some(url) => {
            Some(crate::replica::start(&req.db, url, knobs).map_err(SandboxError::Replication)?)
        }
        None => None,
    };
    let ids = Ids::for_command();
    let mut history = RunHistory::prepare(req, knobs)?;
    let mut viewed = req.clone();
    viewed.binds.push(history.view_bind());
    let plan = plan::build(&viewed, &plan::RealHost);
    std::fs::create_dir_all(req.project_dir.join("runs"))
        .map_err(|e| io_err(&req.project_dir.display().to_string(), e))?;
    let mut rec = new_record(req, &plan, ids);
    let audit = fence(req, knobs)?;
    rec.replication = replication.as_ref().map(|r| ReplicationRecord {
        url: req
            .replicate
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        litestream_pid: r.litestream_pid(),
        databases: r
            .dbs
            .iter()
            .map(|(d, u)| (d.clone(), u.to_string()))
            .collect(),
        ended: None,
    });

    let (sup, inside) = ns::seqpacket_pair().map_err(|e| io_err("socketpair", e))?;
    let supervisor = std::process::id() as i32;
    // Blocked before the fork: every process of the sandbox starts with these blocked, and
    // only the command unblocks them.
    ns::block_signals(&ns::FORWARDED);
    let (forked, born_inside) = fork_into(history.cgroup_path().as_deref());
    let outer = match forked {
        Ok(Forked::Child) => {
            drop(sup);
            ns::exit_now(outer_child(req, &plan, ids, &inside, supervisor))
        }
        Ok(Forked::Parent(p)) => p.as_raw(),
        Err(e) => {
            ns::unblock_signals(&ns::FORWARDED);
            return Err(io_err("fork", e));
        }
    };
    drop(inside);
    let guard = audit.as_ref().map(|(g, _)| g.clone());
    let child = Outer {
        pid: outer,
        born_inside,
    };
    let result = supervise(req, knobs, &sup, child, &mut rec, &mut history, guard);
    ns::unblock_signals(&ns::FORWARDED);
    if let Some((_, log)) = &audit {
        rec.escape_attempts = log.finish();
        if rec.escape_attempts > 0 {
            let log = audit::path(&req.project_dir);
            crate::errors::warn(
                crate::errors::Code::EscapeAttempt,
                &format!(
                    "{} change(s) outside the writable set refused; see {}",
                    rec.escape_attempts,
                    log.display()
                ),
                Some(&log),
            );
        }
    }
    record::remove_live(&req.project_dir, supervisor);
    rec.ended = Some(record::now());
    match &result {
        Ok(code) => rec.exit_status = Some(*code),
        Err(e) => rec.error = Some(format!("{}: {e}", e.code())),
    }
    rec.history = history.record.clone();
    // The server has committed its last barrier and the exit snapshot is taken: the last pass
    // ships both. Its failure is said and recorded; the command's status still goes out.
    if let (Some(r), Some(rr)) = (replication, rec.replication.as_mut()) {
        rr.ended = Some(match r.stop() {
            Ok(()) => "caught up".into(),
            Err(e) => {
                crate::errors::warn(e.code, &e.message, None);
                e.to_string()
            }
        });
    }
    if let Err(e) = rec.write(&req.project_dir) {
        tracing::warn!("cannot write the run record: {e}");
    }
    result
}

/// The server's fence inside the project and the audit log it reports to.
type Fence = (Arc<Guard>, Arc<AuditLog>);

/// The fence of `req`, when the writable set does not cover the project or escaping symlinks
/// are refused (docs/sandbox.md); None otherwise.
fn fence(req: &SandboxRequest, knobs: &Knobs) -> Result<Option<Fence>, SandboxError> {
    use std::os::unix::ffi::OsStrExt as _;
    let roots = req.policy.project_roots(&req.source);
    if req.backend == MountBackend::Overlayfs {
        // No server sees the changes: the kernel fences the project (its mount stays
        // read-only outside the writable roots) and nothing is logged; a symlink rule has
        // nobody to enforce it.
        if req.refuse_escaping_symlinks {
            return Err(SandboxError::PolicyUnenforceable(
                "escaping symlinks cannot be refused on the overlayfs backend this project runs on (no server sees them): launch with --symlinks allow".into(),
            ));
        }
        return Ok(None);
    }
    if roots.is_none() && !req.refuse_escaping_symlinks {
        return Ok(None);
    }
    let log = AuditLog::open(&req.project_dir, knobs.audit_max_events)
        .map(Arc::new)
        .map_err(|e| io_err(&audit::path(&req.project_dir).display().to_string(), e))?;
    let bytes = |p: &Path| p.as_os_str().as_bytes().to_vec();
    let sink = log.clone();
    let guard = Guard::new(
        bytes(&req.source),
        roots.map(|r| r.iter().map(|p| bytes(p)).collect()),
        req.refuse_escaping_symlinks,
        Box::new(move |r| sink.record(r)),
    );
    Ok(Some((Arc::new(guard), log)))
}

fn new_record(req: &SandboxRequest, plan: &[Op], ids: Ids) -> RunRecord {
    let (started, started_ns) = record::now_precise();
    let mut namespaces = vec!["user", "mount", "pid"];
    if req.net == Net::None {
        namespaces.push("net");
    }
    RunRecord {
        project: req.project.clone(),
        source: req.source.clone(),
        supervisor: std::process::id() as i32,
        namespaces: namespaces.into_iter().map(String::from).collect(),
        mounts: RunRecord::mounts_of(plan),
        masks: plan
            .iter()
            .filter(|o| matches!(o, Op::MaskFile { .. } | Op::MaskDir { .. }))
            .map(|o| o.path().to_path_buf())
            .collect(),
        writable_roots: req.policy.writable.clone(),
        net: match req.net {
            Net::Host => "host",
            Net::None => "none",
        }
        .into(),
        home: match req.home {
            HomeMode::Full => "full",
            HomeMode::FullRo => "full-ro",
            HomeMode::Empty => "empty",
        }
        .into(),
        uid_inside: ids.uid,
        gid_inside: ids.gid,
        uid_host: ids.uid,
        gid_host: ids.gid,
        backend: req.backend.as_str().into(),
        backend_reason: req.backend_reason.clone(),
        command: req
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        cwd: req.cwd.clone(),
        started,
        started_ns,
        ended: None,
        outcome: None,
        exit_status: None,
        error: None,
        history: Default::default(),
        escape_attempts: 0,
        replication: None,
    }
}

/// The sandbox's first process, as the supervisor forked it.
struct Outer {
    pid: i32,
    /// Created inside the run's cgroup (else the supervisor moves it in).
    born_inside: bool,
}

/// Fork a process of the sandbox: created inside the run's cgroup (`cgroup`, the checkpoint
/// freezer's) where the kernel lets it, which spares the move into it (an RCU grace period,
/// most of a launch's time); otherwise a plain fork, and the caller moves the child. Returns
/// the fork's outcome and whether the child was created inside the cgroup.
fn fork_into(cgroup: Option<&Path>) -> (std::io::Result<Forked>, bool) {
    if let Some(dir) = cgroup {
        match std::fs::File::open(dir)
            .and_then(|d| ns::fork_into_cgroup(std::os::fd::AsFd::as_fd(&d)))
        {
            Ok(f) => return (Ok(f), true),
            Err(e) => tracing::debug!(
                "not forked inside {} ({e}): the child is moved in",
                dir.display()
            ),
        }
    }
    (ns::fork(), false)
}

/// The supervisor's side: open the store, serve the connection pid 1 sends, wait for the end.
fn supervise(
    req: &SandboxRequest,
    knobs: &Knobs,
    sup: &UnixStream,
    child: Outer,
    rec: &mut RunRecord,
    history: &mut RunHistory,
    guard: Option<Arc<Guard>>,
) -> Result<i32, SandboxError> {
    let outer = child.pid;
    let adopted = if child.born_inside {
        Ok(())
    } else {
        history.adopt(outer)
    };
    let prepared = adopted.and_then(|_| {
        // The outer child forks pid 1 only after this: every process of the sandbox starts
        // inside its cgroup.
        send(sup, b"C");
        server::prepare(&req.db, false, knobs).map_err(preflight::store_error)
    });
    let prepared = match prepared {
        Ok(p) => p,
        Err(e) => {
            // Closing the socket tells pid 1 to stop before it mounts the project.
            let _ = nix::sys::socket::shutdown(
                std::os::fd::AsRawFd::as_raw_fd(sup),
                nix::sys::socket::Shutdown::Both,
            );
            let _ = ns::wait_child(outer);
            return Err(e);
        }
    };
    let server_store = prepared.store();
    let owner = crate::sys::ids::is_root().then_some((rec.uid_inside, rec.gid_inside));
    let ready = import_left_over(req, &server_store).and_then(|full| match (req.backend, full) {
        (MountBackend::Overlayfs, None) => export_upper(req, &server_store, owner),
        // The left-over upper is the current view: the run serves it as it is, so the command
        // can delete what filled the disk, and its end imports it.
        (MountBackend::Overlayfs, Some(e)) => {
            crate::errors::warn(
                crate::errors::Code::CapacityExhausted,
                &format!(
                    "{e}; this run works on a previous run's changes as they stand and takes \
                     them in at its end (free space, e.g. by deleting what filled the disk)"
                ),
                Some(&upperdir::upper_dir(&req.project_dir)),
            );
            upperdir::fresh_work(&req.project_dir, owner).map_err(|e| {
                SandboxError::Upper(format!("{}: {e}", upperdir::shown(&req.project_dir)))
            })
        }
        (MountBackend::Fuse, None) => Ok(()),
        (MountBackend::Fuse, Some(e)) => Err(SandboxError::UpperFull(format!(
            "{e}; the changes stay in {} until the database has space for them",
            upperdir::shown(&req.project_dir)
        ))),
    });
    if let Err(e) = ready {
        let _ = nix::sys::socket::shutdown(
            std::os::fd::AsRawFd::as_raw_fd(sup),
            nix::sys::socket::Shutdown::Both,
        );
        let _ = ns::wait_child(outer);
        return Err(e);
    }
    history.listen();
    send(sup, b"G");
    let mut prepared = Some(prepared);
    let mut server_thread = None;
    let mut failure: Option<SandboxError> = None;
    let mut pid1 = 0;
    let done = Arc::new(AtomicBool::new(false));
    let mut reset_seen = false;
    loop {
        let (msg, fd) = match ns::recv_msg(sup) {
            Ok(m) => m,
            // A sandbox side that ends with a message of ours unread makes the kernel report
            // ECONNRESET once, ahead of what it sent before ending (its refusal): read on.
            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) && !reset_seen => {
                reset_seen = true;
                continue;
            }
            Err(e) => {
                failure.get_or_insert(io_err("sandbox socket", e));
                break;
            }
        };
        let Some((&kind, rest)) = msg.split_first() else {
            break;
        };
        match kind {
            b'P' => pid1 = String::from_utf8_lossy(rest).parse().unwrap_or(0),
            b'F' => match (fd, prepared.take()) {
                (Some(fd), Some(p)) => {
                    let owner = (rec.uid_inside, rec.gid_inside);
                    server_thread = Some(start_server(
                        p,
                        fd,
                        &req.source,
                        mount_device(rest),
                        owner,
                        guard.clone(),
                        knobs,
                    ));
                    send(sup, b"A");
                }
                _ => {
                    failure.get_or_insert(SandboxError::Server("no FUSE connection".into()));
                    break;
                }
            },
            b'R' => {
                let marker = LiveMarker {
                    supervisor: std::process::id() as i32,
                    pid1,
                    server: std::process::id() as i32,
                    started: record::now(),
                    source: req.source.clone(),
                    cgroup: history.cgroup_path(),
                    replicate: req.replicate.as_ref().map(ToString::to_string),
                };
                let import = (req.backend == MountBackend::Overlayfs).then(|| {
                    let (store, source, dir) = (
                        server_store.clone(),
                        req.source.clone(),
                        req.project_dir.clone(),
                    );
                    Box::new(move || {
                        upperdir::import(&store, &source, &dir)
                            .map(|_| ())
                            .map_err(checkpoint_import_failed)
                    }) as crate::history::checkpoint::Importer
                });
                history.start(pid1, server_store.clone(), import);
                rec.history = history.record.clone();
                if let Err(e) = record::write_live(&req.project_dir, &marker) {
                    tracing::warn!("cannot write the live marker: {e}");
                }
                if let Err(e) = rec.write(&req.project_dir) {
                    tracing::warn!("cannot write the run record: {e}");
                }
                forward_signals(pid1, done.clone());
            }
            b'E' => {
                failure.get_or_insert(SandboxError::from_wire(&String::from_utf8_lossy(rest)));
            }
            _ => {}
        }
    }
    let status = ns::wait_child(outer).map_err(|e| io_err("waiting for the sandbox", e));
    done.store(true, Ordering::SeqCst);
    // A checkpoint in progress holds the mount open: the watcher ends first.
    history.stop();
    if req.backend == MountBackend::Overlayfs {
        // The mount died with the namespaces: what the upper holds goes into the delta, and
        // only once that committed does the upper go.
        let shown = upperdir::shown(&req.project_dir);
        let imported = upperdir::import(&server_store, &req.source, &req.project_dir)
            .and_then(|_| upperdir::remove(&req.project_dir).map_err(UpperError::from))
            .map_err(|e| {
                if e.full {
                    SandboxError::UpperFull(format!(
                    "{e}; the changes stay in {shown} and are taken in at the next launch once \
                     there is space"
                ))
                } else {
                    SandboxError::Upper(format!(
                        "{e}; the changes stay in {shown} for the next launch or `agentfs recover`"
                    ))
                }
            });
        drop(prepared);
        if let Some(f) = failure {
            return Err(f);
        }
        imported?;
        if let Err(e) = history.exit_snapshot(status.as_ref().ok().copied()) {
            exit_snapshot_failed(&e);
        }
        return status;
    }
    // The namespaces died with their last process, and the mount with them: the kernel ends
    // the connection and the server commits everything behind its barrier and returns.
    let served = server_thread.map(|t| t.join());
    if failure.is_none() && matches!(served, Some(Ok(Ok(())))) {
        if let Err(e) = history.exit_snapshot(status.as_ref().ok().copied()) {
            exit_snapshot_failed(&e);
        }
    }
    if let Some(f) = failure {
        return Err(f);
    }
    match served {
        Some(Ok(Ok(()))) => {}
        Some(Ok(Err(e))) => return Err(SandboxError::Server(e.to_string())),
        Some(Err(_)) => return Err(SandboxError::Server("the server thread panicked".into())),
        None => {
            return Err(SandboxError::Server(
                "the sandbox never mounted the project".into(),
            ))
        }
    }
    status
}

/// Before the mount, on either backend: an upper an overlayfs run left (it ended before
/// importing) goes into the delta, which a FUSE server would otherwise serve without it (a
/// project converted, or a launch that read the backend before a conversion). An import
/// that failed for lack of space in the database is handed back (the upper stays): the
/// caller decides whether the run can go on over it.
fn import_left_over(
    req: &SandboxRequest,
    store: &crate::store::Store,
) -> Result<Option<UpperError>, SandboxError> {
    let dir = &req.project_dir;
    if !upperdir::left_over(dir) {
        return Ok(None);
    }
    let context = "recovering a previous run's changes";
    match upperdir::import(store, &req.source, dir) {
        Ok(_) => upperdir::remove(dir)
            .map(|()| None)
            .map_err(|e| SandboxError::Upper(format!("{context}: {e}"))),
        Err(e) if e.full => Ok(Some(e.context(context))),
        Err(e) => Err(SandboxError::Upper(format!("{context}: {e}"))),
    }
}

/// A checkpoint's import of the upper directory failed: said as a capacity failure when the
/// database ran out of space.
fn checkpoint_import_failed(e: UpperError) -> String {
    if e.full {
        format!("{}: {e}", crate::errors::Code::CapacityExhausted.as_str())
    } else {
        e.message
    }
}

/// The overlayfs backend before the mount: the delta is exported into a fresh upper.
fn export_upper(
    req: &SandboxRequest,
    store: &crate::store::Store,
    owner: Option<(u32, u32)>,
) -> Result<(), SandboxError> {
    let dir = &req.project_dir;
    upperdir::export(store, &req.source, dir, owner).map_err(|e| {
        let _ = upperdir::remove(dir);
        SandboxError::Upper(format!(
            "exporting the delta into {}: {e}",
            upperdir::shown(dir)
        ))
    })
}

/// The FUSE mount's device as the sandbox side reported it with the connection ("major:minor"
/// after the "F"); never looked up by the project's path, which here names the host directory.
/// A FUSE superblock's device is anonymous (major 0): any other is not taken, so no report can
/// point the server at a block device.
fn mount_device(reported: &[u8]) -> server::MountDevice {
    std::str::from_utf8(reported)
        .ok()
        .and_then(|s| s.split_once(':'))
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
        .filter(|&(major, _)| major == 0)
        .map_or(server::MountDevice::Unknown, |(major, minor)| {
            server::MountDevice::Known(major, minor)
        })
}

/// Serve the project on `fd`, every inode owned by `owner`: the command's ids, which both
/// the mount's user namespace and the command's map to themselves (docs/sandbox.md).
fn start_server(
    p: server::Prepared,
    fd: OwnedFd,
    source: &Path,
    device: server::MountDevice,
    owner: (u32, u32),
    guard: Option<Arc<Guard>>,
    knobs: &Knobs,
) -> std::thread::JoinHandle<Result<(), server::ServerError>> {
    let mut knobs = knobs.clone();
    // The fence must see every open for writing: a kernel told once that OPEN is not
    // implemented sends none again, and a refused WRITE after a write(2) the page cache
    // took would be a failure reported as success.
    if guard.is_some() {
        knobs.fuse_noopen = false;
    }
    let opts = ServeOptions {
        mount_point: source.to_path_buf(),
        register: false,
        log: None,
        unmount_on_signal: false,
        owner: Some(owner),
        guard,
        device,
    };
    std::thread::spawn(move || p.serve(fd, &opts, &knobs, &mut ()))
}

/// Forward signals sent to the supervisor (not a terminal's, which reach the command's group
/// directly) to pid 1 until the run ends.
fn forward_signals(pid1: i32, done: Arc<AtomicBool>) {
    if pid1 <= 0 {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            while let Some(c) = ns::wait_signal(&ns::FORWARDED) {
                if done.load(Ordering::SeqCst) {
                    break;
                }
                if !c.from_kernel {
                    let _ = ns::kill(pid1, c.signal);
                }
            }
        });
}

/// The outer child: namespaces, then pid 1. Returns pid 1's status.
fn outer_child(
    req: &SandboxRequest,
    plan: &[Op],
    ids: Ids,
    sock: &UnixStream,
    supervisor: i32,
) -> i32 {
    // Without its supervisor the sandbox has no server: it goes when the supervisor goes, and
    // pid 1 goes with it (the pid namespace with pid 1).
    if !matches!(ns::die_with_parent(Some(supervisor)), Ok(true)) {
        return 1;
    }
    // Nothing is forked before the supervisor has moved this process into the sandbox's
    // cgroup (the checkpoint freezer), or refused the launch (the socket closes).
    let mut adopted = [0u8; 1];
    if !matches!((&*sock).read(&mut adopted), Ok(1)) || adopted[0] != b'C' {
        return 1;
    }
    let userns = |what: &str, e: std::io::Error| {
        send(sock, format!("Euserns_denied\t{what}: {e}").as_bytes());
        1
    };
    if !ids.root {
        if let Err(e) = ns::unshare(CloneFlags::CLONE_NEWUSER) {
            return userns("unshare(user)", e);
        }
        if let Err(e) = ns::map_self(ids.uid, ids.gid) {
            return userns("uid_map", e);
        }
    }
    let mut flags = CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWPID;
    if req.net == Net::None {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    if let Err(e) = ns::unshare(flags) {
        return userns("unshare(mount, pid)", e);
    }
    match ns::fork() {
        Ok(Forked::Child) => ns::exit_now(pid1(req, plan, ids, sock)),
        Ok(Forked::Parent(p)) => {
            send(sock, format!("P{}", p.as_raw()).as_bytes());
            ns::wait_child(p.as_raw()).unwrap_or(1)
        }
        Err(e) => userns("fork", e),
    }
}

/// Pid 1 of the sandbox.
fn pid1(req: &SandboxRequest, plan: &[Op], ids: Ids, sock: &UnixStream) -> i32 {
    let fail = |f: Failure| {
        send_failure(sock, &f);
        1
    };
    if ns::die_with_parent(None).is_err() {
        return 1;
    }
    if req.net == Net::None {
        if let Err(e) = ns::loopback_up() {
            return fail(Failure::new("mount_failed", "setup", Path::new("lo"), e));
        }
    }
    // Opened here, by a process of the user namespace that will own the mount (the kernel
    // refuses a connection opened in another one).
    let fuse = match fuse_for(req) {
        Ok(f) => f,
        Err(e) => {
            let e = std::io::Error::other(e.to_string());
            return fail(Failure::new(
                "mount_failed",
                "fuse",
                Path::new("/dev/fuse"),
                e,
            ));
        }
    };
    if let Err(f) = view::stage() {
        return fail(f);
    }
    let mut hand_over = |dst: &Path| -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        // The supervisor opens the database while the namespaces and the view so far are
        // built; nothing is mounted on it until it has (a database it cannot open closes the
        // socket, and the launch ends here, before the command).
        let mut go = [0u8; 1];
        if !matches!((&*sock).read(&mut go), Ok(1)) || go[0] != b'G' {
            return Err(std::io::Error::other("the server did not start"));
        }
        // Overlayfs: the upper is exported, the view mounts it.
        let Some(fuse) = &fuse else {
            return Ok(());
        };
        // Root builds the view as itself and runs the command as another id: both use it.
        ns::mount_fuse(dst, fuse.as_raw_fd(), ids.uid, ids.gid, ids.root)?;
        // The mount's device, for its readahead: "F" then "major:minor", or "F" alone when
        // it cannot be told (a stat that asked the server would wait for it: it has not got
        // the connection yet).
        let mut msg = b"F".to_vec();
        if let Ok((major, minor)) = ns::mount_device_unasked(dst) {
            msg.extend(format!("{major}:{minor}").bytes());
        }
        ns::send_fd(sock, fuse.as_fd(), &msg)?;
        let mut ack = [0u8; 1];
        match (&*sock).read(&mut ack) {
            Ok(1) if ack[0] == b'A' => Ok(()),
            _ => Err(std::io::Error::other("the server did not start")),
        }
    };
    if let Err(f) = view::apply(plan, (ids.uid, ids.gid), &mut hand_over) {
        return fail(f);
    }
    drop(fuse);
    if let Err(f) = view::enter() {
        return fail(f);
    }
    if ids.root {
        // A change of ids clears the parent-death signal: set it again.
        let step = ns::become_ids(ids.uid, ids.gid)
            .and_then(|_| ns::die_with_parent(None).map(|_| ()))
            .and_then(|_| ns::unshare(CloneFlags::CLONE_NEWUSER))
            .and_then(|_| ns::map_self(ids.uid, ids.gid));
        if let Err(e) = step {
            return fail(Failure::new("userns_denied", "setup", Path::new("user"), e));
        }
    }
    let (argv, extra_env) = command_line(req);
    match start_command(req, &argv, &extra_env) {
        Ok(child) => {
            send(sock, b"R");
            reap_until(child)
        }
        Err(msg) => {
            send(sock, format!("Ecommand_failed\t{msg}").as_bytes());
            127
        }
    }
}

/// /dev/fuse for a FUSE project; None on overlayfs.
fn fuse_for(req: &SandboxRequest) -> Result<Option<OwnedFd>, crate::sys::mount::MountError> {
    match req.backend {
        MountBackend::Fuse => crate::sys::mount::open_dev_fuse().map(Some),
        MountBackend::Overlayfs => Ok(None),
    }
}

/// The command to run: the request's, or the user's shell with a `[name]` prompt.
fn command_line(req: &SandboxRequest) -> (Vec<OsString>, Vec<(OsString, OsString)>) {
    if !req.command.is_empty() {
        return (req.command.clone(), vec![]);
    }
    let shell = req
        .env
        .iter()
        .find(|(k, _)| k == "SHELL")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| "/bin/sh".into());
    let name = Path::new(&shell)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prompt = format!(
        "PS1=\"[{}] $PS1\"\n",
        req.project.replace(['"', '\\', '$', '`'], "")
    );
    match name.as_str() {
        "bash" => {
            let rc = PathBuf::from("/tmp/.agentfs-bashrc");
            let text = format!("[ -f ~/.bashrc ] && . ~/.bashrc\n{prompt}");
            if std::fs::write(&rc, text).is_ok() {
                let argv = vec![shell, "--rcfile".into(), rc.into(), "-i".into()];
                return (argv, vec![]);
            }
            (vec![shell], vec![])
        }
        "zsh" => {
            let dir = PathBuf::from("/tmp/.agentfs-zsh");
            let text = format!("ZDOTDIR=\"$HOME\"\n[ -f ~/.zshrc ] && . ~/.zshrc\n{prompt}");
            let made = std::fs::create_dir_all(&dir)
                .and_then(|_| std::fs::write(dir.join(".zshrc"), text));
            let env = match made {
                Ok(()) => vec![("ZDOTDIR".into(), dir.into_os_string())],
                Err(_) => vec![],
            };
            (vec![shell], env)
        }
        _ => (vec![shell], vec![]),
    }
}

/// Fork the command: clean signal mask, no capabilities, no_new_privs, the request's
/// environment and directory. Returns its pid once it has exec'd, or why it could not.
fn start_command(
    req: &SandboxRequest,
    argv: &[OsString],
    extra_env: &[(OsString, OsString)],
) -> Result<i32, String> {
    let Some((prog, args)) = argv.split_first() else {
        return Err("an empty command".into());
    };
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| e.to_string())?;
    ns::block_signals(&[libc::SIGCHLD]);
    match ns::fork().map_err(|e| e.to_string())? {
        Forked::Child => {
            drop(r);
            ns::unblock_all();
            ns::take_terminal();
            let why = match ns::drop_privileges() {
                Err(e) => format!("dropping capabilities: {e}"),
                Ok(()) => {
                    let e = std::process::Command::new(prog)
                        .args(args)
                        .env_clear()
                        .envs(req.env.iter().map(|(k, v)| (k, v)))
                        .envs(extra_env.iter().map(|(k, v)| (k, v)))
                        .env(super::request::SANDBOX_ENV, &req.project)
                        .current_dir(&req.cwd)
                        .exec();
                    format!("{}: {e}", Path::new(prog).display())
                }
            };
            let _ = std::fs::File::from(w).write_all(why.as_bytes());
            ns::exit_now(127)
        }
        Forked::Parent(child) => {
            drop(w);
            let mut why = String::new();
            let _ = std::fs::File::from(r).read_to_string(&mut why);
            if why.is_empty() {
                Ok(child.as_raw())
            } else {
                let _ = ns::wait_child(child.as_raw());
                Err(why)
            }
        }
    }
}

/// Reap every child until `child` ends, forwarding signals sent by processes (not by the
/// terminal) to it; returns its status.
fn reap_until(child: i32) -> i32 {
    let mut watched: Vec<i32> = ns::FORWARDED.to_vec();
    watched.push(libc::SIGCHLD);
    loop {
        if let Some(code) = ns::reap(child) {
            return code;
        }
        match ns::wait_signal(&watched) {
            Some(c) if c.signal != libc::SIGCHLD && !c.from_kernel => {
                let _ = ns::kill(child, c.signal);
            }
            _ => {}
        }
    }
}

/// Run one command in the live sandbox of the project, joining its namespaces; without one,
/// run it in a sandbox of its own for its lifetime.
pub fn exec(req: &SandboxRequest, knobs: &Knobs) -> Result<i32, SandboxError> {
    match record::live(&req.project_dir) {
        Some(m) => {
            same_replication(req, &m)?;
            join(req, &m)
        }
        None => run(req, knobs),
    }
}

/// A command joining a live sandbox writes through that sandbox's server, so the sandbox's
/// replication is the one that covers it: asking for replication is accepted only when it
/// names the URL the sandbox already replicates to (`replicate_mismatch` otherwise).
fn same_replication(req: &SandboxRequest, live: &LiveMarker) -> Result<(), SandboxError> {
    let Some(want) = req.replicate.as_ref().map(ToString::to_string) else {
        return Ok(());
    };
    if live.replicate.as_deref() == Some(want.as_str()) {
        return Ok(());
    }
    let has = match &live.replicate {
        Some(u) => format!("replicates to {u}"),
        None => "is not replicated".into(),
    };
    Err(SandboxError::Replication(crate::project::Error::new(
        crate::errors::Code::ReplicateMismatch,
        format!(
            "the live sandbox of project {} (supervisor pid {}) {has}: a command joining it cannot replicate to {want}; join it without --replicate (and without [replicate] in config.toml), or end it first",
            req.project, live.supervisor
        ),
    )))
}

fn join(req: &SandboxRequest, live: &LiveMarker) -> Result<i32, SandboxError> {
    let ids = Ids::for_command();
    let open = |kind: &str| {
        let p = PathBuf::from(format!("/proc/{}/ns/{kind}", live.pid1));
        std::fs::File::open(&p).map_err(|e| io_err(&p.display().to_string(), e))
    };
    let user = open("user")?;
    let mnt = open("mnt")?;
    let pid = open("pid")?;
    let net = if req.net == Net::None {
        Some(open("net")?)
    } else {
        None
    };
    let (sup, inside) = ns::seqpacket_pair().map_err(|e| io_err("socketpair", e))?;
    ns::block_signals(&ns::FORWARDED);
    let (forked, born_inside) = fork_into(live.cgroup.as_deref());
    let joiner = match forked {
        Ok(Forked::Child) => {
            drop(sup);
            let setns = |f: &std::fs::File, k: CloneFlags| {
                nix::sched::setns(f, k).map_err(|e| std::io::Error::from_raw_os_error(e as i32))
            };
            // Into the sandbox's cgroup ("0" is the writer) unless created there, so
            // checkpoints freeze it too. Where that fails the command would run unfrozen:
            // refused under `require`, said under `auto`, as at launch.
            if let Some(cg) = live.cgroup.as_ref().filter(|_| !born_inside) {
                if let Err(e) = std::fs::write(cg.join("cgroup.procs"), "0") {
                    let why = format!("cannot join the sandbox's cgroup {}: {e}", cg.display());
                    let knob = &crate::knobs::get().checkpoint_freeze;
                    match FreezeMode::from_knob(knob) {
                        Ok(FreezeMode::Require) => {
                            send(&inside, format!("Efreezer_unavailable\t{why}").as_bytes());
                            ns::exit_now(125)
                        }
                        Ok(FreezeMode::Off) => {}
                        _ => send(
                            &inside,
                            format!("W{why}; checkpoints do not freeze this command").as_bytes(),
                        ),
                    }
                }
            }
            let mut step = Ok(());
            if !ids.root {
                step = setns(&user, CloneFlags::CLONE_NEWUSER);
            }
            step = step
                .and_then(|_| setns(&mnt, CloneFlags::CLONE_NEWNS))
                .and_then(|_| setns(&pid, CloneFlags::CLONE_NEWPID));
            if let Some(n) = &net {
                step = step.and_then(|_| setns(n, CloneFlags::CLONE_NEWNET));
            }
            if ids.root {
                step = step
                    .and_then(|_| ns::become_ids(ids.uid, ids.gid))
                    .and_then(|_| setns(&user, CloneFlags::CLONE_NEWUSER));
            }
            if let Err(e) = step {
                send(
                    &inside,
                    format!("Euserns_denied\tjoining the sandbox: {e}").as_bytes(),
                );
                ns::exit_now(1)
            }
            let (argv, extra_env) = command_line(req);
            let code = match start_command(req, &argv, &extra_env) {
                Ok(child) => reap_until(child),
                Err(msg) => {
                    send(&inside, format!("Ecommand_failed\t{msg}").as_bytes());
                    127
                }
            };
            ns::exit_now(code)
        }
        Ok(Forked::Parent(p)) => p.as_raw(),
        Err(e) => {
            ns::unblock_signals(&ns::FORWARDED);
            return Err(io_err("fork", e));
        }
    };
    drop(inside);
    let done = Arc::new(AtomicBool::new(false));
    forward_signals(joiner, done.clone());
    let mut failure = None;
    while let Ok((msg, _)) = ns::recv_msg(&sup) {
        match msg.split_first() {
            Some((b'E', rest)) => {
                failure.get_or_insert(SandboxError::from_wire(&String::from_utf8_lossy(rest)))
            }
            Some((b'W', rest)) => {
                // The only warning from inside: the command could not join the cgroup.
                crate::errors::warn(
                    crate::errors::Code::FreezerUnavailable,
                    &String::from_utf8_lossy(rest),
                    None,
                );
                continue;
            }
            Some(_) => continue,
            None => break,
        };
    }
    let status = ns::wait_child(joiner).map_err(|e| io_err("waiting for the command", e));
    done.store(true, Ordering::SeqCst);
    ns::unblock_signals(&ns::FORWARDED);
    match failure {
        Some(f) => Err(f),
        None => status,
    }
}

/// Say that the exit snapshot failed (the command's status still goes out), under the code
/// its error carries.
fn exit_snapshot_failed(e: &str) {
    let (code, why) = crate::errors::split(e).unwrap_or((crate::errors::Code::Other, e));
    crate::errors::warn(code, &format!("exit snapshot failed: {why}"), None);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_anonymous_device_reported_with_the_connection_is_taken() {
        use server::MountDevice::{Known, Unknown};
        assert_eq!(mount_device(b"0:49"), Known(0, 49));
        for bad in [
            &b"8:0"[..],
            b"254:1",
            b"",
            b"0",
            b"0:",
            b":1",
            b"0:1:2",
            b"a:b",
            b"\xff",
        ] {
            assert_eq!(mount_device(bad), Unknown, "{bad:?}");
        }
    }
}
