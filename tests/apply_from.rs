//! `agentfs apply NAME --from REF [--path P]`: a project's snapshot is promoted into its
//! directory while its sandbox keeps writing, only the selected paths when asked, and a second
//! apply finds nothing to do.

mod common;

use std::fs;
use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use common::world::{err, launched, user_can_run, World, USER};

/// Where the view shows the test binary (the build tree is not in the view).
const BIN_IN_VIEW: &str = "/tmp/agentfs";

/// Wait (bounded) for the sandbox `run` to create `p`; its output when it ended first.
fn wait_for(p: &Path, run: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !p.exists() {
        if let Ok(Some(status)) = run.try_wait() {
            let mut e = String::new();
            if let Some(mut s) = run.stderr.take() {
                let _ = s.read_to_string(&mut e);
            }
            panic!("the sandbox ended ({status}) before {}: {e}", p.display());
        }
        assert!(Instant::now() < deadline, "{} never appeared", p.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ok(o: &std::process::Output) -> String {
    assert!(o.status.success(), "{}", err(o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn promote_while_the_sandbox_writes(user: Option<u32>) {
    let w = World::new(user);
    let src = w.source("src");
    let gate = w.base.join("gate");
    fs::create_dir(&gate).unwrap();
    w.own(&gate);
    // The sandbox's command may run as another uid than the caller (root's runs as nobody).
    fs::set_permissions(&gate, fs::Permissions::from_mode(0o777)).unwrap();
    ok(&w.af(&["init", "p", "--source", src.to_str().unwrap()]));
    // The sandbox writes `keep`, `sub/new` and `other`, takes a checkpoint (HEAD), then
    // rewrites A until told to stop. No automatic checkpoint moves HEAD meanwhile.
    let script = format!(
        "echo keep > keep && mkdir sub && echo new > sub/new && echo other > other && \
         printf '%08d' 0 > A && {BIN_IN_VIEW} checkpoint >/dev/null || exit 9; \
         ( i=0; while :; do i=$((i+1)); printf '%08d' $i 1<>A; sleep 0.02; done ) & \
         touch /gate/snapped; k=0; while [ ! -e /gate/stop ] && [ $k -lt 6000 ]; do \
         sleep 0.1; k=$((k+1)); done; kill $!"
    );
    let bin_bind = format!("{}:{BIN_IN_VIEW}", common::bin().display());
    let gate_bind = format!("{}:/gate", gate.display());
    let mut run = w
        .command(
            &common::bin(),
            &[
                "run",
                "p",
                "--ro-bind",
                &bin_bind,
                "--bind",
                &gate_bind,
                "--",
                "sh",
                "-c",
                &script,
            ],
        )
        .env("AGENTFS_CHECKPOINT_IDLE_MS", "0")
        .env("AGENTFS_CHECKPOINT_MAX_S", "86400")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&gate.join("snapped"), &mut run);

    // Only sub/ first: its new directory comes along, nothing else.
    let out = ok(&w.af(&["apply", "p", "--from", "HEAD", "--path", "sub"]));
    assert!(out.contains("applied"), "{out}");
    assert_eq!(fs::read(src.join("sub/new")).unwrap(), b"new\n");
    assert!(!src.join("keep").exists() && !src.join("A").exists());
    // Then the rest of the snapshot: A as it was at the checkpoint, not as it is now.
    ok(&w.af(&["apply", "p", "--from", "HEAD"]));
    assert_eq!(fs::read(src.join("keep")).unwrap(), b"keep\n");
    assert_eq!(fs::read(src.join("A")).unwrap(), b"00000000");
    // The sandbox keeps rewriting A in its delta; the snapshot has not changed.
    let again = ok(&w.af(&["apply", "p", "--from", "HEAD"]));
    assert!(again.starts_with("nothing to do"), "{again}");
    // No private copy is left in the project's directory.
    let left: Vec<_> = fs::read_dir(w.root().join("p"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("apply-copy-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    fs::write(gate.join("stop"), b"").unwrap();
    let o = run.wait_with_output().unwrap();
    launched(&o);
}

#[test]
fn promote_while_the_sandbox_writes_as_root() {
    if !common::fuse_or_skip("promote_while_the_sandbox_writes_as_root") {
        return;
    }
    promote_while_the_sandbox_writes(None);
}

#[test]
fn promote_while_the_sandbox_writes_as_user() {
    if !common::fuse_or_skip("promote_while_the_sandbox_writes_as_user")
        || !user_can_run("promote_while_the_sandbox_writes_as_user")
    {
        return;
    }
    promote_while_the_sandbox_writes(Some(USER));
}

#[test]
fn from_names_a_snapshot_of_a_project() {
    let w = World::new(None);
    let src = w.source("src");
    ok(&w.af(&["init", "p", "--source", src.to_str().unwrap()]));
    let o = w.af(&["--json", "apply", "p", "--from", "nosuch"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains(r#""detail":"unknown_ref""#), "{}", err(&o));
    let db = w.root().join("p/delta.db");
    let o = w.af(&["--json", "apply", db.to_str().unwrap(), "--from", "HEAD"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains(r#""code":"usage""#), "{}", err(&o));
}
