//! SIGINT / SIGTERM / SIGHUP handling for the server: blocked in every thread and received by
//! one waiting thread, so a signal turns into an orderly unmount instead of killing the process
//! mid-transaction.

/// Block the shutdown signals in the calling thread (and every thread it spawns afterwards).
pub fn block_shutdown_signals() {
    // SAFETY: sigset operations on a local, initialised set; pthread_sigmask on this thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Wait for one of the blocked shutdown signals and return its number.
pub fn wait_shutdown_signal() -> i32 {
    // SAFETY: as above; sigwait writes the received signal into `sig`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        let mut sig: libc::c_int = 0;
        if libc::sigwait(&set, &mut sig) != 0 {
            return libc::SIGTERM;
        }
        sig
    }
}

/// The signal that interrupts a transport thread's wait for a request (thread-directed only).
fn wake_signal() -> libc::c_int {
    libc::SIGRTMIN() + 2
}

extern "C" fn on_wake(_: libc::c_int) {}

/// Install the wake signal's handler, which does nothing: its only effect is that a read the
/// signal interrupts returns EINTR (no SA_RESTART). Idempotent.
pub fn install_wake() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction with a handler that touches nothing, an empty mask and
        // no flags; sigaction only replaces this signal's disposition.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_wake as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(wake_signal(), &sa, std::ptr::null_mut()) != 0 {
                tracing::warn!(
                    "cannot install the wake signal: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    });
}

/// Block (`true`) or unblock the wake signal in the calling thread. A thread keeps it blocked
/// except around the one system call it may interrupt, so no other call of the thread (a
/// database write, an fsync) ever sees EINTR from it; a signal sent meanwhile waits.
pub fn block_wake(block: bool) {
    // SAFETY: sigset operations on a local, initialised set; pthread_sigmask on this thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, wake_signal());
        let how = if block {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// The calling thread, for [`wake`].
pub fn this_thread() -> libc::pthread_t {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() }
}

/// Send the wake signal to `thread`. The caller guarantees the thread has not ended (it is
/// registered under a lock it removes itself from before it ends).
pub fn wake(thread: libc::pthread_t) {
    // SAFETY: per the caller's guarantee `thread` is a live thread of this process.
    unsafe {
        libc::pthread_kill(thread, wake_signal());
    }
}

/// Stop the calling process (SIGSTOP) until someone continues or kills it.
pub fn stop_self() {
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
}
