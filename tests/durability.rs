//! fsync is a real barrier (counted fdatasync calls), a full disk is ENOSPC to the writer with a
//! consistent database, and a server killed mid-write comes back consistent.

mod common;

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use common::{assert_consistent, fuse_or_skip, Mounted};

fn count_calls(log: &Path, call: &str) -> usize {
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        // A call that blocks shows as "fdatasync(5 <unfinished ...>" then "<... fdatasync
        // resumed>": only the first line carries the opening parenthesis.
        .filter(|l| l.contains(&format!(" {call}(")))
        .count()
}

#[test]
fn every_fsync_reaches_a_real_fdatasync() {
    if !fuse_or_skip("every_fsync_reaches_a_real_fdatasync") {
        return;
    }
    if Command::new("strace").arg("-V").output().is_err() {
        assert!(
            !agentfs::knobs::get().require_fuse,
            "strace is required (validation/install-deps.sh)"
        );
        eprintln!("SKIP: strace not installed");
        return;
    }
    let log_dir = tempfile::tempdir_in(common::scratch_root()).unwrap();
    let log = log_dir.path().join("strace.log");
    let log_s = log.to_str().unwrap().to_string();
    let mut m = Mounted::wrapped(&[
        "strace",
        "-f",
        "-qq",
        "-e",
        "trace=fdatasync,fsync",
        "-o",
        &log_s,
    ]);
    let mut f = fs::File::create(m.path("f")).unwrap();
    // Let start-up settle, then count only what the fsyncs cause.
    f.write_all(b"warm").unwrap();
    f.sync_all().unwrap();
    let rounds = 5;
    let before = count_calls(&log, "fdatasync") + count_calls(&log, "fsync");
    for i in 0..rounds {
        f.write_all(format!("record {i}\n").as_bytes()).unwrap();
        f.sync_data().unwrap();
    }
    let after = count_calls(&log, "fdatasync") + count_calls(&log, "fsync");
    assert!(
        after - before >= rounds,
        "{rounds} fsyncs caused only {} fdatasync/fsync calls in the server",
        after - before
    );
    drop(f);
    m.unmount();
    assert_consistent(&m.db);
}

/// Kills a server by pid and clears its mount when a test ends, passing or failing.
struct KillOnDrop(u32, std::path::PathBuf);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if common::is_mounted(&self.1) {
            // SAFETY: signalling a child process this test started.
            unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
            common::force_cleanup(&self.1);
        }
    }
}

/// Mount a small tmpfs so the database's disk really fills up.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn new(size: &str) -> Self {
        let dir = tempfile::tempdir_in(common::scratch_root()).unwrap();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "agentfs-test",
                dir.path().to_str().unwrap(),
            ])
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount tmpfs");
        SmallDisk { dir }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

#[test]
fn a_full_disk_is_enospc_and_the_database_stays_consistent() {
    if !fuse_or_skip("a_full_disk_is_enospc_and_the_database_stays_consistent") {
        return;
    }
    let disk = SmallDisk::new("8m");
    let db = disk.dir.path().join("db.sqlite");
    let mnt_dir = tempfile::tempdir_in(common::scratch_root()).unwrap();
    let mnt = mnt_dir.path();
    let mut server = Command::new(common::bin())
        .args(["mount", db.to_str().unwrap(), mnt.to_str().unwrap(), "-f"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _cleanup = KillOnDrop(server.id(), mnt.to_path_buf());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !common::is_mounted(mnt) {
        assert!(std::time::Instant::now() < deadline, "mount did not appear");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let block = vec![0x5au8; 256 * 1024];
    let mut failure = None;
    'outer: for i in 0..100 {
        let p = mnt.join(format!("fill{i}"));
        let r = (|| -> std::io::Result<()> {
            let mut f = fs::File::create(&p)?;
            for _ in 0..4 {
                f.write_all(&block)?;
            }
            f.sync_all()
        })();
        if let Err(e) = r {
            failure = Some(e);
            break 'outer;
        }
    }
    let e = failure.expect("an 8 MiB disk must fill up");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "got {e}");
    // The server keeps serving: listing and reading what was synced work, and the failed
    // operation left nothing half-done.
    let names: Vec<_> = fs::read_dir(mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(!names.is_empty());
    assert_eq!(fs::read(mnt.join("fill0")).unwrap().len(), 4 * block.len());
    for i in 0..100 {
        let _ = fs::remove_file(mnt.join(format!("fill{i}")));
    }
    let out = common::agentfs(&["umount", mnt.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(common::wait_timeout(&mut server, std::time::Duration::from_secs(30)).is_some());
    common::force_cleanup(mnt);
    assert_consistent(&db);
}
