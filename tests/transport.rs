//! Both transports, proven from the kernel's side. The module parameter enable_uring is global,
//! so these tests hold a lock file while they set it, and restore it afterwards.

mod common;

use std::fs;
use std::path::Path;
use std::time::Duration;

use common::{fuse_or_skip, Mounted, UringParam, URING_PARAM as PARAM};

/// Sum of the CQ heads of the server's io_uring instances, from /proc/PID/fdinfo: the kernel's
/// own count of completions it delivered on the rings.
fn ring_completions(pid: u32) -> (usize, u64) {
    let mut rings = 0;
    let mut total = 0;
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return (0, 0);
    };
    for fd in fds.flatten() {
        let target = fs::read_link(fd.path()).unwrap_or_default();
        if !target.to_string_lossy().contains("io_uring") {
            continue;
        }
        rings += 1;
        let info = fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        for line in info.lines() {
            if let Some(v) = line.strip_prefix("CqHead:") {
                total += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    (rings, total)
}

fn workload(root: &Path) {
    fs::create_dir(root.join("w")).unwrap();
    for i in 0..200 {
        fs::write(root.join(format!("w/f{i}")), vec![i as u8; 5000]).unwrap();
    }
    for i in 0..200 {
        assert_eq!(
            fs::read(root.join(format!("w/f{i}"))).unwrap(),
            vec![i as u8; 5000]
        );
    }
    assert_eq!(fs::read_dir(root.join("w")).unwrap().count(), 200);
}

fn status_line(pid: u32) -> String {
    let out = common::agentfs(&["status"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with(&pid.to_string()))
        .unwrap_or_default()
        .to_string()
}

fn gate(mnt: &Path) {
    let out = std::process::Command::new("python3")
        .args(["validation/posix_gate.py", "--quick", mnt.to_str().unwrap()])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "posix gate:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_ring_carries_the_requests_when_the_kernel_offers_it() {
    if !fuse_or_skip("the_ring_carries_the_requests_when_the_kernel_offers_it") {
        return;
    }
    let Some(_param) = UringParam::set("Y") else {
        assert!(!agentfs::knobs::get().require_fuse, "cannot set {PARAM}");
        eprintln!("SKIP: {PARAM} not writable (kernel without FUSE_IO_URING)");
        return;
    };
    let mut m = Mounted::new();
    let pid = m.server_pid();
    let (rings, before) = ring_completions(pid);
    assert!(
        rings >= 1,
        "the server holds io_uring instances; {PARAM} is {:?}, agentfs status: {}",
        fs::read_to_string(PARAM).unwrap_or_default().trim(),
        status_line(pid)
    );
    workload(&m.mnt);
    gate(&m.mnt);
    let (_, after) = ring_completions(pid);
    assert!(
        after >= before + 400,
        "ring completions went {before} -> {after}"
    );
    std::thread::sleep(std::time::Duration::from_millis(700));
    let line = status_line(pid);
    assert!(line.contains("io-uring"), "status reports the ring: {line}");
    m.unmount();
    common::assert_consistent(&m.db);
}

#[test]
fn dev_fuse_serves_everything_when_the_ring_is_off() {
    if !fuse_or_skip("dev_fuse_serves_everything_when_the_ring_is_off") {
        return;
    }
    let Some(_param) = UringParam::set("N") else {
        eprintln!("SKIP: {PARAM} not writable");
        return;
    };
    let mut m = Mounted::new();
    let pid = m.server_pid();
    workload(&m.mnt);
    gate(&m.mnt);
    assert_eq!(ring_completions(pid).0, 0, "no rings without enable_uring");
    std::thread::sleep(std::time::Duration::from_millis(700));
    let line = status_line(pid);
    assert!(
        line.contains("dev-fuse"),
        "status reports /dev/fuse: {line}"
    );
    m.unmount();
}

#[test]
fn the_kill_switch_keeps_dev_fuse_even_when_offered() {
    if !fuse_or_skip("the_kill_switch_keeps_dev_fuse_even_when_offered") {
        return;
    }
    let Some(_param) = UringParam::set("Y") else {
        eprintln!("SKIP: {PARAM} not writable");
        return;
    };
    let mut m = Mounted::with_env(&[("AGENTFS_FUSE_URING", "0")]);
    workload(&m.mnt);
    assert_eq!(ring_completions(m.server_pid()).0, 0);
    m.unmount();
}

/// A write(2) in write-through mode waits for its WRITE's reply, so each hand-off to another
/// thread is latency the writer pays. A lone writer's WRITEs run on the transport thread that
/// read them, on both transports (proven by the server's count of requests it handed to
/// workers); a ring thread, the only reader of its queue, still hands over its fsyncs and
/// WRITEs and READs larger than 64 KiB.
#[test]
fn a_lone_writers_requests_run_where_they_are_read() {
    use std::io::Write;
    if !fuse_or_skip("a_lone_writers_requests_run_where_they_are_read") {
        return;
    }
    for ring in ["N", "Y"] {
        let Some(_param) = UringParam::set(ring) else {
            assert!(!agentfs::knobs::get().require_fuse, "cannot set {PARAM}");
            eprintln!("SKIP: {PARAM} not writable");
            return;
        };
        let mut m = Mounted::with_env(&[("AGENTFS_FUSE_WRITEBACK_CACHE", "0")]);
        let pid = m.server_pid();
        let before = common::settled_record(pid);
        let mut f = fs::File::create(m.path("f")).unwrap();
        for i in 0..1000u32 {
            f.write_all(&[i as u8; 4096]).unwrap();
        }
        for _ in 0..20 {
            f.sync_all().unwrap();
        }
        drop(f);
        let after = common::settled_record(pid);
        let served = (after.ring_requests + after.devfuse_requests)
            - (before.ring_requests + before.devfuse_requests);
        let handed = after.worker_requests - before.worker_requests;
        assert!(
            served >= 1020,
            "enable_uring={ring}: {served} requests served"
        );
        assert!(
            handed < 100,
            "enable_uring={ring}: {handed} of {served} requests went to a worker"
        );
        if ring == "Y" {
            assert_eq!(after.transport, "io-uring");
            assert!(
                handed >= 20,
                "the ring hands its fsyncs to workers: {handed}"
            );
        }
        let back = fs::read(m.path("f")).unwrap();
        assert_eq!(back.len(), 1000 * 4096);
        assert!(back
            .chunks(4096)
            .enumerate()
            .all(|(i, c)| c == [i as u8; 4096]));
        // Writeback-sized WRITEs may wait for the pending-byte cap: a ring thread hands them on.
        let mut big = fs::File::create(m.path("big")).unwrap();
        for i in 0..8u8 {
            big.write_all(&vec![i; 1 << 20]).unwrap();
        }
        drop(big);
        let last = common::settled_record(pid);
        let handed = last.worker_requests - after.worker_requests;
        if ring == "Y" {
            assert!(handed >= 4, "8 WRITEs of 1 MiB, {handed} handed to workers");
        }
        assert_eq!(fs::metadata(m.path("big")).unwrap().len(), 8 << 20);
        // Large READs (readahead's) leave the ring thread for a worker, so the next one can be
        // served beside it; on /dev/fuse the transport threads serve them side by side already.
        let f = fs::File::open(m.path("big")).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: fadvise on a descriptor this test owns; it only drops clean cached pages.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
        drop(f);
        let before_read = common::settled_record(pid);
        let back = fs::read(m.path("big")).unwrap();
        assert!(back
            .chunks(1 << 20)
            .enumerate()
            .all(|(i, c)| c.iter().all(|&b| b == i as u8)));
        let read = common::settled_record(pid);
        let handed = read.worker_requests - before_read.worker_requests;
        if ring == "Y" {
            assert!(
                handed >= 4,
                "8 MiB read back, {handed} READs handed to workers"
            );
        } else {
            assert!(handed < 4, "/dev/fuse: {handed} READs handed to workers");
        }
        m.unmount();
    }
}

/// Run `op` on another thread and give up after `limit`: a request the server never answers
/// fails the test instead of hanging it (the mount's cleanup then aborts the connection, which
/// frees the stuck thread).
fn within<T: Send + 'static>(
    what: &str,
    limit: Duration,
    op: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(op());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what}: no answer within {limit:?}"))
}

/// The server's stderr goes to `server.log` beside the database.
const LOG_TO_FILE: [&str; 4] = ["sh", "-c", r#"exec "$@" 2>>"${3%/*}/server.log""#, "sh"];

/// A panic while handling a request (injected through AGENTFS_FAULT_PANIC) is answered with
/// EIO and logged with its opcode, and the server keeps serving, on both transports: in place
/// on the thread that read the request (LOOKUP and MKDIR of the name "boom") and on a worker
/// (FSYNC, which a ring thread always hands over). Each is repeated more often than a ring has
/// entries, so an entry that did not come back would stall the ring.
#[test]
fn a_panicking_request_gets_eio_and_serving_goes_on() {
    use std::io::Write;
    if !fuse_or_skip("a_panicking_request_gets_eio_and_serving_goes_on") {
        return;
    }
    let limit = Duration::from_secs(20);
    for ring in ["N", "Y"] {
        let Some(_param) = UringParam::set(ring) else {
            assert!(!agentfs::knobs::get().require_fuse, "cannot set {PARAM}");
            eprintln!("SKIP: {PARAM} not writable");
            return;
        };
        for fault in ["boom", "fsync"] {
            let mut m = Mounted::build(&[("AGENTFS_FAULT_PANIC", fault)], &LOG_TO_FILE);
            let mnt = m.mnt.clone();
            let errors = within("the faulty calls", limit, move || {
                let mut errors = Vec::new();
                for i in 0..20u8 {
                    let e = if fault == "boom" {
                        let _ = fs::metadata(mnt.join("boom")).map(|_| ());
                        fs::create_dir(mnt.join("boom")).err()
                    } else {
                        let mut f = fs::File::create(mnt.join(format!("f{i}"))).unwrap();
                        f.write_all(&[i; 4096]).unwrap();
                        f.sync_all().err()
                    };
                    errors.push(e.and_then(|e| e.raw_os_error()));
                }
                errors
            });
            assert!(
                errors.iter().all(|e| *e == Some(libc::EIO)),
                "enable_uring={ring} fault {fault}: {errors:?}"
            );
            let mnt = m.mnt.clone();
            within("the calls after", limit, move || {
                fs::create_dir(mnt.join("ok")).unwrap();
                fs::write(mnt.join("ok/file"), b"still serving").unwrap();
                assert_eq!(fs::read(mnt.join("ok/file")).unwrap(), b"still serving");
            });
            if fault == "fsync" {
                assert_eq!(fs::read(m.path("f19")).unwrap(), [19u8; 4096]);
            }
            if ring == "Y" {
                assert!(ring_completions(m.server_pid()).0 >= 1, "the ring was used");
            }
            let started = std::time::Instant::now();
            m.unmount();
            eprintln!(
                "enable_uring={ring} fault {fault}: unmounted in {:?}",
                started.elapsed()
            );
            let log = fs::read_to_string(m.dir.path().join("server.log")).unwrap();
            let op = if fault == "boom" {
                "FUSE_LOOKUP"
            } else {
                "FUSE_FSYNC"
            };
            assert!(
                log.lines().any(|l| l.contains("panicked")
                    && l.contains(op)
                    && l.contains("answered EIO")),
                "enable_uring={ring}: the log names the opcode:\n{log}"
            );
        }
    }
}
