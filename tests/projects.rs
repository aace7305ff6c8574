//! Projects at the command line: `quick` makes and reuses them, `init`/`mount` with a name,
//! the rule that tells a project name from a database path, config.toml and defaults.toml
//! errors, refusals before launch, and `status --json`. Most run both as root and as an
//! ordinary user (65534) with a home of its own.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::world::{err, launched, listed, refused, user_can_run, World, USER};
use common::{fuse_or_skip, UnmountOnDrop};

fn quick_makes_reuses_and_names(w: &World) {
    let api = w.source("code/api");
    let api_s = api.to_str().unwrap();
    launched(&w.af(&["quick", api_s, "--", "true"]));
    assert!(w.root().join("api/config.toml").is_file());
    assert!(w.root().join("api/delta.db").is_file());
    assert_eq!(listed(w), vec![("api".into(), api_s.into())]);
    // Again, also through another spelling of the same directory: the same project.
    launched(&w.af(&["quick", "code/api/", "--", "true"]));
    assert_eq!(listed(w).len(), 1);
    // --name makes a second project of the same directory, and reuses it after.
    launched(&w.af(&["quick", api_s, "--name", "api-2", "--", "true"]));
    launched(&w.af(&["quick", api_s, "--name", "api-2", "--", "true"]));
    assert_eq!(
        listed(w),
        vec![("api".into(), api_s.into()), ("api-2".into(), api_s.into())]
    );
    // Another directory with the same basename may not take the name.
    let other = w.source("other/api");
    refused(
        &w.af(&["quick", other.to_str().unwrap(), "--", "true"]),
        125,
        "name_taken",
    );
    refused(
        &w.af(&["quick", other.to_str().unwrap(), "--name", "api-2"]),
        125,
        "name_taken",
    );
    refused(&w.af(&["quick", "no/such/dir"]), 125, "source_missing");
    refused(&w.af(&["quick", api_s, "--name", "x/y"]), 125, "bad_name");
    assert_eq!(listed(w).len(), 2);
    // The real directory is untouched by all of it.
    assert_eq!(fs::read_dir(&api).unwrap().count(), 1);
    let out = w.af(&["status", "api"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(api_s));
    refused(&w.af(&["status", "nope"]), 2, "no_project");
}

#[test]
fn quick_makes_a_project_reuses_it_and_names_a_second() {
    quick_makes_reuses_and_names(&World::new(None));
}

#[test]
fn quick_as_an_ordinary_user() {
    if !user_can_run("quick_as_an_ordinary_user") {
        return;
    }
    let w = World::new(Some(USER));
    quick_makes_reuses_and_names(&w);
    let md = fs::metadata(w.root().join("api")).unwrap();
    assert_eq!(md.permissions().mode() & 0o777, 0o700);
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!(md.uid(), USER);
}

/// Two `quick`s of a new directory started at the same moment, several times over: one project
/// per directory, and each command either ran or was refused because the project was busy.
#[test]
fn two_quicks_at_once_make_one_project() {
    let w = World::new(None);
    for round in 0..4 {
        let dir = w.source(&format!("race/dir{round}"));
        let dir_s = dir.to_str().unwrap();
        let both: Vec<_> = (0..2)
            .map(|_| {
                w.command(&common::bin(), &["quick", dir_s, "--", "true"])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut ran = 0;
        for child in both {
            let o = child.wait_with_output().unwrap();
            if o.status.success() {
                ran += 1;
            } else {
                // The refused one may have made the project (and said so) before the other
                // launched first.
                assert_eq!(o.status.code(), Some(125), "{}", err(&o));
                assert!(
                    err(&o).contains("agentfs: db_busy: the project is busy"),
                    "{}",
                    err(&o)
                );
            }
        }
        assert!(ran >= 1, "round {round}: neither command ran");
        let mine: Vec<_> = listed(&w).into_iter().filter(|(_, s)| s == dir_s).collect();
        assert_eq!(mine.len(), 1, "round {round}: {mine:?}");
    }
}

/// A `run` of a project whose sandbox is live is refused as busy, and leaves the live sandbox's
/// marker: `exec` still joins it.
#[test]
fn a_run_of_a_busy_project_is_refused_and_the_live_one_stays_joinable() {
    let w = World::new(None);
    let src = w.source("busy");
    // In the home: the sandbox shows it (read-only), not the rest of the world's tree.
    let stop = w.home.join("stop");
    let wait = format!("while [ ! -e {} ]; do sleep 0.05; done", stop.display());
    launched(&w.af(&["quick", src.to_str().unwrap(), "--", "true"]));
    let mut live = w
        .command(&common::bin(), &["run", "busy", "--", "sh", "-c", &wait])
        .spawn()
        .unwrap();
    let marker = w.root().join("busy/live.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !marker.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(marker.exists(), "the sandbox never became live");
    let out = w.af(&["run", "busy", "--", "true"]);
    refused(&out, 125, "db_busy");
    assert!(err(&out).contains("busy"), "{}", err(&out));
    assert!(marker.exists(), "the refused run removed the live marker");
    // `exec` joins the live sandbox (a sandbox of its own would be refused as busy).
    launched(&w.af(&["exec", "busy", "--", "true"]));
    fs::write(&stop, b"").unwrap();
    assert!(live.wait().unwrap().success());
    assert!(!marker.exists(), "teardown removes the marker");
}

/// `status` gives each project's position: its HEAD snapshot (or none) and how many paths the
/// delta changes that are not applied yet.
#[test]
fn status_shows_where_a_project_stands() {
    let w = World::new(None);
    let src = w.source("pos");
    let position = |w: &World| {
        let out = w.af(&["status", "pos", "--json"]);
        assert!(out.status.success(), "{}", err(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["projects"][0]["position"].clone()
    };
    let text = |w: &World| String::from_utf8_lossy(&w.af(&["status", "pos"]).stdout).into_owned();
    launched(&w.af(&[
        "init",
        "--project",
        "pos",
        "--source",
        src.to_str().unwrap(),
    ]));
    let p = position(&w);
    assert!(p["head"].is_null(), "{p}");
    assert_eq!(p["unapplied_changes"], 0, "{p}");
    assert!(
        text(&w).contains("no snapshots, nothing to apply"),
        "{}",
        text(&w)
    );
    // A run ends with an exit snapshot: HEAD is that one.
    let script = "echo new > a.txt && echo more >> README";
    launched(&w.af(&["run", "pos", "--", "sh", "-c", script]));
    let p = position(&w);
    assert_eq!(p["unapplied_changes"], 2, "{p}");
    let exit = p["head"]["hash"].as_str().unwrap().to_string();
    assert!(
        text(&w).contains(&format!("{}, 2 unapplied", &exit[..12])),
        "{}",
        text(&w)
    );
    launched(&w.af(&["snap", "pos", "first"]));
    let p = position(&w);
    let hash = p["head"]["hash"].as_str().unwrap().to_string();
    assert_eq!(hash.len(), 64, "{p}");
    assert_eq!(p["head"]["tags"], serde_json::json!(["first"]), "{p}");
    assert!(
        text(&w).contains(&format!("{} (first), 2 unapplied", &hash[..12])),
        "{}",
        text(&w)
    );
    // An untagged snapshot moves HEAD; the count follows the delta, not the history.
    launched(&w.af(&["run", "pos", "--", "rm", "a.txt"]));
    launched(&w.af(&["snap", "pos"]));
    let p = position(&w);
    assert_ne!(p["head"]["hash"].as_str().unwrap(), hash);
    assert_eq!(p["head"]["tags"], serde_json::json!([]), "{p}");
    assert_eq!(p["unapplied_changes"], 1, "{p}");
}

#[test]
fn a_name_or_a_database_path() {
    let w = World::new(None);
    // A bare word that is also a file here is refused, never guessed.
    fs::write(w.base.join("notes"), b"").unwrap();
    refused(&w.af(&["init", "notes"]), 2, "ambiguous_name");
    refused(&w.af(&["mount", "notes", "/tmp"]), 2, "ambiguous_name");
    refused(&w.af(&["diff", "notes"]), 2, "ambiguous_name");
    // --project takes it as a name.
    let out = w.af(&["init", "--project", "notes"]);
    assert!(out.status.success(), "{}", err(&out));
    assert!(w.root().join("notes/config.toml").is_file());
    // Database endings and slashes make paths: a database file is created as before.
    for db in ["x.db", "./plain", "y.sqlite3"] {
        let out = w.af(&["init", db]);
        assert!(out.status.success(), "{db}: {}", err(&out));
        assert!(w.base.join(db).is_file(), "{db}");
    }
    assert_eq!(
        listed(&w),
        vec![("notes".to_string(), String::new())],
        "no project for a path"
    );
    refused(&w.af(&["init", "notes", "--project"]), 4, "project_exists");
    refused(&w.af(&["run", "nothing", "--", "true"]), 125, "no_project");
    refused(&w.af(&["run", "notes", "--", "true"]), 125, "no_source");
    // Every verb the hint names takes --project: the name, not the file, is meant.
    refused(&w.af(&["diff", "--project", "notes"]), 1, "no_source");
    refused(&w.af(&["apply", "--project", "notes"]), 1, "no_source");
    fs::remove_file(w.base.join("notes")).unwrap();
    refused(&w.af(&["diff", "notes"]), 1, "no_source");
}

/// `init NAME` then `mount NAME DIR` gives the project its directory; a second `mount NAME MNT`
/// mounts its delta: writes land in the delta, `diff NAME` shows them, the source is untouched.
fn init_mount_write_diff(w: &World) {
    let src = w.source("src/web");
    let mnt = w.base.join("mnt");
    fs::create_dir(&mnt).unwrap();
    w.own(&mnt);
    let (src_s, mnt_s) = (src.to_str().unwrap(), mnt.to_str().unwrap());
    let out = w.af(&["init", "web"]);
    assert!(out.status.success(), "{}", err(&out));
    // The first mount gives the project its directory (nothing is mounted).
    let out = w.af(&["mount", "web", "src/web"]);
    assert!(out.status.success(), "{}", err(&out));
    assert!(!common::is_mounted(&src));
    assert_eq!(listed(w), vec![("web".into(), src_s.into())]);
    // The directory itself cannot be a mount point of its own delta.
    refused(&w.af(&["mount", "web", src_s]), 4, "mount_inside_source");
    let out = w.af(&["mount", "web", mnt_s]);
    assert!(out.status.success(), "{}", err(&out));
    let _cleanup = UnmountOnDrop(mnt.clone());
    assert!(common::is_mounted(&mnt));
    let sh = Path::new("/bin/sh");
    let script =
        format!("cat {mnt_s}/README && echo new > {mnt_s}/new.txt && echo more >> {mnt_s}/README");
    let out = w.cmd(sh, &["-c", &script]);
    assert!(out.status.success(), "{}", err(&out));
    assert_eq!(out.stdout, b"hello\n");
    // `status NAME --json` shows the project's own mount (and only its mounts).
    let out = w.af(&["status", "web", "--json"]);
    assert!(out.status.success(), "{}", err(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mounts = v["mounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 1, "{v}");
    assert_eq!(mounts[0]["mount_point"], mnt_s, "{v}");
    assert!(mounts[0]["requests"]["devfuse"].is_u64() || mounts[0]["requests"]["ring"].is_u64());
    let out = w.af(&["umount", mnt_s]);
    assert!(out.status.success(), "{}", err(&out));
    assert!(!common::is_mounted(&mnt));
    let out = w.af(&["diff", "web", "--name-only"]);
    assert!(out.status.success(), "{}", err(&out));
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    names.sort();
    assert_eq!(names, vec!["/README", "/new.txt"]);
    // The real directory is exactly as it was.
    assert_eq!(fs::read(src.join("README")).unwrap(), b"hello\n");
    assert_eq!(fs::read_dir(&src).unwrap().count(), 1);
    common::assert_consistent(&w.root().join("web/delta.db"));
    // `init NAME --source DIR` is the one-step form.
    let out = w.af(&["init", "web2", "--source", src_s]);
    assert!(out.status.success(), "{}", err(&out));
    refused(
        &w.af(&["init", "web2", "--source", src_s]),
        4,
        "project_exists",
    );
    assert_eq!(listed(w).len(), 2);
}

#[test]
fn init_and_mount_a_project() {
    if !fuse_or_skip("init_and_mount_a_project") {
        return;
    }
    init_mount_write_diff(&World::new(None));
}

#[test]
fn init_and_mount_a_project_as_an_ordinary_user() {
    let test = "init_and_mount_a_project_as_an_ordinary_user";
    if !fuse_or_skip(test) || !user_can_run(test) {
        return;
    }
    if Command::new("fusermount3").arg("-V").output().is_err() {
        assert!(
            !agentfs::knobs::get().require_fuse,
            "fusermount3 is required"
        );
        eprintln!("SKIP {test}: fusermount3 not installed");
        return;
    }
    let _mode = common::DevFuseMode::open_up();
    init_mount_write_diff(&World::new(Some(USER)));
}

#[test]
fn bad_config_and_defaults_are_named_one_line_errors() {
    let w = World::new(None);
    let src = w.source("svc");
    launched(&w.af(&["quick", src.to_str().unwrap(), "--", "true"]));
    let defaults = w.root().join("defaults.toml");
    fs::write(&defaults, "[home]\nmode = \"half\"\n").unwrap();
    let out = w.af(&["run", "svc", "--", "true"]);
    refused(&out, 125, "bad_config");
    assert!(
        err(&out).contains("defaults.toml line 2 (`mode = \"half\"`)"),
        "{}",
        err(&out)
    );
    fs::write(
        &defaults,
        "[home]\nmode = \"full-ro\"\n[sandbox]\nmasks = [\"~/.secret\"]\n",
    )
    .unwrap();
    launched(&w.af(&["run", "svc", "--", "true"]));
    let config = w.root().join("svc/config.toml");
    let mut text = fs::read_to_string(&config).unwrap();
    text.push_str("\n[sandbox2]\nx = 1\n");
    fs::write(&config, &text).unwrap();
    let out = w.af(&["run", "svc", "--", "true"]);
    refused(&out, 125, "bad_config");
    assert!(err(&out).contains("config.toml line"), "{}", err(&out));
    // A source edited away from the delta's own base is refused, as is a damaged delta.
    let other = w.source("elsewhere");
    let edited = text.replace(src.to_str().unwrap(), other.to_str().unwrap());
    let edited = edited.replace("\n[sandbox2]\nx = 1\n", "");
    fs::write(&config, &edited).unwrap();
    refused(&w.af(&["run", "svc", "--", "true"]), 125, "source_mismatch");
    let db = w.root().join("svc/delta.db");
    let saved = fs::read(&db).unwrap();
    fs::write(&db, b"not a database at all, just bytes").unwrap();
    let _ = fs::remove_file(w.root().join("svc/delta.db-wal"));
    let _ = fs::remove_file(w.root().join("svc/delta.db-shm"));
    fs::write(&config, text.replace("\n[sandbox2]\nx = 1\n", "")).unwrap();
    refused(&w.af(&["run", "svc", "--", "true"]), 125, "delta_unusable");
    fs::write(&db, saved).unwrap();
    launched(&w.af(&["run", "svc", "--", "true"]));
    fs::write(&config, &text).unwrap();
    // status names the broken project and goes on.
    let out = w.af(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = v["projects"][0]["error"].as_str().unwrap();
    assert!(e.starts_with("bad_config: "), "{e}");
}

#[test]
fn a_policy_that_cannot_hold_refuses_before_anything_runs() {
    let w = World::new(None);
    let src = w.source("repo");
    let ran = w.base.join("ran");
    let touch = format!("/usr/bin/touch {}", ran.display());
    launched(&w.af(&["quick", src.to_str().unwrap(), "--", "true"]));
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--policy".into(), "workspace-write".into()],
            "policy_empty",
        ),
        (
            vec![
                "--policy".into(),
                "read-only".into(),
                "--writable-root".into(),
                src.display().to_string(),
            ],
            "policy_contradiction",
        ),
        (
            vec!["--writable-root".into(), "repo".into()],
            "policy_not_absolute",
        ),
        (
            vec!["--writable-root".into(), format!("{}X", src.display())],
            "policy_outside_roots",
        ),
        (
            vec![
                "--writable-root".into(),
                format!("{}/../repo", src.display()),
            ],
            "policy_dotdot",
        ),
        (
            vec![
                "--writable-root".into(),
                src.display().to_string(),
                "--writable-root".into(),
                "/etc".into(),
            ],
            "policy_outside_roots",
        ),
        (vec!["--bind".into(), "/no/such".into()], "bind_missing"),
        (vec!["--env".into(), "=x".into()], "bad_env"),
    ];
    for (flags, code) in cases {
        let mut args = vec!["run", "repo"];
        args.extend(flags.iter().map(String::as_str));
        args.extend(["--", "sh", "-c", &touch]);
        refused(&w.af(&args), 125, code);
        assert!(!ran.exists(), "{code}: the command ran");
    }
    // A home that is not writable (full-ro) is no allowed root.
    let home_root = w.home.join("x").display().to_string();
    let args = [
        "run",
        "repo",
        "--home",
        "full-ro",
        "--writable-root",
        &home_root,
        "--",
        "true",
    ];
    refused(&w.af(&args), 125, "policy_outside_roots");
}
