//! Named errors: each code a harness branches on, triggered for real, with `--json` printing
//! exactly one object `{"error":{"code","detail","message","path"}}` on stderr and the exit
//! status of its class (docs/harness.md).

mod common;
mod fixtures;

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Stdio};

use common::world::{failed, failed_with, launched, user_can_run, World, USER};
use common::{agentfs, bin, fuse_or_skip, init_overlay, Mounted};
use serde_json::Value;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
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

/// A knob whose value does not parse or lies outside its range is `config_invalid` with detail
/// `bad_knob` on every verb, exit 2 (125 for the verbs that launch a sandbox), before the verb
/// does anything; the text form names `bad_knob` too.
fn bad_knobs(user: Option<u32>) {
    let w = World::new(user);
    let src = w.source("proj");
    assert!(w.af(&["init", "p", "--source", s(&src)]).status.success());
    let dir = w.root().join("p");
    let db = dir.join("delta.db");
    let mnt = w.base.join("mnt");
    fs::create_dir(&mnt).unwrap();
    w.own(&mnt);
    let _unmount = common::UnmountOnDrop(mnt.clone());
    let log = || w.af(&["log", "p", "--json"]).stdout;
    let before = log();
    let other = w.source("other");
    let new_db = w.base.join("new.db");
    let verbs: &[(&[&str], i32)] = &[
        (&["status"], 2),
        (&["init", "q", "--source", s(&other)], 2),
        (&["mount", "p", s(&mnt)], 2),
        (&["mount", s(&new_db), s(&mnt)], 2),
        (&["umount", s(&mnt)], 2),
        (&["fs", s(&db), "ls", "/"], 2),
        (&["diff", "--project", "p"], 2),
        (&["snap", "p"], 2),
        (&["log", "p"], 2),
        (&["integrity", s(&db)], 2),
        (&["recover"], 2),
        (&["knobs"], 2),
        (&["run", "p", "--", "true"], 125),
        (&["exec", "p", "--", "true"], 125),
        (&["quick", s(&src), "--", "true"], 125),
    ];
    for (knob, value) in [
        ("AGENTFS_MEMORY_BUDGET_MIB", "abc"),
        ("AGENTFS_FUSE_THREADS", "0"),
        ("AGENTFS_FUSE_READDIRPLUS", "maybe"),
    ] {
        for (args, status) in verbs {
            let mut all = vec!["--json"];
            all.extend_from_slice(args);
            let o = w.command(&bin(), &all).env(knob, value).output().unwrap();
            let e = failed_with(&o, *status, "config_invalid", "bad_knob");
            assert!(
                e["message"].as_str().unwrap().contains(knob),
                "{args:?}: {e}"
            );
            let o = w.command(&bin(), args).env(knob, value).output().unwrap();
            common::world::refused(&o, *status, "bad_knob");
        }
    }
    // Nothing was made, mounted or snapshotted.
    assert!(!w.root().join("q").exists());
    assert!(!new_db.exists());
    assert!(!common::is_mounted(&mnt));
    assert_eq!(log(), before);
}

#[test]
fn bad_knobs_as_root() {
    bad_knobs(None);
}

#[test]
fn bad_knobs_as_user() {
    if user_can_run("bad_knobs_as_user") {
        bad_knobs(Some(USER));
    }
}

/// Fine codes of projects, their configuration, their history and their databases.
#[test]
fn project_and_history_codes() {
    let w = World::new(None);
    let src = w.source("proj");
    assert!(w.af(&["init", "p", "--source", s(&src)]).status.success());

    let o = w
        .command(&bin(), &["--json", "init", "q", "--source", s(&src)])
        .env_remove("HOME")
        .output()
        .unwrap();
    failed_with(&o, 2, "config_invalid", "no_home");

    // A new project's history holds one snapshot: there is nothing before it.
    failed_with(
        &w.af(&["--json", "undo", "p"]),
        2,
        "not_found",
        "nothing_to_undo",
    );

    // A file is no directory to overlay.
    let file = src.join("README");
    failed_with(
        &w.af(&["--json", "init", "d", "--source", s(&file)]),
        1,
        "io",
        "delta_create",
    );

    // An ignore pattern with a slash: refused by a snapshot and by a sandbox launch alike.
    let config = w.root().join("p/config.toml");
    let good = fs::read_to_string(&config).unwrap();
    let bad = good.replacen("[project]\n", "[project]\nignore = [\"a/b\"]\n", 1);
    assert_ne!(bad, good);
    fs::write(&config, &bad).unwrap();
    failed_with(
        &w.af(&["--json", "snap", "p"]),
        2,
        "config_invalid",
        "bad_ignore_pattern",
    );
    failed_with(
        &w.af(&["--json", "run", "p", "--", "true"]),
        125,
        "config_invalid",
        "bad_ignore_pattern",
    );
    fs::write(&config, &good).unwrap();

    // A configuration that is not TOML, and one with a key no section has.
    for bad in ["[project\n", "[project]\nsauce = \"/x\"\n"] {
        fs::write(&config, bad).unwrap();
        failed_with(
            &w.af(&["--json", "snap", "p"]),
            2,
            "config_invalid",
            "bad_config",
        );
        failed_with(
            &w.af(&["--json", "run", "p", "--", "true"]),
            125,
            "config_invalid",
            "bad_config",
        );
    }
    fs::write(&config, &good).unwrap();

    let o = w
        .command(&bin(), &["--json", "run", "p", "--", "true"])
        .env("AGENTFS_CHECKPOINT_FREEZE", "sometimes")
        .output()
        .unwrap();
    failed_with(&o, 125, "config_invalid", "bad_knob");

    // A configuration that cannot be read (a directory where the file belongs).
    fs::remove_file(&config).unwrap();
    fs::create_dir(&config).unwrap();
    failed_with(
        &w.af(&["--json", "snap", "p"]),
        2,
        "config_invalid",
        "config_unreadable",
    );
    fs::remove_dir(&config).unwrap();
    fs::write(&config, &good).unwrap();

    // A database of a schema version newer than this agentfs knows.
    let db = w.base.join("new.db");
    assert!(w.af(&["init", s(&db)]).status.success());
    rusqlite::Connection::open(&db)
        .unwrap()
        .pragma_update(None, "user_version", 6)
        .unwrap();
    failed_with(
        &w.af(&["--json", "fs", s(&db), "ls", "/"]),
        2,
        "not_a_database",
        "db_unknown_schema",
    );

    let url = format!("file://{}", s(&w.base.join("replica")));
    failed_with(
        &w.af(&["--json", "replicate", s(&w.base.join("nowhere.db")), &url]),
        2,
        "not_found",
        "no_database",
    );
}

/// A read-only mount refuses to replicate (before it mounts anything).
#[test]
fn replicate_readonly() {
    let litestream = common::s3::venv().join("litestream");
    if !litestream.exists() {
        assert!(
            !agentfs::knobs::get().require_litestream,
            "AGENTFS_REQUIRE_LITESTREAM=1 but {} is missing (run validation/install-deps.sh)",
            litestream.display()
        );
        eprintln!("SKIP replicate_readonly: no Litestream test environment");
        return;
    }
    let w = World::new(None);
    let db = w.base.join("a.db");
    let mnt = w.base.join("mnt");
    fs::create_dir(&mnt).unwrap();
    assert!(w.af(&["init", s(&db)]).status.success());
    let url = format!("file://{}", s(&w.base.join("replica")));
    let o = w
        .command(
            &bin(),
            &[
                "--json",
                "mount",
                s(&db),
                s(&mnt),
                "-o",
                "ro",
                "--replicate",
                &url,
            ],
        )
        .env("AGENTFS_LITESTREAM", &litestream)
        .output()
        .unwrap();
    failed_with(&o, 2, "usage", "replicate_readonly");
    assert!(!common::is_mounted(&mnt));
}

/// A launch that mounts its view and then cannot finish it, cannot enforce its policy, cannot
/// make its user namespace, or cannot run the command: the sandbox refuses with exit 125 and
/// leaves nothing mounted.
fn launch_failures(user: Option<u32>) {
    let w = World::new(user);
    let src = w.source("proj");
    let o = w.af(&["init", "p", "--source", s(&src)]);
    assert!(o.status.success(), "{}", common::world::err(&o));
    failed(
        &w.af(&["--json", "run", "p", "--", "/nonexistent/command"]),
        125,
        "command_failed",
    );
    // A file bound over a directory.
    let config = w.root().join("p/config.toml");
    let good = fs::read_to_string(&config).unwrap();
    let bind = format!(
        "\n[sandbox]\nbinds = [\"{}:/tmp\"]\n",
        s(&src.join("README"))
    );
    fs::write(&config, good.replacen("\n[sandbox]\n", &bind, 1)).unwrap();
    failed_with(
        &w.af(&["--json", "run", "p", "--", "true"]),
        125,
        "mount_failed",
        "bind_failed",
    );
    fs::write(&config, &good).unwrap();

    // The sandbox as an ordinary user (uid 1000) of a user namespace nested in one of our own
    // (`unshare -U -r`), as in a container: what that outer namespace's root decides binds
    // the sandbox. Each launch would mark its run in /out.
    let data = w.base.join("data");
    let out = w.base.join("out");
    for d in [&data, &out] {
        fs::create_dir(d).unwrap();
        w.own(d);
    }
    let nested = |outer: &str, run: &str| {
        let script = format!(
            "{outer} && exec unshare -U --map-user=1000 --map-group=1000 \"$0\" --json run p \
             --bind \"$2:/out\" --writable-root /out {run} -- touch /out/ran"
        );
        w.cmd(
            Path::new("unshare"),
            &[
                "-U",
                "-r",
                "-m",
                "sh",
                "-c",
                &script,
                s(&bin()),
                s(&data),
                s(&out),
            ],
        )
    };
    // A writable root whose source the outer root made read-only: the sandbox's namespace
    // inherits that mount locked read-only, and the kernel refuses to make it writable.
    let o = nested(
        r#"mount --bind "$1" "$1" && mount -o remount,bind,ro "$1""#,
        r#"--bind "$1:/data" --writable-root /data"#,
    );
    let e = failed(&o, 125, "policy_unenforceable");
    assert!(e["message"].as_str().unwrap().contains("/data"), "{e}");
    assert!(!out.join("ran").exists(), "the command ran");
    // The outer root allows one user namespace below its own (the preflight reads the
    // sandbox user's namespace, which allows them): the sandbox's is one too many.
    let o = nested("echo 1 > /proc/sys/user/max_user_namespaces", "");
    failed_with(&o, 125, "unsupported_platform", "userns_denied");
    assert!(!out.join("ran").exists(), "the command ran");
    // A delta the server may not write (the sandbox's user has no capabilities in its own
    // namespace, so root's world too): its server refuses to start, before the command.
    let delta = w.root().join("p/delta.db");
    fs::set_permissions(&delta, fs::Permissions::from_mode(0o444)).unwrap();
    let o = nested("true", "");
    fs::set_permissions(&delta, fs::Permissions::from_mode(0o644)).unwrap();
    let e = failed(&o, 125, "server_failed");
    assert!(
        e["message"].as_str().unwrap().contains("not writable"),
        "{e}"
    );
    assert!(!out.join("ran").exists(), "the command ran");
    // Both launches work without the outer root's limits.
    launched(&nested(
        "true",
        r#"--bind "$1:/data" --writable-root /data"#,
    ));
    assert!(out.join("ran").exists(), "the command did not run");
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(s(&w.base)), "{mounts}");
}

#[test]
fn launch_failures_as_root() {
    if fuse_or_skip("launch_failures_as_root") {
        launch_failures(None);
    }
}

#[test]
fn launch_failures_as_user() {
    if fuse_or_skip("launch_failures_as_user") && user_can_run("launch_failures_as_user") {
        launch_failures(Some(USER));
    }
}

/// Codes no test triggers yet, each with the reason (a code listed here and named by a test
/// fails [`every_code_is_triggered_by_a_test`]: take it off the list).
const UNTESTED: &[&str] = &[];

/// The text of the tests: tests/*.rs and src/'s unit tests (a `#[cfg(test)]` module to the end
/// of its file, and files under a `tests` directory). src/errors.rs and src/cli/error.rs only
/// format codes, which triggers none.
fn test_texts() -> Vec<(std::path::PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    walk(&root.join("tests"), &mut files);
    walk(&root.join("src"), &mut files);
    let skip = [root.join("src/errors.rs"), root.join("src/cli/error.rs")];
    files
        .into_iter()
        .filter(|p| !skip.contains(p))
        .filter_map(|p| {
            let text = fs::read_to_string(&p).unwrap();
            let unit = p.starts_with(root.join("tests"))
                || p.components().any(|c| c.as_os_str() == "tests");
            let text = if unit {
                text
            } else {
                text.split_once("#[cfg(test)]")?.1.to_string()
            };
            Some((p, text))
        })
        .collect()
}

/// Every code of the closed table is triggered by some test (named as `"code"` in an
/// assertion, or as `Code::Variant` in a unit test), or listed in [`UNTESTED`].
#[test]
fn every_code_is_triggered_by_a_test() {
    let texts = test_texts();
    let untested: Vec<&str> = UNTESTED
        .iter()
        .map(|u| u.split_once(':').map_or(*u, |(name, _)| name))
        .collect();
    for c in agentfs::errors::Code::ALL {
        let name = c.as_str();
        let variant = format!("Code::{c:?}");
        let quoted = format!("\"{name}\"");
        let named = texts
            .iter()
            .any(|(_, t)| t.contains(&quoted) || t.contains(&variant));
        let listed = untested.contains(&name);
        assert!(named || listed, "no test triggers {name}");
        assert!(
            !(named && listed),
            "{name} is tested now: take it off UNTESTED"
        );
    }
    for name in untested {
        assert!(
            agentfs::errors::Code::named(name).is_some(),
            "UNTESTED names {name}, no code"
        );
    }
}

/// Project `name` over `src`, with one snapshot of `/new` holding each of `contents` in turn.
fn project_with_snapshots(
    w: &World,
    name: &str,
    src: &Path,
    contents: &[&str],
) -> std::path::PathBuf {
    let o = w.af(&["init", name, "--source", s(src)]);
    assert!(o.status.success(), "{}", common::world::err(&o));
    let dir = w.root().join(name);
    for content in contents {
        let mut c = w
            .command(&bin(), &["fs", s(&dir.join("delta.db")), "write", "/new"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write as _;
            c.stdin
                .take()
                .unwrap()
                .write_all(content.as_bytes())
                .unwrap();
        }
        assert!(c.wait().unwrap().success());
        let o = w.af(&["snap", name]);
        assert!(o.status.success(), "{}", common::world::err(&o));
    }
    dir
}

/// Run `sql` on the history database of the project at `dir` (as root; the files stay the
/// world's user's); returns the rows it changed.
fn damage_history(w: &World, dir: &Path, sql: &str) -> usize {
    let store = dir.join("store");
    let changed = rusqlite::Connection::open(store.join("history.db"))
        .unwrap()
        .execute(sql, [])
        .unwrap();
    for e in fs::read_dir(&store).unwrap() {
        w.own(&e.unwrap().path());
    }
    changed
}

/// A damaged snapshot store: two snapshots of `/new` ("one", then "two"); restoring the first
/// reads its tree and blob, which the save before the restore does not write again. Its tree
/// given the second tree's body no longer matches its key; its blob deleted is missing.
#[test]
fn damaged_store_codes() {
    let w = World::new(None);
    let src = w.source("proj");
    // The objects of HEAD's tree (HEAD's children are its parent commit and its tree).
    let head_tree = "SELECT child FROM links WHERE parent = (SELECT hash FROM head)";
    let swap = format!(
        "UPDATE objects SET body = (SELECT body FROM objects WHERE kind = 2 AND hash IN \
         ({head_tree})) WHERE kind = 2 AND hash NOT IN ({head_tree})"
    );
    let lose = format!(
        "DELETE FROM objects WHERE kind = 1 AND hash NOT IN \
         (SELECT child FROM links WHERE parent IN ({head_tree}))"
    );
    for (name, damage, detail) in [
        ("swapped", swap, "corrupt_object"),
        ("lost", lose, "missing_object"),
    ] {
        let dir = project_with_snapshots(&w, name, &src, &["one\n", "two\n"]);
        assert_eq!(damage_history(&w, &dir, &damage), 1, "{damage}");
        failed_with(
            &w.af(&["--json", "restore", name, "HEAD~1"]),
            1,
            "db_corrupt",
            detail,
        );
    }
}

/// The codes of the findings `gc --check --json` (or `gc --json`'s `dangling`) lists, which
/// exits 1; each finding is `{"code", "what"}`, and the text output gives one `CODE: WHAT`
/// line per finding.
fn findings(w: &World, name: &str, args: &[&str], key: &str) -> Vec<String> {
    let mut all = vec!["gc", name];
    all.extend_from_slice(args);
    let text = w.af(&all);
    assert_eq!(text.status.code(), Some(1), "{}", common::world::err(&text));
    all.push("--json");
    let o = w.af(&all);
    assert_eq!(o.status.code(), Some(1), "{}", common::world::err(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let list = v[key].as_array().unwrap_or_else(|| panic!("{v}"));
    let lines = String::from_utf8_lossy(&text.stdout).into_owned();
    let lines: Vec<&str> = lines
        .lines()
        .filter(|l| !l.starts_with("would delete"))
        .collect();
    assert_eq!(lines.len(), list.len(), "{lines:?} {v}");
    list.iter()
        .zip(lines)
        .map(|(f, line)| {
            assert_eq!(f.as_object().unwrap().len(), 2, "{f}");
            let code = f["code"].as_str().unwrap().to_string();
            let what = f["what"].as_str().unwrap();
            assert!(!what.is_empty(), "{f}");
            assert_eq!(line, format!("{code}: {what}"));
            code
        })
        .collect()
}

/// The history store's check names every finding: an object body cut short (`bad_object`, and
/// a restore that reads it fails with it), a link row whose key is not a key (`bad_link`), a
/// tree without the link to its blob (`missing_link`), a link to an object that is not stored
/// (`missing_object`, which plain gc reports too).
fn store_findings(user: Option<u32>) {
    let w = World::new(user);
    let src = w.source("proj");
    for (name, damage, code) in [
        (
            "cut",
            "UPDATE objects SET body = substr(body, 1, length(body) / 2) WHERE kind = 2",
            "bad_object",
        ),
        (
            "badlink",
            "INSERT INTO links (parent, child) VALUES (x'0102', (SELECT hash FROM head))",
            "bad_link",
        ),
        (
            "unlinked",
            "DELETE FROM links WHERE child IN (SELECT hash FROM objects WHERE kind = 1)",
            "missing_link",
        ),
        (
            "dangling",
            "INSERT INTO links (parent, child) VALUES ((SELECT hash FROM head), zeroblob(32))",
            "missing_object",
        ),
    ] {
        let dir = project_with_snapshots(&w, name, &src, &["one\n"]);
        let o = w.af(&["gc", name, "--check"]);
        assert!(o.status.success(), "{}", common::world::err(&o));
        assert_eq!(damage_history(&w, &dir, damage), 1, "{damage}");
        assert_eq!(
            findings(&w, name, &["--check"], "findings"),
            [code],
            "{name}"
        );
        if name == "dangling" {
            assert_eq!(findings(&w, name, &["--dry-run"], "dangling"), [code]);
        }
        if name == "cut" {
            // Restoring reads the tree: the named code, not `other`.
            failed_with(
                &w.af(&["--json", "restore", name, "HEAD"]),
                1,
                "db_corrupt",
                "bad_object",
            );
        }
    }
}

#[test]
fn store_findings_as_root() {
    store_findings(None);
}

#[test]
fn store_findings_as_user() {
    if user_can_run("store_findings_as_user") {
        store_findings(Some(USER));
    }
}

/// A checkpoint retention pruned keeps its commit but not its state: restoring it, diffing it
/// or promoting it is `not_found` with detail `pruned` (exit 2), as root and as an ordinary
/// user. Five checkpoints through the library, then the retention with KEEP=1 (HEAD, its
/// parent and the newest other one stay).
fn pruned_checkpoint(user: Option<u32>) {
    use agentfs::history::object::{hex, CommitKind};
    use agentfs::history::{History, Ignore, SnapOptions};
    let w = World::new(user);
    let src = w.source("proj");
    let dir = project_with_snapshots(&w, "p", &src, &[]);
    let ignore = Ignore::default();
    let mut h = History::open(&dir.join("store")).unwrap();
    for i in 0..5 {
        let message = format!("checkpoint {i}");
        let o = SnapOptions {
            kind: CommitKind::Checkpoint,
            ..SnapOptions::manual(&message, &ignore)
        };
        h.snapshot(&dir.join("delta.db"), &o).unwrap();
    }
    let gone = h.prune_checkpoints(1).unwrap();
    drop(h);
    // What the library wrote as root goes back to the world's user.
    for d in [dir.clone(), dir.join("store")] {
        for e in fs::read_dir(d).unwrap() {
            w.own(&e.unwrap().path());
        }
    }
    let gone = hex(gone.first().expect("a checkpoint was pruned"));
    let o = w.af(&["log", "p", "--json"]);
    let log: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", common::world::err(&o)));
    assert!(
        log.as_array()
            .unwrap()
            .iter()
            .any(|c| c["commit"] == gone.as_str() && c["pruned"] == true),
        "{log}"
    );
    for args in [
        vec!["restore", "p", &gone],
        vec!["diff", "p", &gone, "HEAD"],
        vec!["apply", "p", "--from", &gone],
    ] {
        let mut all = vec!["--json"];
        all.extend_from_slice(&args);
        let e = failed_with(&w.af(&all), 2, "not_found", "pruned");
        assert!(e["message"].as_str().unwrap().contains(&gone[..12]), "{e}");
        common::world::refused(&w.af(&args), 2, "pruned");
    }
    // The kept ones still restore.
    let o = w.af(&["restore", "p", "HEAD~1"]);
    assert!(o.status.success(), "{}", common::world::err(&o));
}

#[test]
fn pruned_checkpoint_as_root() {
    pruned_checkpoint(None);
}

#[test]
fn pruned_checkpoint_as_user() {
    if user_can_run("pruned_checkpoint_as_user") {
        pruned_checkpoint(Some(USER));
    }
}

/// A tmpfs mounted by the test, unmounted when dropped (also when the test fails).
struct Tmpfs(std::path::PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The snapshot store on a full disk: a snapshot whose objects do not fit fails with
/// `capacity_exhausted` (an SQLite error of the store, once reported as `other`), and HEAD
/// stays where it was; as root and as an ordinary user (root mounts the tmpfs for them).
fn full_history_store(user: Option<u32>) {
    if !agentfs::sys::ids::is_root() {
        eprintln!("SKIP full_history_store: mounting a tmpfs needs root");
        return;
    }
    let w = World::new(user);
    let src = w.source("proj");
    let dir = project_with_snapshots(&w, "p", &src, &[]);
    let store = dir.join("store");
    fs::create_dir_all(&store).unwrap();
    let owner = user.unwrap_or(0);
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o"])
        .arg(format!("size=1m,mode=0755,uid={owner},gid={owner}"))
        .arg("tmpfs")
        .arg(&store)
        .status()
        .unwrap();
    assert!(st.success());
    let _tmpfs = Tmpfs(store.clone());
    // 3 MiB that zstd cannot shrink (xorshift bytes) into the delta.
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let bytes: Vec<u8> = (0..3 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let mut c = w
        .command(&bin(), &["fs", s(&dir.join("delta.db")), "write", "/big"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        c.stdin.take().unwrap().write_all(&bytes).unwrap();
    }
    assert!(c.wait().unwrap().success());
    let log = || w.af(&["log", "p", "--json"]).stdout;
    let before = log();
    let e = failed(&w.af(&["--json", "snap", "p"]), 1, "capacity_exhausted");
    assert!(e["message"].as_str().unwrap().contains("full"), "{e}");
    assert_eq!(log(), before);
}

#[test]
fn full_history_store_as_root() {
    full_history_store(None);
}

#[test]
fn full_history_store_as_user() {
    if user_can_run("full_history_store_as_user") {
        full_history_store(Some(USER));
    }
}

/// A 4-digit prefix two commits share names neither: snapshots (through the library, each
/// with its own message) until two commits share one, then the CLI is asked for it.
#[test]
fn ambiguous_ref() {
    use agentfs::history::object::hex;
    use agentfs::history::{History, Ignore, SnapOptions};
    let w = World::new(None);
    let src = w.source("proj");
    assert!(w.af(&["init", "p", "--source", s(&src)]).status.success());
    let dir = w.root().join("p");
    let mut h = History::open(&dir.join("store")).unwrap();
    let ignore = Ignore::default();
    let mut seen = std::collections::HashSet::new();
    let shared = (0..)
        .find_map(|i| {
            let message = i.to_string();
            let r = h
                .snapshot(
                    &dir.join("delta.db"),
                    &SnapOptions::manual(&message, &ignore),
                )
                .unwrap();
            let prefix = hex(&r.commit.unwrap())[..4].to_string();
            (!seen.insert(prefix.clone())).then_some(prefix)
        })
        .unwrap();
    drop(h);
    failed_with(
        &w.af(&["--json", "restore", "p", &shared]),
        2,
        "usage",
        "ambiguous_ref",
    );
}
