//! Handing standard output over to a readiness pipe; standard error to a log file.

use std::fs::File;
use std::os::fd::FromRawFd;

/// Take ownership of standard output as a File (for the one readiness line) and point fd 1 at
/// /dev/null, so nothing written later reaches the launcher's pipe.
pub fn take_stdout() -> Option<File> {
    // SAFETY: dup of fd 1 (always open in a spawned child); the new fd is owned by the File.
    let fd = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: both fds are valid; dup2 atomically replaces fd 1.
        unsafe { libc::dup2(null.as_raw_fd(), 1) };
    }
    Some(file)
}

/// Point fd 2 at `path` (created 0600 or appended to), so the log goes there.
pub fn stderr_to(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    // SAFETY: both fds are valid; dup2 atomically replaces fd 2 and `f` keeps its own fd.
    if unsafe { libc::dup2(f.as_raw_fd(), 2) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Restore the default action of SIGPIPE (Rust starts programs with it ignored), so a command
/// whose reader went away (`agentfs fs DB cat F | head -c1`) ends quietly, killed by the
/// signal like any Unix filter, instead of failing on the next write. Never for a server:
/// it must outlive a launcher that closed its end of the readiness pipe.
pub fn default_sigpipe() {
    // SAFETY: installing SIG_DFL for SIGPIPE has no preconditions; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}
