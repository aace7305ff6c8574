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

/// Stop the calling process (SIGSTOP) until someone continues or kills it.
pub fn stop_self() {
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
}
