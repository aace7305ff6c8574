//! The reference harness backend (examples/harness_backend.py) driven end to end on a real
//! project: create, run_check (a command in the sandbox writing files), list_changes,
//! collect_diff (a patch `git apply --check` accepts), promote of selected paths, a refused
//! discard (UnappliedChanges), discard.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::world::{err, World};

const DRIVER: &str = r#"
import json, os, sys
sys.path.insert(0, os.environ["EXAMPLES"])
from harness_backend import AgentfsBackend, UnappliedChanges, NotFound

b = AgentfsBackend(os.environ["AGENTFS"])
src = os.environ["SRC"]
out = {}
out["created"] = b.create("task", src)["status"]
out["path"] = b.path("task")
check = b.run_check("task", ["sh", "-c",
    "cd %s && echo fixed >> README && mkdir -p lib && printf 'a\\nb\\n' > lib/new.py && "
    "printf '\\0\\1' > blob.bin && echo checked" % src])
out["check"] = [check.status, check.stdout.strip()]
failing = b.run_check("task", ["sh", "-c", "exit 3"])
out["failing"] = failing.status
out["changes"] = b.list_changes("task")
out["dirty"] = b.status("task")["status"]
b.collect_diff("task", os.environ["PATCH"])
out["commit"] = b.promote("task", ["README", "lib"])
try:
    b.discard("task")
    out["refused"] = None
except UnappliedChanges as e:
    out["refused"] = [e.code, e.status, e.path]
out["discarded"] = b.discard("task", force=True)["discarded"]
try:
    b.status("task")
except NotFound as e:
    out["gone"] = e.detail
print(json.dumps(out))
"#;

fn git(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git")
}

#[test]
fn the_reference_adapter_drives_a_project_end_to_end() {
    let w = World::new(None);
    let src = w.source("src-task");
    let patch = w.base.join("diff.patch");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut c = w.command(Path::new("python3"), &["-c", DRIVER]);
    c.env("EXAMPLES", &examples)
        .env("AGENTFS", common::bin())
        .env("SRC", &src)
        .env("PATCH", &patch);
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)));
    assert_eq!(v["created"], "created", "{v}");
    assert_eq!(v["path"], src.to_str().unwrap());
    assert_eq!(v["check"], serde_json::json!([0, "checked"]));
    assert_eq!(v["failing"], 3);
    assert_eq!(
        v["changes"],
        serde_json::json!(["README", "blob.bin", "lib", "lib/new.py"]),
        "{v}"
    );
    assert_eq!(v["dirty"], "dirty");
    // The selected paths are promoted, the rest stays in the sandbox.
    assert_eq!(
        fs::read_to_string(src.join("README")).unwrap(),
        "hello\nfixed\n"
    );
    assert_eq!(
        fs::read_to_string(src.join("lib/new.py")).unwrap(),
        "a\nb\n"
    );
    assert!(!src.join("blob.bin").exists());
    let refused = &v["refused"];
    assert_eq!(refused[0], "unapplied_changes", "{v}");
    assert_eq!(refused[1], 4);
    assert_eq!(v["discarded"], "task");
    assert_eq!(v["gone"], "no_project");
    assert!(!w.root().join("task").exists());

    // The patch applies to the tree the sandbox started from.
    let fresh = w.base.join("fresh");
    fs::create_dir(&fresh).unwrap();
    fs::write(fresh.join("README"), "hello\n").unwrap();
    assert!(git(&fresh, &["init", "-q"]).status.success());
    let check = git(&fresh, &["apply", "--check", patch.to_str().unwrap()]);
    assert!(check.status.success(), "{}", err(&check));
    let text = fs::read_to_string(&patch).unwrap();
    assert!(
        text.contains("diff --git a/lib/new.py b/lib/new.py"),
        "{text}"
    );
    assert!(text.contains("GIT binary patch"), "{text}");
}
