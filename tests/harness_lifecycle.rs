//! The end of a project's life and what crashes leave: `discard` (refusing unapplied changes,
//! stopping or killing only its own sandbox, unmounting its delta first) and `recover` (a
//! mount whose server was killed, a sandbox whose supervisor or pid 1 was killed, an apply
//! killed halfway), through real mounts and sandboxes, as root and as an ordinary user.
//!
//! Every test here holds one lock: `recover` looks at every mount and record of the user, so
//! a test's leftovers must not be fixed by another test's recover meanwhile.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::world::{err, launched, user_can_run, World, USER};
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The JSON error object of a refusal: exit `status`, class `code`.
fn refused(o: &Output, status: i32, code: &str) -> Value {
    let e = err(o);
    assert_eq!(o.status.code(), Some(status), "{e}");
    let v: Value = serde_json::from_str(e.trim_end().lines().last().unwrap_or(""))
        .unwrap_or_else(|x| panic!("{x}: {e}"));
    assert_eq!(v["error"]["code"], code, "{e}");
    v["error"].clone()
}

fn json_out(o: &Output) -> Value {
    assert!(o.status.success(), "{}", err(o));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

/// A project NAME over a fresh source directory of the world (`src-NAME`: a file named like
/// the project in the working directory would make the name ambiguous).
fn project(w: &World, name: &str) -> PathBuf {
    let src = w.source(&format!("src-{name}"));
    launched(&w.af(&["init", name, "--source", s(&src)]));
    src
}

/// Wait until `status` shows the project's sandbox live; its marker.
fn wait_live(w: &World, name: &str, child: &mut Child) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = json_out(&w.af(&["status", name, "--json"]));
        if v["projects"][0]["live"] == true {
            return v["projects"][0]["live_record"].clone();
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the sandbox ended before it was live: {st}");
        }
        assert!(Instant::now() < deadline, "the sandbox never became live");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn pid_of(v: &Value) -> i32 {
    v.as_i64().unwrap() as i32
}

fn running(pid: i32) -> bool {
    agentfs::sys::ns::running(pid)
}

// ---------------------------------------------------------------------------------------------
// discard

fn discard_refuses_unapplied_changes(w: &World) {
    let src = project(w, "work");
    launched(&w.af(&[
        "exec",
        "work",
        "--",
        "sh",
        "-c",
        &format!("echo new > {0}/new.txt; echo more >> {0}/README", s(&src)),
    ]));
    let dir = w.root().join("work");
    let e = refused(
        &w.af(&["discard", "work", "--json"]),
        4,
        "unapplied_changes",
    );
    assert_eq!(e["path"], s(&dir), "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("2 change(s)"),
        "{e}"
    );
    assert!(
        dir.join("delta.db").exists(),
        "a refused discard removed the delta"
    );
    // Applied, nothing is left to lose: the discard goes through.
    launched(&w.af(&["apply", "work"]));
    assert_eq!(fs::read_to_string(src.join("new.txt")).unwrap(), "new\n");
    let v = json_out(&w.af(&["discard", "work", "--json"]));
    assert_eq!(v["discarded"], "work");
    assert_eq!(v["unapplied_changes"], 0);
    assert!(!dir.exists(), "the project directory is still there");
    assert_eq!(fs::read_to_string(src.join("new.txt")).unwrap(), "new\n");
    // It is gone: a second discard does not find it.
    let e = refused(&w.af(&["discard", "work", "--json"]), 2, "not_found");
    assert_eq!(e["detail"], "no_project");

    // --force discards changes never applied; the source keeps what it had.
    let src = project(w, "scratch");
    launched(&w.af(&[
        "exec",
        "scratch",
        "--",
        "sh",
        "-c",
        &format!("echo lost > {}/lost.txt", s(&src)),
    ]));
    let v = json_out(&w.af(&["discard", "scratch", "--force", "--json"]));
    assert_eq!(v["unapplied_changes"], 1);
    assert!(!w.root().join("scratch").exists());
    assert!(!src.join("lost.txt").exists());
    assert_eq!(fs::read_to_string(src.join("README")).unwrap(), "hello\n");
}

#[test]
fn discard_refuses_unapplied_changes_as_root() {
    let _s = serial();
    discard_refuses_unapplied_changes(&World::new(None));
}

#[test]
fn discard_refuses_unapplied_changes_as_a_user() {
    let _s = serial();
    if user_can_run("discard_refuses_unapplied_changes_as_a_user") {
        discard_refuses_unapplied_changes(&World::new(Some(USER)));
    }
}

fn discard_ends_only_its_own_sandbox(w: &World) {
    // A process of the same user that no sandbox knows: it must survive every discard.
    let mut foreign = w
        .command(Path::new("/bin/sleep"), &["1000"])
        .spawn()
        .unwrap();
    let foreign_pid = foreign.id() as i32;

    // Nothing unapplied: the sandbox is asked to stop (SIGTERM) and does.
    project(w, "calm");
    let mut calm = w
        .command(&common::bin(), &["run", "calm", "--", "sleep", "1000"])
        .spawn()
        .unwrap();
    let m = wait_live(w, "calm", &mut calm);
    // On overlayfs the delta cannot tell what a live run wrote, and only --force discards it
    // (discard_refuses_a_live_overlayfs_run); --force kills only a sandbox that does not stop.
    let mut discard = vec!["discard", "calm", "--json"];
    if common::backend() == "overlayfs" {
        discard.push("--force");
    }
    let v = json_out(&w.af(&discard));
    assert_eq!(v["sandbox"]["action"], "stopped", "{v}");
    assert_eq!(v["sandbox"]["supervisor"], m["supervisor"]);
    assert!(common::wait_timeout(&mut calm, Duration::from_secs(10)).is_some());
    assert!(!running(pid_of(&m["pid1"])));
    assert!(!w.root().join("calm").exists());

    // A sandbox that ignores SIGTERM and has written: refused without --force, killed with it.
    // The write is seen in the delta while the run lives, which only the FUSE backend does.
    if common::fuse_only(
        "discard_ends_only_its_own_sandbox",
        "a live run's writes counted as unapplied",
    ) {
        let src = project(w, "stubborn");
        let script = format!("trap '' TERM; echo w > {}/w; sleep 1000 & wait", s(&src));
        let mut stubborn = w
            .command(
                &common::bin(),
                &["run", "stubborn", "--", "sh", "-c", &script],
            )
            .spawn()
            .unwrap();
        let m = wait_live(w, "stubborn", &mut stubborn);
        let deadline = Instant::now() + Duration::from_secs(30);
        while json_out(&w.af(&["status", "stubborn", "--json"]))["projects"][0]["position"]
            ["unapplied_changes"]
            != 1
        {
            assert!(Instant::now() < deadline, "the sandbox never wrote");
            std::thread::sleep(Duration::from_millis(50));
        }
        refused(
            &w.af(&["discard", "stubborn", "--json"]),
            4,
            "unapplied_changes",
        );
        assert!(
            running(pid_of(&m["pid1"])),
            "a refused discard touched the sandbox"
        );
        let v = json_out(&w.af(&["discard", "stubborn", "--force", "--json"]));
        assert_eq!(v["sandbox"]["action"], "killed", "{v}");
        let st = common::wait_timeout(&mut stubborn, Duration::from_secs(10)).expect("run ended");
        assert!(!st.success());
        assert!(!running(pid_of(&m["pid1"])));
        assert!(!w.root().join("stubborn").exists());
    }

    // A stale marker whose pids now name another process (here: the foreign one, which started
    // after the marker says it was written) is no sandbox of the project: nothing is signalled.
    project(w, "stale");
    let marker = serde_json::json!({
        "supervisor": foreign_pid, "pid1": foreign_pid, "server": foreign_pid,
        "started": 1, "source": "/nonexistent",
    });
    let path = w.root().join("stale/live.json");
    fs::write(&path, marker.to_string()).unwrap();
    w.own(&path);
    let v = json_out(&w.af(&["discard", "stale", "--force", "--json"]));
    assert_eq!(v["sandbox"], Value::Null, "{v}");
    assert!(!w.root().join("stale").exists());

    assert!(running(foreign_pid), "discard signalled a foreign process");
    let _ = foreign.kill();
    let _ = foreign.wait();
}

#[test]
fn discard_ends_only_its_own_sandbox_as_root() {
    let _s = serial();
    discard_ends_only_its_own_sandbox(&World::new(None));
}

#[test]
fn discard_ends_only_its_own_sandbox_as_a_user() {
    let _s = serial();
    if user_can_run("discard_ends_only_its_own_sandbox_as_a_user") {
        discard_ends_only_its_own_sandbox(&World::new(Some(USER)));
    }
}

/// A live overlayfs run keeps what it wrote in its upper directory until it ends, where the
/// delta does not see it: a discard cannot tell what it would lose and is refused without
/// --force, the sandbox untouched.
fn discard_refuses_a_live_overlayfs_run(w: &World) {
    let src = project(w, "ovl");
    let script = format!("echo w > {}/w; sleep 1000", s(&src));
    let mut run = w
        .command(
            &common::bin(),
            &[
                "run",
                "ovl",
                "--mount-backend",
                "overlayfs",
                "--",
                "sh",
                "-c",
                &script,
            ],
        )
        .spawn()
        .unwrap();
    let m = wait_live(w, "ovl", &mut run);
    let written = w.root().join("ovl/upper/w");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !written.exists() {
        if Instant::now() > deadline {
            let _ = run.kill();
            panic!("the sandbox never wrote");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let refusal = w.af(&["discard", "ovl", "--json"]);
    let alive = running(pid_of(&m["pid1"]));
    let kept = w.root().join("ovl/delta.db").exists();
    let forced = w.af(&["discard", "ovl", "--force", "--json"]);
    let ended = common::wait_timeout(&mut run, Duration::from_secs(10));
    if ended.is_none() {
        let _ = run.kill();
    }
    refused(&refusal, 4, "unapplied_changes");
    assert!(alive, "a refused discard touched the sandbox");
    assert!(kept, "a refused discard removed the delta");
    assert_eq!(json_out(&forced)["discarded"], "ovl");
    assert!(ended.is_some(), "the sandbox outlived a forced discard");
    assert!(!w.root().join("ovl").exists());
}

#[test]
fn discard_refuses_a_live_overlayfs_run_as_root() {
    let _s = serial();
    discard_refuses_a_live_overlayfs_run(&World::new(None));
}

#[test]
fn discard_refuses_a_live_overlayfs_run_as_a_user() {
    let _s = serial();
    if user_can_run("discard_refuses_a_live_overlayfs_run_as_a_user") {
        discard_refuses_a_live_overlayfs_run(&World::new(Some(USER)));
    }
}

/// A mounted delta is unmounted before the directory goes; a mount held busy refuses the
/// discard and leaves everything in place.
#[test]
fn discard_unmounts_the_delta_first_and_a_busy_mount_keeps_everything() {
    let _s = serial();
    if !common::fuse_or_skip("discard_unmounts_the_delta_first_and_a_busy_mount_keeps_everything") {
        return;
    }
    let w = World::new(None);
    project(&w, "mounted");
    let mnt = w.base.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let _cleanup = common::UnmountOnDrop(mnt.clone());
    launched(&w.af(&["mount", "mounted", s(&mnt)]));
    assert!(common::is_mounted(&mnt));
    // A process inside the mount holds it.
    let mut holder = w
        .command(Path::new("/bin/sleep"), &["1000"])
        .current_dir(&mnt)
        .spawn()
        .unwrap();
    let e = refused(
        &w.af(&["discard", "mounted", "--force", "--json"]),
        4,
        "busy",
    );
    assert_eq!(e["path"], s(&mnt), "{e}");
    assert!(common::is_mounted(&mnt));
    assert!(w.root().join("mounted/config.toml").exists());
    assert!(w.root().join("mounted/delta.db").exists());
    assert!(
        running(holder.id() as i32),
        "discard killed a process holding the mount"
    );
    let _ = holder.kill();
    let _ = holder.wait();
    let v = json_out(&w.af(&["discard", "mounted", "--json"]));
    assert_eq!(v["unmounted"][0], s(&mnt), "{v}");
    assert!(!common::is_mounted(&mnt));
    assert!(!w.root().join("mounted").exists());
}

// ---------------------------------------------------------------------------------------------
// recover

/// The findings of one `recover --json`.
fn recover(w: &World) -> Vec<Value> {
    json_out(&w.af(&["recover", "--json"]))
        .as_array()
        .unwrap()
        .clone()
}

/// The findings that concern `needle` (a path of this test).
fn about<'a>(found: &'a [Value], needle: &str) -> Vec<&'a Value> {
    found
        .iter()
        .filter(|f| f["path"].as_str().is_some_and(|p| p.contains(needle)))
        .collect()
}

#[test]
fn recover_detaches_a_mount_whose_server_was_killed() {
    let _s = serial();
    if !common::fuse_or_skip("recover_detaches_a_mount_whose_server_was_killed") {
        return;
    }
    let w = World::new(None);
    let mut m = common::Mounted::new();
    fs::write(m.path("kept"), b"committed\n").unwrap();
    let out = common::agentfs(&["umount", s(&m.mnt)]);
    assert!(out.status.success(), "{}", err(&out));
    m.wait_exit();
    m.mount();
    // SIGKILL: the kernel keeps the mount, every access fails with ENOTCONN.
    agentfs::sys::ns::kill(m.server_pid() as i32, libc::SIGKILL).unwrap();
    m.wait_exit();
    assert!(common::is_mounted(&m.mnt));
    let e = fs::metadata(&m.mnt).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");

    let found = recover(&w);
    let mine = about(&found, s(&m.mnt));
    assert_eq!(mine.len(), 1, "{found:?}");
    assert_eq!(mine[0]["kind"], "dead_mount");
    assert_eq!(mine[0]["ok"], true);
    assert!(!common::is_mounted(&m.mnt));
    assert!(about(&recover(&w), s(&m.mnt)).is_empty());
    common::assert_consistent(&m.db);
    m.mount();
    assert_eq!(fs::read(m.path("kept")).unwrap(), b"committed\n");
    m.unmount();
}

fn recover_after_a_killed_sandbox(w: &World) {
    if !common::fuse_only(
        "recover_after_a_killed_sandbox",
        "a killed run's server and mount (recover_imports_an_upper_left_behind is the overlayfs case)",
    ) {
        return;
    }
    let src = project(w, "crash");
    let dir = w.root().join("crash");
    for victim in ["supervisor", "pid1"] {
        let script = format!("echo {victim} > {}/{victim}; sleep 1000", s(&src));
        let mut run = w
            .command(&common::bin(), &["run", "crash", "--", "sh", "-c", &script])
            .spawn()
            .unwrap();
        let m = wait_live(w, "crash", &mut run);
        let deadline = Instant::now() + Duration::from_secs(30);
        while json_out(&w.af(&["diff", "crash", "--json"]))
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["path"] != format!("/{victim}"))
        {
            assert!(Instant::now() < deadline, "the sandbox never wrote");
            std::thread::sleep(Duration::from_millis(50));
        }
        let pid1 = pid_of(&m["pid1"]);
        match victim {
            "supervisor" => run.kill().unwrap(),
            _ => agentfs::sys::ns::kill(pid1, libc::SIGKILL).unwrap(),
        }
        let _ = common::wait_timeout(&mut run, Duration::from_secs(10)).expect("run ended");
        let deadline = Instant::now() + Duration::from_secs(10);
        while running(pid1) {
            assert!(Instant::now() < deadline, "pid 1 outlived its supervisor");
            std::thread::sleep(Duration::from_millis(20));
        }
        let v = json_out(&w.af(&["status", "crash", "--json"]));
        assert_eq!(v["projects"][0]["live"], false, "{v}");

        let found = recover(w);
        let mine = about(&found, s(&dir));
        let last_run =
            || json_out(&w.af(&["status", "crash", "--json"]))["projects"][0]["last_run"].clone();
        if victim == "supervisor" {
            // Its run record stays unfinished and its marker behind, naming dead processes.
            let kinds: Vec<&Value> = mine.iter().map(|f| &f["kind"]).collect();
            assert_eq!(kinds, ["unfinished_run", "dead_sandbox"], "{found:?}");
            for f in &mine {
                assert_eq!(f["pid"], m["supervisor"], "{found:?}");
                assert_eq!(f["ok"], true, "{found:?}");
            }
            let rec = last_run();
            assert_eq!(rec["outcome"], "killed", "{rec}");
            assert!(rec["exit_status"].is_null(), "{rec}");
        } else {
            // The supervisor outlives pid 1, finishes its record and cleans up after it.
            assert!(mine.is_empty(), "{found:?}");
            let rec = last_run();
            assert_eq!(rec["exit_status"], 128 + libc::SIGKILL, "{rec}");
            assert!(rec.get("outcome").is_none(), "{rec}");
        }
        let rec = last_run();
        assert!(
            rec["ended"].as_u64().unwrap() >= rec["started"].as_u64().unwrap(),
            "{rec}"
        );
        assert!(!dir.join("live.json").exists());
        assert!(about(&recover(w), s(&dir)).is_empty());
        assert_eq!(last_run(), rec, "a second recovery changed the record");
        let out = w.af(&["integrity", s(&dir.join("delta.db"))]);
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            err(&out)
        );
        // What the command wrote before it was killed is in the delta.
        let diff = json_out(&w.af(&["diff", "crash", "--json"]));
        assert!(
            diff.as_array()
                .unwrap()
                .iter()
                .any(|c| c["path"] == format!("/{victim}")),
            "{diff}"
        );
        launched(&w.af(&["exec", "crash", "--", "true"]));
    }
}

#[test]
fn recover_after_a_killed_sandbox_as_root() {
    let _s = serial();
    recover_after_a_killed_sandbox(&World::new(None));
}

#[test]
fn recover_after_a_killed_sandbox_as_a_user() {
    let _s = serial();
    if user_can_run("recover_after_a_killed_sandbox_as_a_user") {
        recover_after_a_killed_sandbox(&World::new(Some(USER)));
    }
}

/// A source tree and a project over it whose HEAD snapshot changes files, adds some, and
/// replaces a symlink by a directory (its removal is the plan's first step).
fn promoted_world(user: Option<u32>) -> (World, PathBuf) {
    let w = World::new(user);
    let src = project(&w, "prom");
    fs::create_dir(src.join("d")).unwrap();
    for i in 0..6 {
        fs::write(src.join(format!("d/f{i}")), format!("old {i}\n")).unwrap();
    }
    std::os::unix::fs::symlink("d", src.join("ln")).unwrap();
    for p in ["d", "ln"] {
        if let Some(u) = user {
            std::os::unix::fs::lchown(src.join(p), Some(u), Some(u)).unwrap();
        }
    }
    for i in 0..6 {
        w.own(&src.join(format!("d/f{i}")));
    }
    let script = format!(
        "cd {}; for i in 0 1 2 3 4 5; do echo new $i > d/f$i; echo g $i > g$i; done; rm ln; \
         mkdir ln; echo z > ln/z; chmod 700 d",
        s(&src)
    );
    launched(&w.af(&["exec", "prom", "--", "sh", "-c", &script]));
    launched(&w.af(&["snap", "prom"]));
    (w, src)
}

/// Kill `apply --from HEAD` once it has run `steps` steps; its pid.
fn apply_killed_after(w: &World, steps: u32) -> u32 {
    let mut c = w.command(&common::bin(), &["apply", "prom", "--from", "HEAD"]);
    c.env("AGENTFS_APPLY_STOP_AFTER", steps.to_string())
        .stdout(std::process::Stdio::null());
    let mut child = c.spawn().unwrap();
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    while agentfs::sys::ns::state(pid as i32) != Some('T') {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("apply ended before it stopped: {st}");
        }
        assert!(Instant::now() < deadline, "apply never stopped");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    pid
}

fn apply_killed_halfway(via_recover: bool, user: Option<u32>) {
    let _s = serial();
    // The tree a full apply makes.
    let (full, full_src) = promoted_world(user);
    launched(&full.af(&["apply", "prom", "--from", "HEAD"]));
    let want = common::tree_listing(&full_src);

    let (w, src) = promoted_world(user);
    let pid = apply_killed_after(&w, 3);
    let dir = w.root().join("prom");
    assert!(dir.join("delta.db-apply").exists(), "no journal");
    assert_ne!(
        common::tree_listing(&src),
        want,
        "the apply was not halfway"
    );
    // What a write killed between its temporary file and the rename leaves.
    let temp = agentfs::sys::beneath::temp_name(b"g5", pid);
    let temp = src.join(std::ffi::OsStr::new(std::str::from_utf8(&temp).unwrap()));
    fs::write(&temp, b"half").unwrap();
    w.own(&temp);
    // Without the journal, the next apply would take its own removal of /ln for a change of
    // the base: a dry run (which does not finish journals) shows that refusal.
    refused(
        &w.af(&["apply", "prom", "--from", "HEAD", "--dry-run", "--json"]),
        4,
        "apply_conflict",
    );

    // What a backend probe killed before its cleanup leaves (overlayfs's work/work has mode 0).
    let probe = dir.join(format!("probe-{pid}-1"));
    fs::create_dir_all(probe.join("work/work")).unwrap();
    for d in ["", "work", "work/work"] {
        w.own(&probe.join(d));
    }
    fs::set_permissions(
        probe.join("work/work"),
        std::os::unix::fs::PermissionsExt::from_mode(0o000),
    )
    .unwrap();

    if via_recover {
        let found = recover(&w);
        let kinds: Vec<&str> = about(&found, s(&w.base))
            .iter()
            .map(|f| f["kind"].as_str().unwrap())
            .collect();
        assert!(kinds.contains(&"interrupted_apply"), "{found:?}");
        assert!(kinds.contains(&"apply_copy"), "{found:?}");
        assert!(kinds.contains(&"apply_temp"), "{found:?}");
        assert!(kinds.contains(&"probe_scratch"), "{found:?}");
        assert!(found.iter().all(|f| f["ok"] == true), "{found:?}");
        assert!(about(&recover(&w), s(&w.base)).is_empty());
        let rest: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().into_string().unwrap())
            .filter(|n| {
                n.starts_with("apply-copy-") || n.ends_with("-apply") || n.starts_with("probe-")
            })
            .collect();
        assert!(rest.is_empty(), "{rest:?}");
    }
    assert!(!temp.exists() || !via_recover);
    let out = w.af(&["apply", "prom", "--from", "HEAD"]);
    launched(&out);
    assert!(!temp.exists(), "the temporary file is still there");
    assert_eq!(common::tree_listing(&src), want);
    let out = w.af(&["apply", "prom", "--from", "HEAD"]);
    launched(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to do"));
    let out = w.af(&["integrity", s(&dir.join("delta.db"))]);
    assert!(out.status.success(), "{}", err(&out));
    assert!(!dir.join("delta.db-apply").exists());
}

#[test]
fn recover_finishes_an_apply_killed_halfway() {
    apply_killed_halfway(true, None);
}

#[test]
fn recover_finishes_an_apply_killed_halfway_as_a_user() {
    if user_can_run("recover_finishes_an_apply_killed_halfway_as_a_user") {
        apply_killed_halfway(true, Some(USER));
    }
}

#[test]
fn the_next_apply_finishes_an_apply_killed_halfway() {
    apply_killed_halfway(false, None);
}

/// A project directory whose config.toml is gone (a discard or init killed midway) is an
/// orphan: removed, once.
#[test]
fn recover_removes_an_orphaned_project() {
    let _s = serial();
    let w = World::new(None);
    project(&w, "orphan");
    let dir = w.root().join("orphan");
    fs::remove_file(dir.join("config.toml")).unwrap();
    let found = recover(&w);
    let mine = about(&found, s(&dir));
    assert_eq!(mine.len(), 1, "{found:?}");
    assert_eq!(mine[0]["kind"], "orphaned_project");
    assert!(!dir.exists());
    assert!(about(&recover(&w), s(&dir)).is_empty());
}

/// An upper directory an overlayfs run left unimported (its supervisor was killed before the
/// import) is imported into the delta by `recover`, then removed; a second recover finds
/// nothing.
fn recover_imports_an_upper_left_behind(user: Option<u32>) {
    let _s = serial();
    let w = World::new(user);
    let src = w.source("ovl-src");
    launched(&w.af(&["init", "ovl", "--source", s(&src)]));
    let upper = w.root().join("ovl/upper");
    fs::create_dir(&upper).unwrap();
    fs::write(upper.join("left.txt"), b"left\n").unwrap();
    w.own(&upper);
    w.own(&upper.join("left.txt"));
    let found = recover(&w);
    let mine = about(&found, s(&upper));
    assert_eq!(mine.len(), 1, "{found:?}");
    assert_eq!(mine[0]["kind"], "unimported_upper");
    assert_eq!(mine[0]["ok"], true, "{found:?}");
    assert!(!upper.exists());
    let o = w.af(&["diff", "--project", "ovl", "--name-only"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "/left.txt\n",
        "{}",
        err(&o)
    );
    assert!(about(&recover(&w), s(&upper)).is_empty());
}

/// An upper directory a run left is newer than the delta: every command that changes the
/// delta takes it in first (restore, undo, apply, a writable mount), so no later import of a
/// stale upper overwrites what they did; those that only look (discard without --force, apply
/// --dry-run) refuse rather than answer without it.
fn commands_take_in_an_upper_left_behind_first(user: Option<u32>) {
    let _s = serial();
    if !common::fuse_or_skip("commands_take_in_an_upper_left_behind_first") {
        return;
    }
    let w = World::new(user);
    let src = w.source("lb-src");
    launched(&w.af(&["init", "lb", "--source", s(&src)]));
    launched(&w.af(&["snap", "lb", "empty"]));
    let upper = w.root().join("lb/upper");
    let leave = |name: &str| {
        fs::create_dir(&upper).unwrap();
        fs::write(upper.join(name), name).unwrap();
        w.own(&upper);
        w.own(&upper.join(name));
    };
    let names = || {
        let o = w.af(&["diff", "--project", "lb", "--name-only"]);
        assert!(o.status.success(), "{}", err(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    leave("a.txt");
    let e = refused(&w.af(&["discard", "lb", "--json"]), 4, "unapplied_changes");
    assert!(e["message"].as_str().unwrap().contains("upper"), "{e}");
    let o = w.af(&["apply", "lb", "--dry-run"]);
    assert_eq!(o.status.code(), Some(4), "{}", err(&o));
    assert!(err(&o).contains("unapplied_changes"), "{}", err(&o));
    assert!(upper.join("a.txt").is_file(), "a refusal changed the upper");
    // restore takes the upper in, saves that state, then restores: undo brings it back.
    let r = json_out(&w.af(&["restore", "lb", "empty", "--json"]));
    assert_eq!(
        r["imported"],
        serde_json::json!({"objects": 1, "whiteouts": 0}),
        "{r}"
    );
    assert!(
        !r["saved"].is_null(),
        "the upper's change was not saved: {r}"
    );
    assert!(!upper.exists());
    assert_eq!(names(), "");
    launched(&w.af(&["undo", "lb"]));
    assert_eq!(names(), "/a.txt\n");
    // undo, then apply.
    leave("b.txt");
    let o = w.af(&["undo", "lb"]);
    launched(&o);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("took the upper directory"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    leave("c.txt");
    launched(&w.af(&["apply", "lb"]));
    assert!(!upper.exists());
    assert_eq!(fs::read(src.join("c.txt")).unwrap(), b"c.txt");
    // A writable mount serves what the upper held.
    leave("d.txt");
    let mnt = w.base.join("lb-mnt");
    fs::create_dir(&mnt).unwrap();
    w.own(&mnt);
    let _cleanup = common::UnmountOnDrop(mnt.clone());
    launched(&w.af(&["mount", "lb", s(&mnt)]));
    // Read as the mount's owner: a FUSE mount refuses other users.
    let seen = w
        .command(Path::new("/bin/cat"), &[s(&mnt.join("d.txt"))])
        .output()
        .unwrap();
    launched(&w.af(&["umount", s(&mnt)]));
    assert_eq!(seen.stdout, b"d.txt", "{}", err(&seen));
    assert!(!upper.exists());
    assert_eq!(names(), "/d.txt\n");
}

#[test]
fn commands_take_in_an_upper_left_behind_first_as_root() {
    commands_take_in_an_upper_left_behind_first(None);
}

#[test]
fn commands_take_in_an_upper_left_behind_first_as_user() {
    if user_can_run("commands_take_in_an_upper_left_behind_first_as_user") {
        commands_take_in_an_upper_left_behind_first(Some(USER));
    }
}

#[test]
fn recover_imports_an_upper_left_behind_as_root() {
    recover_imports_an_upper_left_behind(None);
}

#[test]
fn recover_imports_an_upper_left_behind_as_user() {
    if user_can_run("recover_imports_an_upper_left_behind_as_user") {
        recover_imports_an_upper_left_behind(Some(USER));
    }
}
