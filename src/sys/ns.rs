//! Namespaces, mounts and credentials for the sandbox: the calls that build a view and confine
//! the command in it. Each returns an `io::Error` naming nothing; the sandbox adds the operation
//! and path.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::unistd::{Gid, Pid, Uid};

fn nix_io(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Which process continues after [`fork`].
pub enum Forked {
    Parent(Pid),
    Child,
}

/// fork(2). The child must only run the sandbox's own code and then exit or exec.
pub fn fork() -> io::Result<Forked> {
    // SAFETY: the sandbox forks its supervisor before any thread exists (or, in a test harness,
    // with glibc, whose fork leaves the allocator usable); the child never returns into the
    // caller's code: it builds the view and execs or calls `exit_now`.
    match unsafe { nix::unistd::fork() }.map_err(nix_io)? {
        nix::unistd::ForkResult::Parent { child } => Ok(Forked::Parent(child)),
        nix::unistd::ForkResult::Child => Ok(Forked::Child),
    }
}

/// [`fork`] whose child starts inside the cgroup v2 directory open as `cgroup`: clone3(2) with
/// `CLONE_INTO_CGROUP`, which places the child as it is created. Moving a process in afterwards
/// (a write to `cgroup.procs`) takes the hierarchy's write lock, which waits for an RCU grace
/// period: 8–12 ms on this kind of machine, the largest part of a sandbox's launch. An error
/// (a kernel before 5.7, no permission, a cgroup that takes no processes) leaves no child: the
/// caller forks and moves the child instead.
pub fn fork_into_cgroup(cgroup: BorrowedFd<'_>) -> io::Result<Forked> {
    /// `struct clone_args` of the kernel's uapi (version 2, with `cgroup`).
    #[repr(C)]
    #[derive(Default)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
        set_tid: u64,
        set_tid_size: u64,
        cgroup: u64,
    }
    const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
    let fd =
        u64::try_from(cgroup.as_raw_fd()).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: fd,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without CLONE_VM and without a stack is fork(2): the child continues on a
    // copy of this stack and address space, and `args` outlives the call. The same rules as
    // [`fork`] hold (no other thread exists, or none holds the allocator). glibc's fork
    // handlers do not run; the child only runs the sandbox's own code and then execs or exits.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::from_ref(&args),
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match r {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => i32::try_from(pid)
            .map(|p| Forked::Parent(Pid::from_raw(p)))
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL)),
    }
}

/// Leave the process at once, without running destructors or atexit handlers that belong to
/// the parent's copy of the state.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit has no preconditions and does not return.
    unsafe { libc::_exit(code) }
}

pub fn unshare(flags: CloneFlags) -> io::Result<()> {
    nix::sched::unshare(flags).map_err(nix_io)
}

/// Join the namespace behind `/proc/<pid>/ns/<kind>`.
pub fn setns_path(path: &Path, kind: CloneFlags) -> io::Result<()> {
    let f = std::fs::File::open(path)?;
    nix::sched::setns(f, kind).map_err(nix_io)
}

/// Map `uid` and `gid` to themselves in the user namespace this process just created
/// (setgroups is denied first, as an unprivileged process must).
pub fn map_self(uid: u32, gid: u32) -> io::Result<()> {
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1\n"))?;
    std::fs::write("/proc/self/setgroups", "deny")?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1\n"))
}

/// Become `uid`/`gid` with no supplementary groups (root only).
pub fn become_ids(uid: u32, gid: u32) -> io::Result<()> {
    nix::unistd::setgroups(&[]).map_err(nix_io)?;
    nix::unistd::setresgid(Gid::from_raw(gid), Gid::from_raw(gid), Gid::from_raw(gid))
        .map_err(nix_io)?;
    nix::unistd::setresuid(Uid::from_raw(uid), Uid::from_raw(uid), Uid::from_raw(uid))
        .map_err(nix_io)?;
    // Changing ids makes the process undumpable, which hands /proc/self to root: the new
    // user's own uid_map would be out of reach.
    nix::sys::prctl::set_dumpable(true).map_err(nix_io)
}

/// Be killed when the parent thread exits; false when the parent `parent` is gone already.
pub fn die_with_parent(parent: Option<i32>) -> io::Result<bool> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(nix_io)?;
    Ok(parent.is_none_or(|p| nix::unistd::getppid().as_raw() == p))
}

/// Stop every mount event from travelling between this mount namespace and the host's.
pub fn make_private(path: &Path) -> io::Result<()> {
    mount(
        None::<&str>,
        path,
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(nix_io)
}

pub fn mount_tmpfs(path: &Path, mode: u32) -> io::Result<()> {
    let data = format!("mode={mode:o}");
    mount(
        Some("tmpfs"),
        path,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(nix_io)
}

/// Bind `src` (with everything mounted below it) onto `dst`.
pub fn bind(src: &Path, dst: &Path) -> io::Result<()> {
    mount(
        Some(src),
        dst,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(nix_io)
}

/// A fresh proc for the caller's pid namespace.
pub fn mount_proc(path: &Path) -> io::Result<()> {
    mount(
        Some("proc"),
        path,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(nix_io)
}

/// A private devpts instance with its own ptmx.
pub fn mount_devpts(path: &Path) -> io::Result<()> {
    mount(
        Some("devpts"),
        path,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=620"),
    )
    .map_err(nix_io)
}

/// The argument of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const AT_RECURSIVE: libc::c_uint = 0x8000;

/// Make the mount at `path` read-only (`recursive`: and every mount below it), or read-write
/// again (`writable`). The kernel refuses to clear read-only on a mount it locked.
pub fn set_readonly(path: &Path, readonly: bool, recursive: bool) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let attr = MountAttr {
        attr_set: if readonly { MOUNT_ATTR_RDONLY } else { 0 },
        attr_clr: if readonly { 0 } else { MOUNT_ATTR_RDONLY },
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: `c` is a valid NUL-terminated path and `attr` a live mount_attr of the size given;
    // mount_setattr only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Make the current directory the root: the old root is stacked on it and detached.
pub fn pivot_to_cwd() -> io::Result<()> {
    nix::unistd::pivot_root(".", ".").map_err(nix_io)?;
    umount2(".", MntFlags::MNT_DETACH).map_err(nix_io)?;
    nix::unistd::chdir("/").map_err(nix_io)
}

/// Switch the root to `new` and attach the old one at `new/<put_old>`.
pub fn pivot_root(new: &Path, put_old: &Path) -> io::Result<()> {
    nix::unistd::pivot_root(new, put_old).map_err(nix_io)
}

pub fn detach(path: &Path) -> io::Result<()> {
    umount2(path, MntFlags::MNT_DETACH).map_err(nix_io)
}

/// Mount a FUSE filesystem at `path` on the already-open /dev/fuse descriptor `fd`, owned by
/// `uid`/`gid` (the kernel checks that `fd` was opened in this user namespace). `allow_other`
/// lets processes of other ids use it (a root mounter building a view for another id).
pub fn mount_fuse(path: &Path, fd: RawFd, uid: u32, gid: u32, allow_other: bool) -> io::Result<()> {
    let mut data =
        format!("fd={fd},rootmode=40000,user_id={uid},group_id={gid},default_permissions");
    if allow_other {
        data.push_str(",allow_other");
    }
    let fstype = format!("fuse.{}", super::mount::FS_NAME);
    mount(
        Some(super::mount::FS_NAME),
        path,
        Some(fstype.as_str()),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(nix_io)
}

/// The device (major, minor) of the mount whose root is at `path` (followed as mount(2)
/// followed it), from what the kernel already holds: no field asked for (mask 0) and
/// `AT_STATX_DONT_SYNC`, either of which keeps a FUSE mount from asking its server, which may
/// not be serving the connection yet. EINVAL when `path` is not a mount's root.
pub fn mount_device_unasked(path: &Path) -> io::Result<(u32, u32)> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: statx is plain data, for which all zero bytes is a valid value.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a pointer to a statx the call fills.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            0,
            &mut st,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let root = u64::from(libc::STATX_ATTR_MOUNT_ROOT as u32);
    if st.stx_attributes_mask & root == 0 || st.stx_attributes & root == 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok((st.stx_dev_major, st.stx_dev_minor))
}

/// Kernel overlayfs at `path`: `lower` read-only under `upper` (changes) with overlayfs'
/// `work` directory, its own attributes in the `user.overlay.` namespace (`userxattr`, which
/// a user namespace requires; kernel-notes/overlayfs.md).
pub fn mount_overlay(lower: &Path, upper: &Path, work: &Path, path: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    // Option values escape the separators overlayfs splits on.
    let esc = |p: &Path| {
        let mut out = String::new();
        for c in String::from_utf8_lossy(p.as_os_str().as_bytes()).chars() {
            if matches!(c, ',' | ':' | '\\') {
                out.push('\\');
            }
            out.push(c);
        }
        out
    };
    let data = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        esc(lower),
        esc(upper),
        esc(work)
    );
    mount(
        Some("overlay"),
        path,
        Some("overlay"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(nix_io)
}

/// Send one descriptor over a Unix socket (SCM_RIGHTS) with the message `msg`.
pub fn send_fd(sock: &UnixStream, fd: BorrowedFd<'_>, msg: &[u8]) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [io::IoSlice::new(msg)];
    sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None).map_err(nix_io)?;
    Ok(())
}

/// Drop every capability (bounding, ambient, inheritable, permitted, effective) and set
/// no_new_privs, so nothing the process execs can regain one.
pub fn drop_privileges() -> io::Result<()> {
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    for cap in 0..=last {
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset reads a version-3 header and two data records, both live and of the
    // layout the kernel expects.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    nix::sys::prctl::set_no_new_privs().map_err(nix_io)
}

/// Bring the loopback interface up in the current network namespace.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket has no memory preconditions.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `s` is a fresh descriptor owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, b) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *b as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own for the duration of the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The signals the sandbox forwards to its command.
pub const FORWARDED: [i32; 7] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGWINCH,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

fn sigset(signals: &[i32]) -> libc::sigset_t {
    // SAFETY: sigset operations on a local set that sigemptyset initialises.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in signals {
            libc::sigaddset(&mut set, *s);
        }
        set
    }
}

/// Block `signals` in the calling thread (and threads and children it starts later).
pub fn block_signals(signals: &[i32]) {
    let set = sigset(signals);
    // SAFETY: a live, initialised set; pthread_sigmask only affects this thread.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Unblock `signals` in the calling thread.
pub fn unblock_signals(signals: &[i32]) {
    let set = sigset(signals);
    // SAFETY: a live, initialised set; pthread_sigmask only affects this thread.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
}

/// One signal taken from the blocked set: its number and whether the kernel sent it (a
/// terminal's ^C reaches the whole foreground group at once, so it is not forwarded again).
pub struct Caught {
    pub signal: i32,
    pub from_kernel: bool,
}

/// Wait for one of the blocked `signals`.
pub fn wait_signal(signals: &[i32]) -> Option<Caught> {
    let set = sigset(signals);
    // SAFETY: siginfo_t is plain data; sigwaitinfo fills it from a live set.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let n = libc::sigwaitinfo(&set, &mut info);
        if n < 0 {
            return None;
        }
        Some(Caught {
            signal: n,
            from_kernel: info.si_code == libc::SI_KERNEL,
        })
    }
}

pub fn kill(pid: i32, signal: i32) -> io::Result<()> {
    // SAFETY: kill has no memory preconditions.
    if unsafe { libc::kill(pid, signal) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether a process with this pid exists (it may belong to another user).
pub fn alive(pid: i32) -> bool {
    pid > 0
        && (kill(pid, 0).is_ok() || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

/// The state letter of process `pid` (/proc/PID/stat's third field: R, S, D, T, t, Z, ...).
pub fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Whether process `pid` exists and is not a zombie waiting to be reaped.
pub fn running(pid: i32) -> bool {
    alive(pid) && !matches!(state(pid), Some('Z') | None)
}

/// When process `pid` started, in Unix seconds (rounded down), from its start time in clock
/// ticks after boot (/proc/PID/stat's 22nd field) and the boot time (/proc/stat's btime).
pub fn started_at(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ticks: u64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&h| h > 0)?;
    Some(boot + ticks / hz as u64)
}

/// Whether process `pid` is the one a record written at `recorded` (Unix seconds) names: it
/// runs and started no later than that (a pid reused afterwards belongs to a younger process;
/// the second of slack covers both clocks rounding down).
pub fn same_process(pid: i32, recorded: u64) -> bool {
    running(pid) && started_at(pid).is_some_and(|t| t <= recorded + 1)
}

/// Whether process `pid` is the first process (pid 1) of a pid namespace below ours
/// (/proc/PID/status's NSpid ends in 1).
pub fn is_namespace_init(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let ids: Vec<String> = s
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))?
                .split_whitespace()
                .map(str::to_string)
                .collect();
            Some(ids.len() > 1 && ids.last().map(String::as_str) == Some("1"))
        })
        .unwrap_or(false)
}

/// Make the calling process's group the terminal's foreground group (an interactive shell
/// started in the sandbox takes the terminal it was given). Ignored when stdin is no terminal.
pub fn take_terminal() {
    // SAFETY: isatty/tcsetpgrp/getpgrp on fd 0 with no memory arguments; SIGTTOU is ignored
    // for the call so a background group may claim the terminal.
    unsafe {
        if libc::isatty(0) == 1 {
            let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::tcsetpgrp(0, libc::getpgrp());
            libc::signal(libc::SIGTTOU, old);
        }
    }
}

/// A pair of connected datagram-boundary sockets (SOCK_SEQPACKET), close-on-exec.
pub fn seqpacket_pair() -> io::Result<(UnixStream, UnixStream)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let (a, b) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(nix_io)?;
    Ok((UnixStream::from(a), UnixStream::from(b)))
}

/// Receive one message and the descriptor it carries, if any (marked close-on-exec). An
/// empty message means the other side closed.
pub fn recv_msg(sock: &UnixStream) -> io::Result<(Vec<u8>, Option<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut buf = vec![0u8; 8192];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let (n, fd) = loop {
        let mut iov = [io::IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                let mut fd = None;
                for c in msg.cmsgs().map_err(nix_io)? {
                    if let ControlMessageOwned::ScmRights(fds) = c {
                        for (i, raw) in fds.into_iter().enumerate() {
                            // SAFETY: the kernel installed `raw` in our table for this message;
                            // nothing else owns it. Extra descriptors are closed at once.
                            let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                            if i == 0 {
                                fd = Some(owned);
                            }
                        }
                    }
                }
                break (msg.bytes, fd);
            }
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(nix_io(e)),
        }
    };
    buf.truncate(n);
    Ok((buf, fd))
}

/// How a child ended, as a shell reports it: its code, or 128+N when signal N killed it.
pub fn wait_child(pid: i32) -> io::Result<i32> {
    use nix::sys::wait::{waitpid, WaitStatus};
    loop {
        match waitpid(Pid::from_raw(pid), None) {
            Ok(WaitStatus::Exited(_, code)) => return Ok(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Ok(128 + sig as i32),
            Ok(_) | Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(nix_io(e)),
        }
    }
}

/// Reap every child that has ended; returns the status of `main` once it is among them.
pub fn reap(main: i32) -> Option<i32> {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let mut found = None;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(p, code)) if p.as_raw() == main => found = Some(code),
            Ok(WaitStatus::Signaled(p, sig, _)) if p.as_raw() == main => {
                found = Some(128 + sig as i32)
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return found,
            Ok(_) => continue,
        }
    }
}

/// Unblock every signal in the calling thread (a command starts with a clean mask).
pub fn unblock_all() {
    for s in FORWARDED.iter().chain(&[libc::SIGCHLD, libc::SIGPIPE]) {
        // SAFETY: resetting a disposition to SIG_DFL has no preconditions.
        unsafe { libc::signal(*s, libc::SIG_DFL) };
    }
    // SAFETY: an empty, initialised set; pthread_sigmask only affects this thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fact the launch's message loop leans on: a peer that ends with a message unread
    /// makes the next receive fail with ECONNRESET once, and what it sent before ending is
    /// still there to read after that.
    #[test]
    fn a_reset_comes_once_ahead_of_the_last_message() {
        use std::io::Write as _;
        let (mut a, mut b) = seqpacket_pair().unwrap();
        a.write_all(b"G").unwrap();
        b.write_all(b"Erefused").unwrap();
        drop(b);
        let first = recv_msg(&a).err().and_then(|e| e.raw_os_error());
        assert_eq!(first, Some(libc::ECONNRESET));
        let got = recv_msg(&a).unwrap().0;
        assert_eq!(got, b"Erefused");
    }
}
