//! The request counters of `agentfs status` against a known workload, through a real mount on
//! both transports and in overlay mode: every request lands in the column of the transport
//! that answered it, and FORGETs (which the kernel sends over /dev/fuse also on a ring mount)
//! have their own column.

mod common;

use std::fs;

use agentfs::sys::registry::ServerRecord;
use common::{fuse_or_skip, Mounted, UringParam};

const STATS: u64 = 200;

/// Requests each column gained between two records: (ring, /dev/fuse, forgets).
fn delta(a: &ServerRecord, b: &ServerRecord) -> (u64, u64, u64) {
    (
        b.ring_requests - a.ring_requests,
        b.devfuse_requests - a.devfuse_requests,
        b.forgets - a.forgets,
    )
}

/// `STATS` stats with the kernel's caches off (each one at least a request, at most three:
/// LOOKUPs and GETATTRs of the file and the root), then 100 new files forgotten by dropping the kernel's inode cache.
fn check(m: &Mounted, ring: bool, what: &str) {
    let pid = m.server_pid();
    fs::write(m.path("f"), b"x").unwrap();
    let before = common::settled_record(pid);
    assert_eq!(before.transport, if ring { "io-uring" } else { "dev-fuse" });
    for _ in 0..STATS {
        fs::metadata(m.path("f")).unwrap();
    }
    let after = common::settled_record(pid);
    let (r, d, _) = delta(&before, &after);
    let (served, other) = if ring { (r, d) } else { (d, r) };
    assert!(
        (STATS..=3 * STATS + 10).contains(&served),
        "{what}: {STATS} stats counted as {served} requests ({after:?})"
    );
    assert_eq!(other, 0, "{what}: requests counted on the other transport");
    // Back-to-back requests over /dev/fuse: a thread polling for the next request (the
    // default AGENTFS_FUSE_SPIN_US) finds some of them; a ring mount's /dev/fuse threads only
    // carry forgets and never poll.
    let polled = after.polled - before.polled;
    if ring {
        assert_eq!(polled, 0, "{what}: a ring mount polled /dev/fuse");
    } else {
        assert!(
            polled > 0,
            "{what}: no request of {served} found by polling"
        );
    }
    status_json_agrees(&after, what);

    fs::create_dir(m.path("many")).unwrap();
    for i in 0..100 {
        fs::write(m.path(&format!("many/{i}")), b"y").unwrap();
    }
    let before = common::settled_record(pid);
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    let after = common::settled_record(pid);
    let (_, d, forgets) = delta(&before, &after);
    assert!(
        forgets > 0,
        "{what}: dropped inodes sent no FORGET ({after:?})"
    );
    if ring {
        assert_eq!(
            d, 0,
            "{what}: FORGETs counted as answered /dev/fuse requests"
        );
    }
}

/// `status --json` reports the server's counters and memory as its record has them: each
/// counter between the record before the call and the one after (the call itself may look at
/// the mount), the memory breakdown in bytes within the default budget.
fn status_json_agrees(before: &ServerRecord, what: &str) {
    let out = common::agentfs(&["status", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let after = common::settled_record(before.pid);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mounts = v["mounts"].as_array().expect("mounts");
    let m = mounts
        .iter()
        .find(|m| m["pid"] == before.pid)
        .unwrap_or_else(|| panic!("{what}: server {} not in {v}", before.pid));
    let r = &m["requests"];
    for (key, lo, hi) in [
        ("ring", before.ring_requests, after.ring_requests),
        ("devfuse", before.devfuse_requests, after.devfuse_requests),
        ("forgets", before.forgets, after.forgets),
        ("worker", before.worker_requests, after.worker_requests),
        ("polled", before.polled, after.polled),
    ] {
        let n = r[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{what}: requests.{key} in {m}"));
        assert!(
            (lo..=hi).contains(&n),
            "{what}: requests.{key} {n}, record {lo}..={hi}"
        );
    }
    let mem = &m["memory"];
    let budget = 64 << 20;
    assert_eq!(mem["budget"], budget, "{what}: {mem}");
    assert!(mem["rss"].as_u64().unwrap() > 0, "{what}: {mem}");
    assert!(
        mem["request_buffers"].as_u64().unwrap() > 0,
        "{what}: {mem}"
    );
    for key in [
        "sqlite",
        "caches",
        "write_batches",
        "request_buffers",
        "reusable_buffers",
    ] {
        let n = mem[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{what}: memory.{key} in {mem}"));
        assert!(n <= budget, "{what}: memory.{key} {n} beyond the budget");
    }
}

fn env(ring: bool) -> Vec<(&'static str, &'static str)> {
    vec![
        ("AGENTFS_FUSE_URING", if ring { "1" } else { "0" }),
        ("AGENTFS_FUSE_ATTR_TTL_MS", "0"),
        ("AGENTFS_FUSE_ENTRY_TTL_MS", "0"),
    ]
}

#[test]
fn status_counters_match_a_known_workload() {
    if !fuse_or_skip("status_counters_match_a_known_workload") {
        return;
    }
    for ring in [false, true] {
        let _param = if ring {
            match UringParam::set("Y") {
                Some(p) => Some(p),
                None => {
                    eprintln!("SKIP the ring leg: enable_uring is not writable");
                    return;
                }
            }
        } else {
            None
        };
        let m = Mounted::with_env(&env(ring));
        check(&m, ring, if ring { "io-uring" } else { "dev-fuse" });
        drop(m);

        // Overlay mode: the same counts over a base directory.
        let mut m = Mounted::unmounted_with_env(&env(ring));
        let base = m.dir.path().join("base");
        fs::create_dir(&base).unwrap();
        fs::write(base.join("from-base"), b"b").unwrap();
        let db = m.db.to_str().unwrap().to_string();
        let out = common::agentfs(&["init", &db, "--base", base.to_str().unwrap()]);
        assert!(out.status.success(), "{out:?}");
        m.mount();
        check(
            &m,
            ring,
            if ring {
                "overlay, io-uring"
            } else {
                "overlay, dev-fuse"
            },
        );
    }
}

/// On a ring mount the kernel sends FORGETs over /dev/fuse, one per unlinked inode as it
/// evicts it. The /dev/fuse threads pause after each (`AGENTFS_FUSE_FORGET_PAUSE_US`), so the
/// forgets of a run of unlinks arrive as a few BATCH_FORGETs, and every unlinked inode's rows
/// are still deleted.
#[test]
fn dev_fuse_threads_sleep_in_read_when_polling_is_off() {
    if !fuse_or_skip("dev_fuse_threads_sleep_in_read_when_polling_is_off") {
        return;
    }
    let mut e = env(false);
    e.push(("AGENTFS_FUSE_SPIN_US", "0"));
    let m = Mounted::with_env(&e);
    fs::write(m.path("f"), b"x").unwrap();
    for _ in 0..STATS {
        fs::metadata(m.path("f")).unwrap();
    }
    let rec = common::settled_record(m.server_pid());
    assert!(rec.devfuse_requests >= STATS, "{rec:?}");
    assert_eq!(rec.polled, 0, "polled with AGENTFS_FUSE_SPIN_US=0: {rec:?}");
}

#[test]
fn forgets_of_unlinked_files_arrive_in_batches_on_the_ring() {
    if !fuse_or_skip("forgets_of_unlinked_files_arrive_in_batches_on_the_ring") {
        return;
    }
    let Some(_param) = UringParam::set("Y") else {
        eprintln!("SKIP: enable_uring is not writable");
        return;
    };
    const FILES: u64 = 1000;
    let m = Mounted::with_env(&[("AGENTFS_FUSE_URING", "1")]);
    let pid = m.server_pid();
    fs::create_dir(m.path("d")).unwrap();
    for i in 0..FILES {
        fs::write(m.path(&format!("d/{i}")), b"z").unwrap();
    }
    let before = common::settled_record(pid);
    assert_eq!(before.transport, "io-uring");
    for i in 0..FILES {
        fs::remove_file(m.path(&format!("d/{i}"))).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while common::orphans(&m.db) != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} unlinked inodes were never reaped",
            common::orphans(&m.db)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let after = common::settled_record(pid);
    let (_, d, forgets) = delta(&before, &after);
    assert_eq!(d, 0, "requests served over /dev/fuse");
    assert!(
        (1..=FILES / 4).contains(&forgets),
        "{FILES} unlinked inodes were forgotten in {forgets} requests"
    );
    let c =
        rusqlite::Connection::open_with_flags(&m.db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let inodes: i64 = c
        .query_row("SELECT count(*) FROM fs_inode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(inodes, 2, "the root and d are all that is left");
}

/// An orphan whose FORGET the kernel still held when the connection ended (here: paused for
/// the longest the knob allows, so the unmount comes first) is reaped as the server shuts
/// down, not left to the next mount: the database is clean once `agentfs umount` returns.
#[test]
fn orphans_whose_forget_never_came_are_reaped_at_unmount() {
    if !fuse_or_skip("orphans_whose_forget_never_came_are_reaped_at_unmount") {
        return;
    }
    let Some(_param) = UringParam::set("Y") else {
        eprintln!("SKIP: enable_uring is not writable");
        return;
    };
    let mut m = Mounted::with_env(&[
        ("AGENTFS_FUSE_URING", "1"),
        ("AGENTFS_FUSE_FORGET_PAUSE_US", "100000"),
    ]);
    for i in 0..20 {
        fs::write(m.path(&format!("{i}")), b"z").unwrap();
    }
    for i in 0..20 {
        fs::remove_file(m.path(&format!("{i}"))).unwrap();
    }
    m.unmount();
    assert_eq!(common::orphans(&m.db), 0, "orphans left after the unmount");
    common::assert_consistent(&m.db);
}
