//! fsync is a real barrier (counted fdatasync calls), a full disk is ENOSPC to the writer with a
//! consistent database, and a server killed mid-write comes back consistent.

mod common;

use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

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
fn every_fsync_reaches_a_real_fdatasync_and_an_idle_barrier_skips_it() {
    if !fuse_or_skip("every_fsync_reaches_a_real_fdatasync_and_an_idle_barrier_skips_it") {
        return;
    }
    // No durability window: only the barriers below sync.
    let Some((mut m, _log_dir, log)) = traced(&["AGENTFS_DURABILITY_WINDOW_MS=0"]) else {
        return;
    };
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
    // A barrier with nothing committed since the last one has nothing to make durable: the
    // server skips the fdatasync. A change (here a namespace operation) makes the next one
    // sync again.
    let calls = || count_calls(&log, "fdatasync") + count_calls(&log, "fsync");
    let before = calls();
    f.sync_data().unwrap();
    f.sync_all().unwrap();
    fsync_dir(&m.mnt);
    assert_eq!(calls(), before, "barriers with nothing new still synced");
    fs::create_dir(m.path("d")).unwrap();
    fsync_dir(&m.mnt);
    assert!(calls() > before, "a barrier after a mkdir did not sync");
    let before = calls();
    fsync_dir(&m.mnt);
    assert_eq!(
        calls(),
        before,
        "a second directory fsync with nothing new synced"
    );
    drop(f);
    m.unmount();
    assert_consistent(&m.db);
}

/// fsync(2) of a directory: FSYNCDIR, a barrier (syncfs(2) reaches only virtiofs servers).
fn fsync_dir(dir: &Path) {
    fs::File::open(dir).unwrap().sync_all().unwrap();
}

/// A mount whose server runs under strace with the knobs `env` (NAME=VALUE), logging its
/// fdatasync, fsync and sync_file_range calls with the file each names (-y); None (a skip)
/// without strace.
fn traced(env: &[&str]) -> Option<(Mounted, tempfile::TempDir, PathBuf)> {
    traced_calls(env, "fdatasync,fsync,sync_file_range")
}

/// [`traced`], logging the system calls `calls` (strace's comma-separated list).
fn traced_calls(env: &[&str], calls: &str) -> Option<(Mounted, tempfile::TempDir, PathBuf)> {
    if Command::new("strace").arg("-V").output().is_err() {
        assert!(
            !agentfs::knobs::get().require_fuse,
            "strace is required (validation/install-deps.sh)"
        );
        eprintln!("SKIP: strace not installed");
        return None;
    }
    let log_dir = tempfile::tempdir_in(common::scratch_root()).unwrap();
    let log = log_dir.path().join("strace.log");
    let log_s = log.to_str().unwrap().to_string();
    let trace = format!("trace={calls}");
    let mut wrapper = vec!["env"];
    wrapper.extend_from_slice(env);
    wrapper.extend_from_slice(&["strace", "-f", "-qq", "-y", "-e", &trace, "-o", &log_s]);
    Some((Mounted::wrapped(&wrapper), log_dir, log))
}

/// fdatasync calls on the database's -wal file in a strace log.
fn wal_syncs(log: &Path) -> usize {
    wal_calls(log, "fdatasync")
}

/// Calls of `syscall` on the database's -wal file in a strace log.
fn wal_calls(log: &Path, syscall: &str) -> usize {
    let call = format!(" {syscall}(");
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&call) && l.contains("-wal>"))
        .count()
}

/// A long write's WAL frames are started for the disk as the WAL grows
/// (`AGENTFS_WAL_WRITEBACK_KIB`): sync_file_range on the -wal, never an fdatasync, which stays
/// the barrier's. With the knob at 0 there is none.
#[test]
fn a_long_write_starts_the_wals_disk_writes_before_any_barrier() {
    if !fuse_or_skip("a_long_write_starts_the_wals_disk_writes_before_any_barrier") {
        return;
    }
    for (every_kib, expect) in [("1024", true), ("0", false)] {
        // No durability window: nothing but a barrier may sync.
        let knob = format!("AGENTFS_WAL_WRITEBACK_KIB={every_kib}");
        let Some((mut m, _log_dir, log)) = traced(&["AGENTFS_DURABILITY_WINDOW_MS=0", &knob])
        else {
            return;
        };
        let synced = wal_syncs(&log);
        let data = pattern(16 << 20, 3);
        let mut f = fs::File::create(m.path("long")).unwrap();
        f.write_all(&data).unwrap();
        // The 16 MiB are committed in a few transactions (each may start one writeback) within
        // the batch window; the writebacks follow at once.
        let deadline = Instant::now() + Duration::from_secs(15);
        while expect && wal_calls(&log, "sync_file_range") < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if !expect {
            std::thread::sleep(Duration::from_millis(1000));
        }
        let started = wal_calls(&log, "sync_file_range");
        if expect {
            assert!(
                started >= 2,
                "16 MiB written, {started} writeback starts of the WAL"
            );
        } else {
            assert_eq!(
                started, 0,
                "writeback started with AGENTFS_WAL_WRITEBACK_KIB=0"
            );
        }
        assert_eq!(
            wal_syncs(&log),
            synced,
            "a writeback start was an fdatasync"
        );
        // The barrier is still one.
        f.sync_all().unwrap();
        assert!(
            wal_syncs(&log) > synced,
            "fsync made no fdatasync of the WAL"
        );
        drop(f);
        m.unmount();
        m.mount();
        assert_eq!(fs::read(m.path("long")).unwrap(), data);
        m.unmount();
    }
}

/// The server's WAL frames reach the file in writes of many frames (`AGENTFS_WAL_GATHER`),
/// not as SQLite's two writes per 4 KiB page, and read back whole after a remount.
#[test]
fn the_wals_frames_are_gathered_into_large_writes() {
    if !fuse_or_skip("the_wals_frames_are_gathered_into_large_writes") {
        return;
    }
    let pages = 2048; // 8 MiB of data: at least one WAL frame per 4 KiB.
    for (gather, gathered) in [("1", true), ("0", false)] {
        let knob = format!("AGENTFS_WAL_GATHER={gather}");
        let Some((mut m, _log_dir, log)) = traced_calls(&[&knob], "pwrite64") else {
            return;
        };
        let data = pattern(pages * 4096, 5);
        let mut f = fs::File::create(m.path("gathered")).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        drop(f);
        let writes = wal_calls(&log, "pwrite64");
        eprintln!("{knob}: {writes} writes to the WAL for {pages} pages");
        if gathered {
            assert!(
                writes * 8 <= pages,
                "{writes} writes to the WAL for {pages} pages with {knob}"
            );
        } else {
            assert!(
                writes >= 2 * pages,
                "{writes} writes to the WAL for {pages} pages with {knob}"
            );
        }
        m.unmount();
        m.mount();
        assert_eq!(fs::read(m.path("gathered")).unwrap(), data);
        m.unmount();
    }
}

/// Calls of `syscall` on the main database file in a strace log.
fn db_calls(log: &Path, syscall: &str) -> usize {
    let call = format!(" {syscall}(");
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&call) && l.contains("/db.sqlite>"))
        .count()
}

/// The checkpoint thread copies the WAL's pages into the database file in writes of many
/// pages, reading the WAL ahead (`AGENTFS_WAL_GATHER`), not one read and one write per 4 KiB
/// page; what it copied reads back whole while the mount runs and after a remount.
#[test]
fn a_checkpoints_copies_are_gathered_into_large_writes() {
    if !fuse_or_skip("a_checkpoints_copies_are_gathered_into_large_writes") {
        return;
    }
    let pages = 4096; // 16 MiB of data, four times the checkpoint threshold below.
    for (gather, gathered) in [("1", true), ("0", false)] {
        let knob = format!("AGENTFS_WAL_GATHER={gather}");
        let env = [&knob as &str, "AGENTFS_WAL_CHECKPOINT_PAGES=1000"];
        let Some((mut m, _log_dir, log)) = traced_calls(&env, "pwrite64,pread64") else {
            return;
        };
        let data = pattern(pages * 4096, 9);
        let mut f = fs::File::create(m.path("copied")).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        drop(f);
        // The thread copies at least the file's pages: wait until its writes stop.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = (0, Instant::now());
        while Instant::now() < deadline {
            let now = db_calls(&log, "pwrite64");
            if now != seen.0 {
                seen = (now, Instant::now());
            } else if now > 0 && seen.1.elapsed() > Duration::from_millis(500) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let (writes, reads) = (db_calls(&log, "pwrite64"), wal_calls(&log, "pread64"));
        eprintln!("{knob}: {writes} writes to the database, {reads} reads of the WAL");
        if gathered {
            assert!(
                (1..=pages / 8).contains(&writes),
                "{writes} writes to the database file for {pages} pages with {knob}"
            );
            // Ahead only in file order: frames a spilled transaction left out of order are
            // read one by one (714 seen at an 8 MiB budget, whose small page cache spills
            // more; 308 at the default). Without gathering, one read per page copied.
            assert!(
                reads <= pages / 4,
                "{reads} reads of the WAL for {pages} pages with {knob}"
            );
        } else {
            // One per page SQLite copied; how many it copied by the time the thread's writes
            // stop varies with the budget (3,697 of 4,096 seen at 8 MiB).
            assert!(
                writes >= pages / 2,
                "{writes} writes to the database file for {pages} pages with {knob}"
            );
        }
        assert_eq!(fs::read(m.path("copied")).unwrap(), data);
        m.unmount();
        m.mount();
        assert_eq!(fs::read(m.path("copied")).unwrap(), data);
        m.unmount();
    }
}

#[test]
fn committed_work_is_made_durable_within_the_window_and_an_idle_mount_syncs_nothing() {
    if !fuse_or_skip(
        "committed_work_is_made_durable_within_the_window_and_an_idle_mount_syncs_nothing",
    ) {
        return;
    }
    let Some((mut m, _log_dir, log)) = traced(&["AGENTFS_DURABILITY_WINDOW_MS=1000"]) else {
        return;
    };
    // Whatever start-up committed is made durable by its window; let that pass.
    std::thread::sleep(Duration::from_millis(2500));
    let before = wal_syncs(&log);
    // Committed (namespace batches commit within milliseconds), never fsynced.
    for i in 0..20 {
        fs::create_dir(m.path(&format!("d{i}"))).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while wal_syncs(&log) == before {
        assert!(
            Instant::now() < deadline,
            "committed work was not made durable without a barrier"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Nothing committed since: the window finds nothing to sync.
    let idle = wal_syncs(&log);
    std::thread::sleep(Duration::from_millis(3500));
    assert_eq!(wal_syncs(&log), idle, "an idle mount made fdatasync calls");
    m.unmount();
}

#[test]
fn syncfs_pushes_written_pages_but_is_no_barrier_and_fsync_is() {
    if !fuse_or_skip("syncfs_pushes_written_pages_but_is_no_barrier_and_fsync_is") {
        return;
    }
    // No durability window: only barriers sync.
    let Some((mut m, _log_dir, log)) = traced(&[
        "AGENTFS_DURABILITY_WINDOW_MS=0",
        "AGENTFS_FUSE_WRITEBACK_CACHE=1",
    ]) else {
        return;
    };
    let calls = || count_calls(&log, "fdatasync") + count_calls(&log, "fsync");
    fs::write(m.path("f"), b"old").unwrap();
    fsync_dir(&m.mnt);
    // New bytes in the kernel's page cache (writeback cache), and a committed mkdir.
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(m.path("f"))
        .unwrap();
    f.write_all(b"new bytes").unwrap();
    fs::create_dir(m.path("d")).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let before = calls();
    let dir = fs::File::open(&m.mnt).unwrap();
    // SAFETY: syncfs on an fd this test owns.
    assert_eq!(unsafe { libc::syncfs(dir.as_raw_fd()) }, 0);
    // syncfs made the kernel send the dirty pages (WRITEs): another process sees them once
    // group commit committed them...
    let db = m.db.to_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = common::agentfs(&["fs", &db, "cat", "/f"]);
        if out.stdout == b"new bytes" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "syncfs did not push the page cache: `fs cat` printed {:?} (stderr {:?}), the mount reads {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            fs::read(m.path("f")).map(|b| String::from_utf8_lossy(&b).into_owned()),
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // ...but the server was never asked to make anything durable.
    assert_eq!(calls(), before, "syncfs reached the server as a barrier");
    f.sync_all().unwrap();
    assert!(calls() > before, "fsync is a barrier");
    drop((f, dir));
    m.unmount();
}

#[test]
fn umount_returns_after_the_final_commit() {
    if !fuse_or_skip("umount_returns_after_the_final_commit") {
        return;
    }
    let mut m = Mounted::new();
    let n = 100;
    for i in 0..n {
        fs::write(m.path(&format!("f{i}")), format!("old {i}\n")).unwrap();
    }
    // `sed -i` on every file: a temporary written, renamed over the original; no fsync.
    for i in 0..n {
        let tmp = m.path(&format!(".f{i}.tmp"));
        fs::write(&tmp, format!("new {i}\n")).unwrap();
        fs::rename(&tmp, m.path(&format!("f{i}"))).unwrap();
    }
    m.unmount();
    // At once: the database file alone holds every operation (the WAL is folded in).
    let wal = m.dir.path().join("db.sqlite-wal");
    assert_eq!(
        fs::metadata(&wal).map(|md| md.len()).unwrap_or(0),
        0,
        "WAL left over"
    );
    let db = m.db.to_str().unwrap().to_string();
    for i in 0..n {
        let out = common::agentfs(&["fs", &db, "cat", &format!("/f{i}")]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("new {i}\n"),
            "f{i} right after umount"
        );
    }
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
    // When the failed commit carried acknowledged work (a namespace batch, a group commit of
    // written bytes), the failure is sticky and the unmount reports what was lost; otherwise
    // it is clean.
    let out = common::agentfs(&["umount", mnt.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || said.contains("lost: ") && said.contains("acknowledged"),
        "{said}"
    );
    assert!(common::wait_timeout(&mut server, std::time::Duration::from_secs(30)).is_some());
    common::force_cleanup(mnt);
    assert_consistent(&db);
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(u32::from(seed)) as u8 | 1)
        .collect()
}

/// Writes without any fsync: 300 small files, one large file, scattered 4 KiB overwrites.
fn unsynced_workload(m: &Mounted) -> Vec<(String, Vec<u8>)> {
    use std::os::unix::fs::FileExt;
    let mut expect = Vec::new();
    fs::create_dir(m.path("small")).unwrap();
    for i in 0..300 {
        let name = format!("small/f{i}");
        let data = pattern(100 + i * 13, i as u8);
        fs::write(m.path(&name), &data).unwrap();
        expect.push((name, data));
    }
    let mut big = pattern(3 << 20, 7);
    let f = fs::File::create(m.path("big")).unwrap();
    f.write_all_at(&big, 0).unwrap();
    for k in 0..200u64 {
        let off = (k * 7919 * 4096) % (3 << 20);
        let piece = pattern(4096, k as u8);
        f.write_all_at(&piece, off).unwrap();
        big[off as usize..off as usize + 4096].copy_from_slice(&piece);
    }
    drop(f);
    expect.push(("big".into(), big));
    expect
}

fn assert_contents(m: &Mounted, expect: &[(String, Vec<u8>)]) {
    for (name, data) in expect {
        let got = fs::read(m.path(name)).unwrap();
        assert!(
            got == *data,
            "{name}: {} bytes, want {}",
            got.len(),
            data.len()
        );
    }
}

/// The unmount barrier: with a group-commit window far longer than the test, every byte is
/// still pending when the unmount starts; a clean unmount (and SIGTERM) must commit and sync
/// it all. The kill-switch leg runs the same workload one transaction per write.
#[test]
fn unmount_and_sigterm_commit_everything_pending() {
    if !fuse_or_skip("unmount_and_sigterm_commit_everything_pending") {
        return;
    }
    for env in [
        vec![("AGENTFS_BATCH_WINDOW_MS", "600000")],
        vec![("AGENTFS_BATCH", "0")],
    ] {
        let mut m = Mounted::with_env(&env);
        let expect = unsynced_workload(&m);
        m.unmount();
        assert_consistent(&m.db);
        m.mount();
        assert_contents(&m, &expect);
        // Again, ending with SIGTERM instead of umount.
        fs::write(m.path("after-term"), pattern(70_000, 3)).unwrap();
        // SAFETY: signalling the server this test started.
        unsafe { libc::kill(m.server_pid() as i32, libc::SIGTERM) };
        assert!(
            m.wait_exit().success(),
            "{env:?}: server exit after SIGTERM"
        );
        assert_consistent(&m.db);
        m.mount();
        assert_contents(&m, &expect);
        assert_eq!(fs::read(m.path("after-term")).unwrap(), pattern(70_000, 3));
        m.unmount();
    }
}

/// fsync commits the inode's pending bytes before its barrier: with a window that never
/// fires, a file fsynced before a kill -9 is intact afterwards, and an unsynced one holds
/// nothing that was not written (here: nothing at all, it was never committed).
#[test]
fn fsynced_bytes_survive_kill_9_while_others_were_pending() {
    if !fuse_or_skip("fsynced_bytes_survive_kill_9_while_others_were_pending") {
        return;
    }
    let mut m = Mounted::with_env(&[("AGENTFS_BATCH_WINDOW_MS", "600000")]);
    let synced = pattern(300_000, 1);
    let mut f = fs::File::create(m.path("synced")).unwrap();
    f.write_all(&synced).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut g = fs::File::create(m.path("pending")).unwrap();
    g.write_all(&pattern(300_000, 2)).unwrap();
    g.sync_all().unwrap(); // commits and syncs "pending" too...
    g.write_all(b"tail that is never synced").unwrap();
    drop(g);
    m.crash();
    assert_consistent(&m.db);
    m.mount();
    assert_eq!(fs::read(m.path("synced")).unwrap(), synced);
    let p = fs::read(m.path("pending")).unwrap();
    // ...but its unsynced tail may be lost: the file is what the fsync covered, or more.
    assert!(p.len() >= 300_000 && p[..300_000] == pattern(300_000, 2)[..]);
    m.unmount();
}

/// WAL checkpoints run off the commit path (AGENTFS_WAL_CHECKPOINT_PAGES): while the mount
/// lives, what was written reaches the database file, and the WAL stays far below SQLite's
/// own threshold (1,000 pages, which a checkpoint on the commit path would let it reach),
/// near the writer's own bound (4 times the knob, plus the transactions that commit while a
/// reader keeps the WAL from starting over); at rest its file goes back to the threshold.
/// Everything reads back after a remount, and the database is consistent.
#[test]
fn the_wal_is_checkpointed_beside_the_writer_and_stays_bounded() {
    if !fuse_or_skip("the_wal_is_checkpointed_beside_the_writer_and_stays_bounded") {
        return;
    }
    const PAGES: u64 = 32;
    let mut m = Mounted::with_env(&[("AGENTFS_WAL_CHECKPOINT_PAGES", "32")]);
    let wal = PathBuf::from(format!("{}-wal", m.db.display()));
    let mut most = 0;
    let mut expect = Vec::new();
    for i in 0..48 {
        let data = pattern(256 * 1024, i);
        let mut f = fs::File::create(m.path(&format!("f{i}"))).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        expect.push((format!("f{i}"), data));
        most = most.max(fs::metadata(&wal).map_or(0, |md| md.len()));
    }
    // Each page in the WAL is 4 KiB plus a 24-byte frame header; one file's transaction is
    // under 100 pages (its 64 data pages and the tables' pages around them).
    let frame = 4096 + 24;
    let bound = 4 * PAGES + 3 * 100;
    assert!(
        most <= bound * frame,
        "the WAL reached {most} bytes, over {bound} pages"
    );
    // The 12 MiB written reached the database file before the unmount (all but the last
    // pages, fewer than the knob, which wait in the WAL for the next checkpoint).
    let deadline = Instant::now() + Duration::from_secs(30);
    while fs::metadata(&m.db).unwrap().len() < 11 << 20 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let db_len = fs::metadata(&m.db).unwrap().len();
    assert!(db_len >= 11 << 20, "the database file holds {db_len} bytes");
    // At rest the WAL file goes back to the threshold (journal_size_limit): the first commit
    // after the WAL starts over truncates it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let rest = (PAGES + 100) * frame;
    loop {
        fs::write(m.path("small"), b"one more").unwrap();
        fs::File::open(m.path("small")).unwrap().sync_all().unwrap();
        let len = fs::metadata(&wal).map_or(0, |md| md.len());
        if len <= rest {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the WAL file stayed at {len} bytes (most {most}) after the writes ended"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    m.unmount();
    assert_consistent(&m.db);
    m.mount();
    assert_contents(&m, &expect);
    m.unmount();
}
