//! Named errors: each code a harness branches on, triggered for real, with `--json` printing
//! exactly one object `{"error":{"code","detail","message","path"}}` on stderr and the exit
//! status of its class (docs/harness.md).

mod common;
mod fixtures;

use std::fs;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::world::{user_can_run, World, USER};
use common::{agentfs, bin, fuse_or_skip, init_overlay, Mounted};
use serde_json::Value;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The failure `o` reports: exit `status`, its last line on stderr one JSON object with class
/// `code` (a notice such as "project made" may come before it).
fn failed(o: &Output, status: i32, code: &str) -> Value {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(status), "{err}");
    let last = err.trim_end().lines().last().unwrap_or("");
    let v: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {err}"));
    assert_eq!(v.as_object().unwrap().len(), 1, "{err}");
    let e = &v["error"];
    assert_eq!(e["code"], code, "{err}");
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{err}"
    );
    assert!(e["detail"].is_null() || e["detail"].is_string(), "{err}");
    assert!(e["path"].is_null() || e["path"].is_string(), "{err}");
    assert_eq!(e.as_object().unwrap().len(), 4, "{err}");
    e.clone()
}

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(common::scratch_root()).unwrap()
}

#[test]
fn bad_input_and_database_codes() {
    let t = scratch();
    let d = t.path();
    failed(&agentfs(&["--json", "no-such-verb"]), 2, "usage");
    // Help stays help.
    assert!(agentfs(&["--json", "--help"]).status.success());

    let missing = d.join("nowhere.db");
    let e = failed(
        &agentfs(&["--json", "fs", s(&missing), "ls", "/"]),
        2,
        "not_found",
    );
    assert_eq!(e["path"], s(&missing));
    failed(
        &agentfs(&["--json", "umount", s(&d.join("not-mounted"))]),
        2,
        "not_found",
    );

    let db = d.join("a.db");
    assert!(agentfs(&["init", s(&db)]).status.success());
    failed(&agentfs(&["--json", "init", s(&db)]), 4, "exists");

    let junk = d.join("junk.db");
    fs::write(&junk, vec![b'x'; 8192]).unwrap();
    failed(
        &agentfs(&["--json", "fs", s(&junk), "ls", "/"]),
        2,
        "not_a_database",
    );
    // A verb with its own --json reports the error the same way.
    failed(
        &agentfs(&["integrity", s(&junk), "--json"]),
        2,
        "not_a_database",
    );

    let old = d.join("old.db");
    fixtures::build(&old, fixtures::Old::V04);
    failed(
        &agentfs(&["--json", "fs", s(&old), "ls", "/"]),
        2,
        "db_old_schema",
    );

    let bad = d.join("bad.db");
    assert!(agentfs(&["init", s(&bad)]).status.success());
    let mut bytes = fs::read(&bad).unwrap();
    bytes[100..400].fill(0xff);
    fs::write(&bad, bytes).unwrap();
    failed(
        &agentfs(&["--json", "fs", s(&bad), "ls", "/"]),
        1,
        "db_corrupt",
    );

    let base = d.join("base");
    fs::create_dir(&base).unwrap();
    let delta = d.join("delta.db");
    init_overlay(&delta, &base);
    fs::remove_dir(&base).unwrap();
    failed(&agentfs(&["--json", "diff", s(&delta)]), 1, "base_missing");

    let full = d.join("full");
    fs::create_dir(&full).unwrap();
    fs::write(full.join("f"), b"x").unwrap();
    let e = failed(
        &agentfs(&["--json", "mount", s(&db), s(&full)]),
        4,
        "mount_point_conflict",
    );
    assert_eq!(e["path"], s(&fs::canonicalize(&full).unwrap()));

    // Without --json: one line naming the code.
    let o = agentfs(&["fs", s(&junk), "ls", "/"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("agentfs: not_a_database: "));
}

/// Sandbox refusals exit 125 whatever the code, as root and as an ordinary user.
fn sandbox_refusals(user: Option<u32>) {
    let w = World::new(user);
    let src = w.source("proj");
    let e = failed(
        &w.af(&["--json", "run", "nosuch", "--", "true"]),
        125,
        "not_found",
    );
    assert_eq!(e["detail"], "no_project");
    let e = failed(
        &w.af(&[
            "--json",
            "quick",
            s(&src),
            "--policy",
            "workspace-write",
            "--",
            "true",
        ]),
        125,
        "policy_invalid",
    );
    assert_eq!(e["detail"], "policy_empty");
    // The project exists now (quick made it before refusing); it has no snapshot to restore.
    let e = failed(
        &w.af(&["restore", "proj", "nosuch", "--json"]),
        2,
        "not_found",
    );
    assert_eq!(e["detail"], "unknown_ref");
    // User namespaces switched off (in a user namespace of its own, so the host's stay on).
    let script =
        r#"echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" --json run proj -- true"#;
    let o = w.cmd(
        Path::new("unshare"),
        &["-U", "-r", "sh", "-c", script, s(&bin())],
    );
    let e = failed(&o, 125, "unsupported_platform");
    assert_eq!(e["detail"], "userns_disabled");
}

#[test]
fn sandbox_refusals_as_root() {
    sandbox_refusals(None);
}

#[test]
fn sandbox_refusals_as_user() {
    if !user_can_run("sandbox_refusals_as_user") {
        return;
    }
    sandbox_refusals(Some(USER));
}

/// A mounted database: already_mounted, sandbox_live, busy; and fuse_unavailable where no
/// /dev/fuse exists (a mount namespace with an empty /dev).
#[test]
fn mounted_codes() {
    if !fuse_or_skip("mounted_codes") {
        return;
    }
    let mut m = Mounted::new();
    let e = failed(
        &agentfs(&["--json", "apply", s(&m.db)]),
        4,
        "already_mounted",
    );
    assert_eq!(e["path"], s(&m.db));
    let other = m.dir.path().join("other");
    fs::create_dir(&other).unwrap();
    failed(
        &agentfs(&["--json", "mount", s(&m.db), s(&other)]),
        4,
        "already_mounted",
    );
    // A process holding its working directory inside keeps the unmount busy.
    let mut holder = Command::new("sleep")
        .arg("600")
        .current_dir(&m.mnt)
        .spawn()
        .unwrap();
    let o = agentfs(&["--json", "umount", s(&m.mnt)]);
    holder.kill().unwrap();
    holder.wait().unwrap();
    failed(&o, 4, "busy");
    m.unmount();

    let db = m.dir.path().join("fresh.db");
    let o = Command::new("unshare")
        .args(["-m", "sh", "-c"])
        .arg(
            "mount --make-rprivate / && mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3 \
             && exec \"$0\" --json mount \"$1\" \"$2\"",
        )
        .args([bin().as_os_str(), db.as_os_str(), other.as_os_str()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    failed(&o, 3, "fuse_unavailable");
}

/// A full disk under the database: the write fails with capacity_exhausted (root: a tmpfs).
#[test]
fn capacity_exhausted() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP capacity_exhausted: mounting a tmpfs needs root");
        return;
    }
    let t = scratch();
    let disk = t.path().join("disk");
    fs::create_dir(&disk).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&disk)
        .status()
        .unwrap();
    assert!(st.success());
    let db = disk.join("a.db");
    let init = agentfs(&["init", s(&db)]);
    let mut c = Command::new(bin())
        .args(["--json", "fs", s(&db), "write", "/big"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = c.stdin.take().unwrap();
        let _ = stdin.write_all(&vec![7u8; 8 << 20]);
    }
    let o = c.wait_with_output().unwrap();
    let _ = Command::new("umount").arg(&disk).status();
    assert!(init.status.success());
    failed(&o, 1, "capacity_exhausted");
}
