//! Escape attempts through a real sandbox: a writable set that does not cover the project is
//! fenced by the server (EROFS), every refusal lands in the project's audit log, and status
//! flags the project; the opt-in symlink rule refuses escaping symlinks (EPERM). As root and as
//! an ordinary user.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use common::world::{err, user_can_run, World, USER};

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The launch ran the command (whatever its status): no refusal before the start.
fn started(o: &Output) {
    assert_ne!(o.status.code(), Some(125), "the launch failed: {}", err(o));
}

/// The audit log's lines.
fn events(w: &World, project: &str) -> Vec<Value> {
    let p = w.root().join(project).join("audit/events.ndjson");
    fs::read_to_string(&p)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn diff_names(w: &World, project: &str) -> Vec<String> {
    let d = w.af(&["diff", "--project", project, "--name-only"]);
    assert!(d.status.success(), "{}", err(&d));
    stdout(&d).lines().map(str::to_string).collect()
}

fn status_flag(w: &World, project: &str) -> Value {
    let o = w.af(&["status", project, "--json"]);
    assert!(o.status.success(), "{}", err(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    v["projects"][0]["escape_attempts"].clone()
}

fn read_only_policy(w: &World) {
    let src = w.source("ro");
    let script = "echo x > new; echo rc=$?; echo more >> README; echo rc=$?; cat README";
    let o = w.af(&[
        "quick",
        src.to_str().unwrap(),
        "--policy",
        "read-only",
        "--",
        "sh",
        "-c",
        script,
    ]);
    started(&o);
    assert_eq!(stdout(&o), "rc=2\nrc=2\nhello\n", "{}", err(&o));
    assert_eq!(
        err(&o).matches("Read-only file system").count(),
        2,
        "{}",
        err(&o)
    );
    // The command's status is its own; the run says what was refused.
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(
        err(&o).contains("agentfs: escape_attempt: 2 "),
        "{}",
        err(&o)
    );
    assert!(diff_names(w, "ro").is_empty());
    let ev = events(w, "ro");
    assert_eq!(ev.len(), 2, "{ev:?}");
    let new = src.join("new");
    let readme = src.join("README");
    assert_eq!(ev[0]["path"], new.to_str().unwrap());
    assert_eq!(ev[0]["operation"], "create");
    assert_eq!(ev[1]["path"], readme.to_str().unwrap());
    assert_eq!(ev[1]["operation"], "open");
    for e in &ev {
        assert_eq!(e["errno"], "EROFS");
        assert!(e["pid"].as_u64().is_some_and(|p| p > 1), "{e}");
        assert!(e["time"].as_u64().is_some_and(|t| t > 0), "{e}");
    }
    let flag = status_flag(w, "ro");
    assert_eq!(flag["code"], "escape_attempt", "{flag}");
    assert_eq!(flag["count"], 2, "{flag}");
    assert_eq!(flag["last"]["path"], readme.to_str().unwrap());
    let text = stdout(&w.af(&["status", "ro"]));
    assert!(
        text.contains(&format!(
            "escape_attempt: 2 refused, last open {}",
            readme.display()
        )),
        "{text}"
    );
    // With --json the run's word on stderr is a warning object naming the audit log.
    let o = w.af(&[
        "--json",
        "run",
        "ro",
        "--policy",
        "read-only",
        "--",
        "sh",
        "-c",
        "{ echo x > new; } 2>/dev/null; true",
    ]);
    started(&o);
    // (An ordinary user without a cgroup is also warned that checkpoints run unfrozen.)
    let warned: Vec<Value> = common::world::warnings(&o)
        .into_iter()
        .filter(|w| w["code"] == "escape_attempt")
        .collect();
    assert_eq!(warned.len(), 1, "{}", err(&o));
    assert!(
        warned[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("1 change(s) outside the writable set refused"),
        "{warned:?}"
    );
    let log = w.root().join("ro/audit/events.ndjson");
    assert_eq!(warned[0]["path"], log.to_str().unwrap(), "{warned:?}");
}

#[test]
fn a_read_only_run_is_refused_by_the_server_and_logged() {
    read_only_policy(&World::new(None));
}

#[test]
fn a_read_only_run_is_refused_and_logged_for_an_ordinary_user() {
    let test = "a_read_only_run_is_refused_and_logged_for_an_ordinary_user";
    if user_can_run(test) {
        read_only_policy(&World::new(Some(USER)));
    }
}

fn writable_subtree(w: &World) {
    let src = w.source("ws");
    fs::create_dir(src.join("src")).unwrap();
    w.own(&src.join("src"));
    let root = src.join("src");
    let script = "echo a > src/a.rs && mkdir src/m && echo b > src/m/b.rs && mv src/a.rs src/c.rs && echo SRC-OK; \
                  echo no > README 2>/dev/null || echo README-REFUSED; \
                  rm README 2>/dev/null || echo RM-REFUSED; \
                  mkdir top 2>/dev/null || echo MKDIR-REFUSED";
    let o = w.af(&[
        "quick",
        src.to_str().unwrap(),
        "--writable-root",
        root.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        script,
    ]);
    started(&o);
    assert_eq!(
        stdout(&o),
        "SRC-OK\nREADME-REFUSED\nRM-REFUSED\nMKDIR-REFUSED\n",
        "{}",
        err(&o)
    );
    let mut names = diff_names(w, "ws");
    names.sort();
    assert_eq!(names, vec!["/src/c.rs", "/src/m", "/src/m/b.rs"]);
    let ev = events(w, "ws");
    let seen: Vec<(&str, PathBuf)> = ev
        .iter()
        .map(|e| {
            (
                e["operation"].as_str().unwrap(),
                PathBuf::from(e["path"].as_str().unwrap()),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("open", src.join("README")),
            ("unlink", src.join("README")),
            ("mkdir", src.join("top")),
        ]
    );
    assert_eq!(status_flag(w, "ws")["count"], 3);
    // A run that covers the whole project is not fenced and leaves the log as it was.
    let o = w.af(&["run", "ws", "--", "sh", "-c", "echo yes > README"]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(events(w, "ws").len(), 3);
}

#[test]
fn a_writable_subtree_is_writable_and_the_rest_of_the_project_is_not() {
    writable_subtree(&World::new(None));
}

#[test]
fn a_writable_subtree_for_an_ordinary_user() {
    let test = "a_writable_subtree_for_an_ordinary_user";
    if user_can_run(test) {
        writable_subtree(&World::new(Some(USER)));
    }
}

fn symlinks(w: &World) {
    let src = w.source("ln");
    let script = |name: &str| {
        format!(
            "ln -s /etc/passwd abs-{name} 2>&1; ln -s ../../x rel-{name} 2>&1; \
             ln -s README in-{name} && ln -s ../ln/README back-{name} && echo IN-OK"
        )
    };
    // Off by default: virtualenvs make absolute symlinks.
    let o = w.af(&[
        "quick",
        src.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script("default"),
    ]);
    started(&o);
    assert_eq!(stdout(&o), "IN-OK\n", "{}", err(&o));
    assert!(events(w, "ln").is_empty());
    // By the flag, then by the project's config.
    let o = w.af(&[
        "run",
        "ln",
        "--symlinks",
        "refuse-escaping",
        "--",
        "sh",
        "-c",
        &script("flag"),
    ]);
    let text = stdout(&o);
    assert_eq!(
        text.matches("Operation not permitted").count(),
        2,
        "{text}{}",
        err(&o)
    );
    assert!(text.ends_with("IN-OK\n"), "{text}");
    let cfg = w.root().join("ln/config.toml");
    let c = fs::read_to_string(&cfg).unwrap();
    assert!(c.contains("\n[policy]\n"), "{c}");
    let c = c.replace(
        "\n[policy]\n",
        "\n[policy]\nsymlinks = \"refuse-escaping\"\n",
    );
    fs::write(&cfg, c).unwrap();
    let o = w.af(&["run", "ln", "--", "sh", "-c", &script("config")]);
    assert!(stdout(&o).ends_with("IN-OK\n"), "{}", err(&o));
    let ev = events(w, "ln");
    let seen: Vec<(String, &str)> = ev
        .iter()
        .map(|e| {
            assert_eq!(e["operation"], "symlink");
            assert_eq!(e["errno"], "EPERM");
            let p = Path::new(e["path"].as_str().unwrap());
            (
                p.strip_prefix(&src).unwrap().display().to_string(),
                e["target"].as_str().unwrap(),
            )
        })
        .collect();
    let want = [
        ("abs-flag", "/etc/passwd"),
        ("rel-flag", "../../x"),
        ("abs-config", "/etc/passwd"),
        ("rel-config", "../../x"),
    ];
    assert_eq!(
        seen,
        want.map(|(p, t)| (p.to_string(), t)).to_vec(),
        "{ev:?}"
    );
    let mut names = diff_names(w, "ln");
    names.sort();
    assert_eq!(
        names,
        [
            "/abs-default",
            "/back-config",
            "/back-default",
            "/back-flag",
            "/in-config",
            "/in-default",
            "/in-flag",
            "/rel-default"
        ]
    );
}

#[test]
fn escaping_symlinks_are_refused_only_when_asked() {
    symlinks(&World::new(None));
}

#[test]
fn escaping_symlinks_for_an_ordinary_user() {
    let test = "escaping_symlinks_for_an_ordinary_user";
    if user_can_run(test) {
        symlinks(&World::new(Some(USER)));
    }
}

/// Past AGENTFS_AUDIT_MAX_EVENTS a run's refusals go on unlogged, and one line counts them.
#[test]
fn the_log_is_capped_per_run() {
    let w = World::new(None);
    let src = w.source("cap");
    let o = w
        .command(
            &common::bin(),
            &[
                "quick",
                src.to_str().unwrap(),
                "--policy",
                "read-only",
                "--",
                "sh",
                "-c",
                "for i in 1 2 3 4 5; do touch f$i 2>/dev/null; done; echo DONE",
            ],
        )
        .env("AGENTFS_AUDIT_MAX_EVENTS", "2")
        .output()
        .unwrap();
    assert_eq!(stdout(&o), "DONE\n", "{}", err(&o));
    assert!(err(&o).contains("escape_attempt: 5 "), "{}", err(&o));
    let ev = events(&w, "cap");
    assert_eq!(ev.len(), 3, "{ev:?}");
    assert_eq!(ev[1]["path"], src.join("f2").to_str().unwrap());
    assert_eq!(ev[2]["capped"], 3, "{ev:?}");
    assert_eq!(status_flag(&w, "cap")["count"], 2);
}
