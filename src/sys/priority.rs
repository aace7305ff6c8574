//! Scheduling priority and placement of one thread.

/// The calling thread's nice value.
pub fn this_thread() -> std::io::Result<i32> {
    this_thread_nice(nix::unistd::gettid().as_raw())
}

/// Lower the calling thread's priority to nice value `nice` (at most 19), unless it is already
/// that low. Only this thread changes, not its process: Linux keeps a nice value per thread. An
/// unprivileged thread cannot raise its priority back, so the caller lowers a thread that ends
/// with the work.
pub fn lower_this_thread(nice: i32) -> std::io::Result<()> {
    let tid = nix::unistd::gettid().as_raw();
    let Ok(who) = libc::id_t::try_from(tid) else {
        return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
    };
    let nice = nice.min(19);
    if this_thread_nice(tid)? >= nice {
        return Ok(());
    }
    // SAFETY: setpriority reads only its integer arguments; `who` is this thread's own id.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, nice) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Keep the calling thread on CPU `cpu` (only this thread, not its process).
pub fn pin_this_thread(cpu: usize) -> std::io::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(std::io::Error::from)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(std::io::Error::from)
}

/// The nice value of thread `tid` of this process (field 19 of its stat line).
fn this_thread_nice(tid: i32) -> std::io::Result<i32> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))?;
    // The fields after the command name (in parentheses, which may hold spaces) start at 3.
    stat.rfind(')')
        .and_then(|i| stat.get(i + 2..))
        .and_then(|rest| rest.split(' ').nth(16))
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice_of(tid: i32) -> i32 {
        this_thread_nice(tid).unwrap()
    }

    #[test]
    fn only_the_calling_thread_is_lowered() {
        let main = nix::unistd::gettid().as_raw();
        let before = nice_of(main);
        let lowered = std::thread::spawn(|| {
            lower_this_thread(7).unwrap();
            nice_of(nix::unistd::gettid().as_raw())
        })
        .join()
        .unwrap();
        assert_eq!(lowered, before.max(7));
        assert_eq!(nice_of(main), before);
    }
}
