//! History through real sandbox runs: the exit snapshot, `agentfs checkpoint` inside and
//! outside, automatic checkpoints after a pause and at the ceiling, retention, and the
//! freezer's consistent cut under a writer that never stops.

mod common;

use std::path::PathBuf;
use std::process::Output;

use agentfs::history::db;
use agentfs::history::object::{decode_commit, decode_tree, Hash, Target};
use common::world::{err, failed_with, launched, refused, user_can_run, World, USER};
use serde_json::Value;

/// Where the view shows the test binary (the build tree is not in the view).
const BIN_IN_VIEW: &str = "/tmp/agentfs";

struct Run {
    w: World,
    src: PathBuf,
}

impl Run {
    fn new() -> Option<Run> {
        Run::as_user(None)
    }

    /// A project of root's, or of `USER` when `user` is set (None: the test is skipped).
    fn as_user(user: Option<u32>) -> Option<Run> {
        if !common::fuse_or_skip("checkpoints") || (user.is_some() && !user_can_run("checkpoints"))
        {
            return None;
        }
        let w = World::new(user);
        let src = w.source("src");
        let o = w.af(&["init", "p", "--source", src.to_str().unwrap()]);
        launched(&o);
        Some(Run { w, src })
    }

    /// `agentfs run p -- sh -c SCRIPT` with the binary at [`BIN_IN_VIEW`] and `env` knobs.
    fn run(&self, script: &str, env: &[(&str, &str)]) -> Output {
        self.run_with(&[], script, env)
    }

    /// [`Run::run`] with more options of `run` before the command.
    fn run_with(&self, options: &[&str], script: &str, env: &[(&str, &str)]) -> Output {
        self.command(options, script, env).output().unwrap()
    }

    /// The command of [`Run::run_with`], not started.
    fn command(
        &self,
        options: &[&str],
        script: &str,
        env: &[(&str, &str)],
    ) -> std::process::Command {
        let bind = format!("{}:{BIN_IN_VIEW}", common::bin().display());
        let mut args = vec!["run", "p", "--ro-bind", &bind];
        args.extend_from_slice(options);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        let mut c = self.w.command(&common::bin(), &args);
        for (k, v) in env {
            c.env(k, v);
        }
        c
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let o = self.w.af(&all);
        assert!(o.status.success(), "{all:?}: {}", err(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    /// The history record of the project's last run (`status --json`).
    fn last_run(&self) -> Value {
        self.json(&["status", "p"])["projects"][0]["last_run"]["history"].clone()
    }

    fn store(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(self.w.root().join("p/store/history.db")).unwrap()
    }

    /// The bytes of file `name` (at the root) in the state of commit `hex`, None when absent.
    fn file_at(&self, c: &rusqlite::Connection, hex: &str, name: &str) -> Option<Vec<u8>> {
        let h: Hash = (0..32)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect::<Vec<u8>>()
            .try_into()
            .unwrap();
        let commit = decode_commit(&db::get(c, &h).unwrap().1).unwrap();
        let tree = decode_tree(&db::get(c, &commit.state.tree()).unwrap().1).unwrap();
        let e = tree.iter().find(|e| e.name == name.as_bytes())?;
        match &e.target {
            Target::File { blob, .. } => Some(db::get(c, blob).unwrap().1),
            _ => None,
        }
    }
}

fn kinds(log: &Value) -> Vec<(String, String)> {
    log.as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["kind"].as_str().unwrap().to_string(),
                c["message"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn checkpoints(log: &Value) -> Vec<&Value> {
    log.as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "checkpoint")
        .collect()
}

#[test]
fn run_takes_an_exit_snapshot_with_what_the_command_wrote() {
    let Some(r) = Run::new() else { return };
    // The command says which cgroup it is in (the v2 line of /proc/self/cgroup).
    let o = r.run(
        "echo x > f; sed -n 's/^0:://p' /proc/self/cgroup",
        &[("AGENTFS_CHECKPOINT_IDLE_MS", "0")],
    );
    launched(&o);
    let inside = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let log = r.json(&["log", "p"]);
    let head = &log[0];
    assert_eq!(head["kind"], "exit", "{log}");
    assert_eq!(head["message"], "exit 0");
    let c = r.store();
    let f = r.file_at(&c, head["commit"].as_str().unwrap(), "f");
    assert_eq!(f.as_deref(), Some(&b"x\n"[..]));
    // The run record names it, and the freezer the run had.
    let status = r.json(&["status", "p"]);
    let rec = &status["projects"][0]["last_run"]["history"];
    assert_eq!(rec["exit_snapshot"], head["commit"], "{status}");
    // Every process of the sandbox is in the run's cgroup, the command included (it is
    // moved before the sandbox forks anything).
    let freezer = rec["freezer"].as_str().unwrap();
    assert!(freezer.starts_with("cgroup "), "{status}");
    assert!(
        inside.contains("/agentfs/p-") && freezer.ends_with(&inside),
        "the command is in {inside:?}, the freezer is {freezer:?}"
    );
    // The exit status is the command's, and a failing command is recorded too.
    let o = r.run(
        "echo y >> f; exit 3",
        &[("AGENTFS_CHECKPOINT_IDLE_MS", "0")],
    );
    assert_eq!(o.status.code(), Some(3), "{}", err(&o));
    let log = r.json(&["log", "p"]);
    assert_eq!(kinds(&log)[0], ("exit".into(), "exit 3".into()));
    assert_eq!(log.as_array().unwrap().len(), 2);
    assert!(!r.src.join("f").exists(), "the host tree is untouched");
}

#[test]
fn checkpoint_inside_waits_for_the_commit_and_outside_does_nothing() {
    let Some(r) = Run::new() else { return };
    // The checkpoint holds `before`, not `after`, which is written once the command returns.
    let script = format!(
        "echo one > before && {BIN_IN_VIEW} checkpoint --json > /tmp/cp.json && \
         echo two > after && cat /tmp/cp.json"
    );
    let o = r.run(&script, &[("AGENTFS_CHECKPOINT_IDLE_MS", "0")]);
    launched(&o);
    let reply: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(reply["sandbox"], true, "{reply}");
    let hash = reply["commit"].as_str().unwrap().to_string();
    let list = r.json(&["list", "p"]);
    let listed = list
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["commit"] == hash.as_str())
        .unwrap_or_else(|| panic!("{hash} not listed: {list}"));
    assert_eq!(listed["kind"], "checkpoint");
    assert!(
        listed["message"].as_str().unwrap().starts_with("requested"),
        "{listed}"
    );
    let c = r.store();
    assert_eq!(
        r.file_at(&c, &hash, "before").as_deref(),
        Some(&b"one\n"[..])
    );
    assert_eq!(r.file_at(&c, &hash, "after"), None);
    // The walk ran lowered to the default nice value, or at the server's with the knob at 0.
    assert_eq!(r.last_run()["walk_nice"], 10, "{}", r.last_run());
    let o = r.run(
        &script,
        &[
            ("AGENTFS_CHECKPOINT_IDLE_MS", "0"),
            ("AGENTFS_CHECKPOINT_NICE", "0"),
        ],
    );
    launched(&o);
    assert_eq!(r.last_run()["walk_nice"], 0, "{}", r.last_run());

    // Outside a sandbox: exit 0, nothing printed, nothing recorded.
    let before = r.json(&["list", "p"]).as_array().unwrap().len();
    let o =
        r.w.command(&common::bin(), &["checkpoint"])
            .env_remove("AGENTFS_SANDBOX")
            .output()
            .unwrap();
    assert!(o.status.success(), "{}", err(&o));
    assert!(o.stdout.is_empty() && o.stderr.is_empty());
    assert_eq!(r.json(&["list", "p"]).as_array().unwrap().len(), before);
}

#[test]
fn automatic_checkpoints_follow_pauses_and_the_ceiling() {
    let test = "automatic_checkpoints_follow_pauses_and_the_ceiling";
    if !common::fuse_only(test, "automatic checkpoints") {
        return;
    }
    let Some(r) = Run::new() else { return };
    // A pause longer than the idle time: one checkpoint, taken by the watcher alone.
    let o = r.run(
        "echo a > f; sleep 2; echo b > g",
        &[
            ("AGENTFS_CHECKPOINT_IDLE_MS", "300"),
            ("AGENTFS_CHECKPOINT_MAX_S", "0"),
        ],
    );
    launched(&o);
    let log = r.json(&["log", "p"]);
    let cps = checkpoints(&log);
    assert_eq!(cps.len(), 1, "{log}");
    assert!(cps[0]["message"].as_str().unwrap().starts_with("idle"));
    let c = r.store();
    let h = cps[0]["commit"].as_str().unwrap();
    assert_eq!(r.file_at(&c, h, "f").as_deref(), Some(&b"a\n"[..]));
    assert_eq!(r.file_at(&c, h, "g"), None);

    // Writes every 50 ms for 4 s never pause for 1 s: no checkpoint without a ceiling...
    let writer = "i=0; while [ $i -lt 80 ]; do echo $i > w; i=$((i+1)); sleep 0.05; done";
    let busy = [
        ("AGENTFS_CHECKPOINT_IDLE_MS", "1000"),
        ("AGENTFS_CHECKPOINT_MAX_S", "0"),
    ];
    let n = checkpoints(&r.json(&["log", "p"])).len();
    launched(&r.run(writer, &busy));
    assert_eq!(checkpoints(&r.json(&["log", "p"])).len(), n);
    // ... and with a 1 s ceiling, checkpoints at the ceiling only.
    let ceiling = [
        ("AGENTFS_CHECKPOINT_IDLE_MS", "1000"),
        ("AGENTFS_CHECKPOINT_MAX_S", "1"),
    ];
    launched(&r.run(writer, &ceiling));
    let log = r.json(&["log", "p"]);
    let new: Vec<&Value> = checkpoints(&log)
        .into_iter()
        .take_while(|c| c["commit"] != cps[0]["commit"])
        .collect();
    assert!(new.len() >= 2, "{log}");
    for c in &new {
        assert!(c["message"].as_str().unwrap().starts_with("ceiling"), "{c}");
    }
}

#[test]
fn retention_prunes_old_checkpoints_and_gc_drops_only_their_objects() {
    let Some(r) = Run::new() else { return };
    // Nine checkpoints, each with a file of its own.
    let script = format!(
        "i=0; while [ $i -lt 9 ]; do echo $i > f$i; {BIN_IN_VIEW} checkpoint >/dev/null || exit 9; \
         i=$((i+1)); done"
    );
    let env = [
        ("AGENTFS_CHECKPOINT_IDLE_MS", "0"),
        ("AGENTFS_CHECKPOINT_KEEP", "3"),
    ];
    launched(&r.run(&script, &env));
    let log = r.json(&["log", "p"]);
    let cps = checkpoints(&log);
    assert_eq!(cps.len(), 9, "{log}");
    // HEAD's parent, then the newest three, then one per hour (the same hour: none more).
    let kept = cps.iter().filter(|c| c["pruned"] == false).count();
    let pruned: Vec<&&Value> = cps.iter().filter(|c| c["pruned"] == true).collect();
    assert!(kept == 4 || kept == 5, "{log}");
    assert_eq!(kept + pruned.len(), 9);
    assert!(cps[..4].iter().all(|c| c["pruned"] == false), "{log}");
    let gone = pruned[0]["commit"].as_str().unwrap();
    failed_with(
        &r.w.af(&["--json", "restore", "p", gone]),
        2,
        "not_found",
        "pruned",
    );
    // gc: the dry run and the real run agree, and the store stays sound.
    let dry = r.json(&["gc", "p", "--dry-run"]);
    assert!(dry["count"].as_u64().unwrap() >= 1, "{dry}");
    let real = r.json(&["gc", "p"]);
    assert_eq!(dry["objects"], real["objects"]);
    let check = r.json(&["gc", "p", "--check"]);
    assert_eq!(check["findings"], serde_json::json!([]), "{check}");
    // Every commit is still in the log, and the kept ones restore.
    assert_eq!(checkpoints(&r.json(&["log", "p"])).len(), 9);
    let o =
        r.w.af(&["restore", "p", cps[2]["commit"].as_str().unwrap()]);
    launched(&o);
}

/// Frozen checkpoints asked for back to back while a writer inside writes A then B.
const FROZEN_ROUNDS: usize = 200;

#[test]
fn frozen_checkpoints_never_split_a_pair_of_writes() {
    let Some(r) = Run::new() else { return };
    // The writer writes A then B with the same counter, forever; the requester asks for
    // checkpoints back to back (the watcher serves a request as it arrives). Every checkpoint
    // must hold a state the writer passed through: A equal to B, or A one ahead.
    let script = format!(
        "printf '%08d' 0 > A; printf '%08d' 0 > B; \
         ( i=0; while :; do i=$((i+1)); printf '%08d' $i 1<>A; printf '%08d' $i 1<>B; done ) & \
         n=0; start=$(date +%s); \
         while [ $n -lt {FROZEN_ROUNDS} ] && [ $(( $(date +%s) - start )) -lt 600 ]; do \
           {BIN_IN_VIEW} checkpoint >/dev/null || exit 9; n=$((n+1)); done; \
         kill $!; echo $n"
    );
    let env = [
        ("AGENTFS_CHECKPOINT_IDLE_MS", "0"),
        ("AGENTFS_CHECKPOINT_KEEP", "0"),
    ];
    let started = std::time::Instant::now();
    let o = r.run(&script, &env);
    launched(&o);
    let took = started.elapsed();
    let asked: usize = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    // A count, not a rate: a loaded machine takes longer, the 600 s cap only ends a hang.
    assert_eq!(asked, FROZEN_ROUNDS, "only {asked} checkpoints in 600 s");
    let rec = r.last_run();
    assert_eq!(rec["checkpoints"], FROZEN_ROUNDS, "{rec}");
    assert_eq!(rec["frozen_checkpoints"], FROZEN_ROUNDS, "{rec}");
    assert!(rec["frozen_ms_max"].as_f64().unwrap() > 0.0, "{rec}");
    let log = r.json(&["log", "p"]);
    let cps = checkpoints(&log);
    let c = r.store();
    // Both files hold a number before the first checkpoint, and the writer writes
    // fixed-width numbers in place (no truncate), so every checkpoint holds both. They must be equal, or A one ahead; B ahead of A is a torn cut.
    let num = |b: Option<Vec<u8>>| -> Option<u64> {
        b.and_then(|b| String::from_utf8_lossy(&b).trim().parse().ok())
    };
    // (A, B) of every checkpoint holding both, oldest first, to show a torn one in context.
    let mut pairs: Vec<(u64, u64, &str)> = Vec::new();
    for cp in cps.iter().rev() {
        assert!(cp["message"].as_str().unwrap().contains("(frozen)"), "{cp}");
        let h = cp["commit"].as_str().unwrap();
        if let (Some(a), Some(b)) = (num(r.file_at(&c, h, "A")), num(r.file_at(&c, h, "B"))) {
            pairs.push((a, b, h));
        }
    }
    for (i, (a, b, h)) in pairs.iter().enumerate() {
        let around = &pairs[i.saturating_sub(2)..(i + 2).min(pairs.len())];
        assert!(
            a == b || *a == b + 1,
            "checkpoint {h}: A={a} B={b}; (A, B) around it: {:?}",
            around.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>()
        );
    }
    let seen = pairs.len();
    eprintln!(
        "{asked} checkpoints asked, {} recorded, {seen} with both files, in {:.1} s \
         (longest freeze {} ms)",
        cps.len(),
        took.as_secs_f64(),
        rec["frozen_ms_max"]
    );
    assert_eq!(
        seen,
        cps.len(),
        "{seen} of {} checkpoints held both files",
        cps.len()
    );
}

/// An ordinary user has no cgroup of its own to freeze (no delegated subtree): `auto` says
/// so before the command runs and takes unfrozen checkpoints, `require` refuses and runs
/// nothing, `off` records that it never freezes.
#[test]
fn an_ordinary_user_without_a_cgroup_gets_unfrozen_or_refused_runs() {
    let Some(r) = Run::as_user(Some(USER)) else {
        return;
    };
    let script =
        format!("echo started >&2; echo a > f; {BIN_IN_VIEW} checkpoint --json; echo b > g");
    let freeze = |mode| {
        [
            ("AGENTFS_CHECKPOINT_FREEZE", mode),
            ("AGENTFS_CHECKPOINT_IDLE_MS", "0"),
        ]
    };
    let o = r.run(&script, &freeze("auto"));
    launched(&o);
    let rec = r.last_run();
    let freezer = rec["freezer"].as_str().unwrap();
    if freezer.starts_with("cgroup ") {
        eprintln!("SKIP: this user has a delegated cgroup ({freezer})");
        return;
    }
    // One line before the command's first output, and the record says why.
    let e = err(&o);
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), 2, "{e}");
    assert!(
        lines[0]
            .starts_with("agentfs: freezer_unavailable: checkpoints of this run are not frozen"),
        "{e}"
    );
    assert_eq!(lines[1], "started", "{e}");
    assert!(freezer.starts_with("unfrozen: "), "{rec}");
    // The checkpoint was taken, unfrozen, and holds what was written before it.
    let reply: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(reply["sandbox"], true, "{reply}");
    assert!(reply["frozen_ms"].is_null(), "{reply}");
    assert_eq!(rec["checkpoints"], 1, "{rec}");
    assert_eq!(rec["frozen_checkpoints"], 0, "{rec}");
    let log = r.json(&["log", "p"]);
    let cps = checkpoints(&log);
    assert_eq!(cps.len(), 1, "{log}");
    assert_eq!(cps[0]["commit"], reply["commit"]);
    assert!(
        cps[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("requested (unfrozen: "),
        "{log}"
    );
    let c = r.store();
    let h = cps[0]["commit"].as_str().unwrap();
    assert_eq!(r.file_at(&c, h, "f").as_deref(), Some(&b"a\n"[..]));
    assert_eq!(r.file_at(&c, h, "g"), None);

    // require: refused before launch, the command never ran (its marker is absent, no exit
    // snapshot was taken).
    let out = r.w.base.join("out");
    std::fs::create_dir(&out).unwrap();
    r.w.own(&out);
    let bind = format!("{}:/out", out.display());
    let commits = log.as_array().unwrap().len();
    let o = r.run_with(&["--bind", &bind], "touch /out/marker", &freeze("require"));
    refused(&o, 125, "freezer_unavailable");
    assert!(o.stdout.is_empty());
    assert!(!out.join("marker").exists(), "the command ran");
    assert_eq!(r.json(&["log", "p"]).as_array().unwrap().len(), commits);
    // The same bind works when the launch is allowed: the marker shows the command runs.
    launched(&r.run_with(&["--bind", &bind], "touch /out/marker", &freeze("auto")));
    assert!(out.join("marker").exists());

    // off: no line, and the record says checkpoints are never frozen.
    let o = r.run(&script, &freeze("off"));
    launched(&o);
    assert_eq!(err(&o), "started\n");
    let rec = r.last_run();
    assert!(
        rec["freezer"].as_str().unwrap().starts_with("off "),
        "{rec}"
    );
    assert_eq!(rec["checkpoints"], 1, "{rec}");
    assert_eq!(rec["frozen_checkpoints"], 0, "{rec}");
}

/// A shell function inside the sandbox: wait (at most 600 s) until the test makes /gate/NAME.
const WAIT_FOR: &str = "wait_for() { i=0; while [ ! -e /gate/$1 ] && [ $i -lt 6000 ]; do \
                        sleep 0.1; i=$((i+1)); done; }";

/// A live sandbox of `r`'s project that ran `first` and waits for the test's go, then runs
/// `then` (which may wait for more gates with `wait_for NAME`); the gate directory is bound at
/// /gate. Dropping the returned [`Go`] lets it go on.
fn live_sandbox(
    r: &Run,
    first: &str,
    then: &str,
    env: &[(&str, &str)],
) -> (std::process::Child, Go) {
    let gate = r.w.base.join("gate");
    // A fresh gate: an earlier sandbox's files would open it at once.
    let _ = std::fs::remove_dir_all(&gate);
    std::fs::create_dir_all(&gate).unwrap();
    // Root's command runs as another id (docs/sandbox.md): the gate is open to it.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&gate, std::fs::Permissions::from_mode(0o777)).unwrap();
    let bind = format!("{}:/gate", gate.display());
    let script = format!("{WAIT_FOR}; {first}; touch /gate/started; wait_for go; {then}");
    let child = r
        .command(&["--bind", &bind], &script, env)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    await_gate(&gate.join("started"));
    (child, Go(gate.join("go")))
}

/// Wait until the sandbox makes `file` (at most 120 s: then it never will).
fn await_gate(file: &std::path::Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !file.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox did not make {}",
            file.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The go file of [`live_sandbox`], also written when an assertion fails, so the sandbox never
/// outlives the test.
struct Go(PathBuf);

impl Drop for Go {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, b"");
    }
}

/// A command that `exec` adds to a live sandbox joins the sandbox's cgroup, so checkpoints
/// freeze it too. When it cannot (here: the cgroup the live marker names is gone), it is
/// refused under AGENTFS_CHECKPOINT_FREEZE=require (`freezer_unavailable`, exit 125, nothing
/// ran) and runs with one line saying so under `auto`; it never runs unfrozen unannounced.
#[test]
fn exec_that_cannot_join_the_sandboxs_cgroup_is_refused_or_says_so() {
    let Some(r) = Run::new() else { return };
    let quiet = [("AGENTFS_CHECKPOINT_IDLE_MS", "0")];
    let (child, go) = live_sandbox(&r, "true", "", &quiet);
    let marker = r.w.root().join("p/live.json");
    let mut live: Value = serde_json::from_slice(&std::fs::read(&marker).unwrap()).unwrap();
    if live["cgroup"].is_null() {
        eprintln!("SKIP exec_that_cannot_join_the_sandboxs_cgroup: the run has no cgroup");
        drop(go);
        let _ = child.wait_with_output();
        return;
    }
    live["cgroup"] = Value::from("/sys/fs/cgroup/agentfs-test-gone");
    std::fs::write(&marker, serde_json::to_vec(&live).unwrap()).unwrap();
    let exec = |mode: &str, name: &str| {
        let touch = format!("/gate/{name}");
        let mut c =
            r.w.command(&common::bin(), &["exec", "p", "--", "touch", &touch]);
        c.env("AGENTFS_CHECKPOINT_FREEZE", mode);
        c.output().unwrap()
    };
    let gate = r.w.base.join("gate");
    refused(&exec("require", "required"), 125, "freezer_unavailable");
    assert!(!gate.join("required").exists(), "a refused command ran");
    let o = exec("auto", "auto");
    launched(&o);
    let e = err(&o);
    assert!(e.contains("checkpoints do not freeze this command"), "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    assert!(gate.join("auto").exists(), "the command did not run");
    drop(go);
    launched(&child.wait_with_output().unwrap());
}

/// While a sandbox runs on the project, `restore` and `undo` refuse (`sandbox_live`, exit 4)
/// and change nothing; once it has ended they work.
#[test]
fn restore_and_undo_refuse_while_the_sandbox_runs() {
    let Some(r) = Run::new() else { return };
    let quiet = [("AGENTFS_CHECKPOINT_IDLE_MS", "0")];
    launched(&r.run("echo one > f", &quiet));
    // The command writes, says it started, and waits for the test's go.
    let (child, go) = live_sandbox(&r, "echo two > f", "", &quiet);
    let before = r.json(&["log", "p"]);
    for verb in [vec!["restore", "p", "HEAD"], vec!["undo", "p"]] {
        refused(&r.w.af(&verb), 4, "sandbox_live");
    }
    assert_eq!(r.json(&["log", "p"]), before, "the history changed");
    drop(go);
    launched(&child.wait_with_output().unwrap());
    // The run's exit snapshot holds what it wrote; now an undo goes back before it.
    let log = r.json(&["log", "p"]);
    let c = r.store();
    let head = log[0]["commit"].as_str().unwrap();
    assert_eq!(r.file_at(&c, head, "f").as_deref(), Some(&b"two\n"[..]));
    launched(&r.w.af(&["undo", "p"]));
    let head = r.json(&["log", "p"])[0]["commit"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(r.file_at(&c, &head, "f").as_deref(), Some(&b"one\n"[..]));
}

/// `agentfs checkpoint` inside a live sandbox fails with a named error: its watcher out of
/// reach (the request socket removed from the project's run/ directory) is
/// `checkpoint_unavailable`; a watcher that cannot store the checkpoint (the history database
/// held locked from outside beyond the busy timeout) answers `checkpoint_failed`. Exit 1 both.
fn checkpoint_requests_that_fail(user: Option<u32>) {
    let Some(r) = Run::as_user(user) else { return };
    let quiet = [("AGENTFS_CHECKPOINT_IDLE_MS", "0")];
    let ask = format!("exec {BIN_IN_VIEW} --json checkpoint");
    let (child, go) = live_sandbox(&r, "true", &ask, &quiet);
    std::fs::remove_file(r.w.root().join("p/run/checkpoint.sock")).unwrap();
    drop(go);
    let o = child.wait_with_output().unwrap();
    failed_with(&o, 1, "io", "checkpoint_unavailable");

    let busy = [
        ("AGENTFS_CHECKPOINT_IDLE_MS", "0"),
        ("AGENTFS_SQLITE_BUSY_TIMEOUT_MS", "100"),
    ];
    // The command asks, says so, and ends (with the request's status) once the lock is gone,
    // so that its exit snapshot is stored.
    let ask =
        format!("{BIN_IN_VIEW} --json checkpoint; s=$?; touch /gate/asked; wait_for done; exit $s");
    let (child, go) = live_sandbox(&r, "echo x > f", &ask, &busy);
    let done = Go(r.w.base.join("gate/done"));
    let lock = r.store();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    drop(go);
    await_gate(&r.w.base.join("gate/asked"));
    lock.execute_batch("ROLLBACK").unwrap();
    drop(done);
    let o = child.wait_with_output().unwrap();
    failed_with(&o, 1, "server_failed", "checkpoint_failed");
    // Only the request failed: the run's exit snapshot holds what the command wrote.
    let log = r.json(&["log", "p"]);
    assert_eq!(kinds(&log)[0], ("exit".into(), "exit 1".into()), "{log}");
    assert!(checkpoints(&log).is_empty(), "{log}");
    let c = r.store();
    let head = log[0]["commit"].as_str().unwrap();
    assert_eq!(r.file_at(&c, head, "f").as_deref(), Some(&b"x\n"[..]));
}

#[test]
fn checkpoint_requests_that_fail_as_root() {
    checkpoint_requests_that_fail(None);
}

#[test]
fn checkpoint_requests_that_fail_as_user() {
    checkpoint_requests_that_fail(Some(USER));
}

/// On the overlayfs backend a checkpoint imports the upper directory into the delta while the
/// sandbox is frozen: it holds what was written before it and not what came after, and the
/// run's end still imports everything.
#[test]
fn a_checkpoint_on_overlayfs_holds_the_writes_made_before_it() {
    let Some(r) = Run::new() else { return };
    let script = format!(
        "echo one > before && {BIN_IN_VIEW} checkpoint --json > /tmp/cp.json && \
         echo two > after && cat /tmp/cp.json"
    );
    let o = r.run_with(
        &["--mount-backend", "overlayfs"],
        &script,
        &[("AGENTFS_CHECKPOINT_IDLE_MS", "0")],
    );
    launched(&o);
    let reply: Value = serde_json::from_slice(&o.stdout).unwrap();
    let hash = reply["commit"].as_str().unwrap().to_string();
    let c = r.store();
    assert_eq!(
        r.file_at(&c, &hash, "before").as_deref(),
        Some(&b"one\n"[..])
    );
    assert_eq!(r.file_at(&c, &hash, "after"), None);
    let status = r.json(&["status", "p"]);
    assert_eq!(status["projects"][0]["last_run"]["backend"], "overlayfs");
    let exit = status["projects"][0]["last_run"]["history"]["exit_snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        r.file_at(&c, &exit, "after").as_deref(),
        Some(&b"two\n"[..])
    );
}
