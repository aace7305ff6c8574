//! What the command line offers people besides the verbs: shell completions and manual pages
//! generated from the same definitions, the mount(8) helper (`mount -t fuse.agentfs`, fstab),
//! and progress bars on `apply` and `diff` drawn only on a terminal.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::world::{err, launched, World};

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn the_bash_completion_loads_and_completes_verbs_and_flags() {
    if !have("bash") {
        eprintln!("SKIP: no bash");
        return;
    }
    let bin = common::bin();
    // The completion function itself, driven as bash drives it on TAB.
    let script = format!(
        "source <('{bin}' completions bash) || exit 9
         complete -p agentfs
         complete_line() {{ COMP_LINE=\"$*\"; COMP_POINT=${{#COMP_LINE}}; COMP_WORDS=(\"$@\"); COMP_CWORD=$(($# - 1)); COMPREPLY=(); _agentfs agentfs \"${{!#}}\" \"${{@: -2:1}}\"; echo \"${{COMPREPLY[*]}}\"; }}
         complete_line agentfs install-m
         complete_line agentfs run p --sym
         complete_line agentfs run p --symlinks ''",
        bin = bin.display()
    );
    let o = Command::new("bash").args(["-c", &script]).output().unwrap();
    assert!(o.status.success(), "{}", err(&o));
    let lines: Vec<&str> = std::str::from_utf8(&o.stdout).unwrap().lines().collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(
        lines[0].ends_with(" agentfs") && lines[0].contains("-F _agentfs"),
        "{lines:?}"
    );
    assert_eq!(lines[1], "install-mount-helper");
    assert_eq!(lines[2], "--symlinks");
    assert_eq!(lines[3], "allow refuse-escaping");
    for shell in ["zsh", "fish"] {
        let o = common::agentfs(&["completions", shell]);
        assert!(
            o.status.success() && !o.stdout.is_empty(),
            "{shell}: {}",
            err(&o)
        );
    }
}

#[test]
fn manual_pages_cover_every_verb_and_render() {
    let dir = tempfile::tempdir_in(common::scratch_root()).unwrap();
    let o = common::agentfs(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    for page in [
        "agentfs.1",
        "agentfs-run.1",
        "agentfs-diff.1",
        "agentfs-convert.1",
        "agentfs-fs-cat.1",
    ] {
        let text = fs::read_to_string(dir.path().join(page)).unwrap();
        let name = page.trim_end_matches(".1");
        assert!(text.contains(&format!(".TH {name} 1")), "{page}: {text}");
    }
    let run = fs::read_to_string(dir.path().join("agentfs-run.1")).unwrap();
    for opt in ["writable\\-root", "symlinks", "policy"] {
        assert!(run.contains(opt), "{opt} missing from agentfs-run.1");
    }
    // Without --dir the top page goes to stdout.
    let top = common::agentfs(&["man"]);
    let page = fs::read_to_string(dir.path().join("agentfs.1")).unwrap();
    assert_eq!(stdout(&top), page);
    if !have("man") {
        eprintln!("SKIP rendering: man is not installed");
        return;
    }
    let o = Command::new("man")
        .args(["-l", dir.path().join("agentfs-run.1").to_str().unwrap()])
        .env("MANWIDTH", "100")
        .env("MANPAGER", "cat")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", err(&o));
    let text = stdout(&o);
    assert!(
        text.contains("NAME") && text.contains("agentfs-run"),
        "{text}"
    );
    assert!(text.contains("--writable-root"), "{text}");
}

/// The helper at /sbin/mount.fuse.agentfs (where mount(8) looks) for the life of the value;
/// removed after, whatever the test does.
struct InstalledHelper(PathBuf);

impl InstalledHelper {
    fn install() -> InstalledHelper {
        let o = common::agentfs(&["install-mount-helper"]);
        assert!(o.status.success(), "{}", err(&o));
        let link = PathBuf::from("/sbin/mount.fuse.agentfs");
        assert_eq!(fs::read_link(&link).unwrap(), common::bin());
        InstalledHelper(link)
    }
}

impl Drop for InstalledHelper {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// The server pid `agentfs mount` reported ("server pid N").
fn server_pid(o: &Output) -> u32 {
    let text = stdout(o);
    let at = text.find("server pid ").unwrap_or_else(|| panic!("{text}"));
    let digits: String = text[at + 11..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

/// umount(8), then wait for the server to exit (it commits everything first).
fn umount_and_wait(mnt: &Path, server: u32) {
    let o = Command::new("umount").arg(mnt).output().unwrap();
    assert!(o.status.success(), "{}", err(&o));
    assert!(!common::is_mounted(mnt));
    let proc = PathBuf::from(format!("/proc/{server}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while proc.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "server {server} did not exit"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn mount_t_fuse_agentfs_and_an_fstab_line_mount_a_database() {
    if !agentfs::sys::ids::is_root() || !common::fuse_or_skip("mount_helper") || !have("mount") {
        eprintln!("SKIP: mount(8) helpers need root, FUSE and util-linux");
        return;
    }
    let _helper = InstalledHelper::install();
    let dir = tempfile::tempdir_in(common::scratch_root()).unwrap();
    let db = dir.path().join("a.db");
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let _guard = common::UnmountOnDrop(mnt.clone());
    let mount = |args: &[&str]| {
        Command::new("mount")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let o = mount(&[
        "-t",
        "fuse.agentfs",
        db.to_str().unwrap(),
        mnt.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(common::mount_options(&mnt).is_some());
    fs::write(mnt.join("f"), "one\n").unwrap();
    umount_and_wait(&mnt, server_pid(&o));
    let cat = common::agentfs(&["fs", db.to_str().unwrap(), "cat", "/f"]);
    assert_eq!(stdout(&cat), "one\n", "{}", err(&cat));
    // Options: ro reaches the mount; an unknown one is refused by name, nothing mounted.
    let o = mount(&[
        "-t",
        "fuse.agentfs",
        "-o",
        "ro,transport=devfuse",
        db.to_str().unwrap(),
        mnt.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(fs::write(mnt.join("g"), "x").is_err_and(|e| e.raw_os_error() == Some(libc::EROFS)));
    assert_eq!(fs::read_to_string(mnt.join("f")).unwrap(), "one\n");
    umount_and_wait(&mnt, server_pid(&o));
    let o = mount(&[
        "-t",
        "fuse.agentfs",
        "-o",
        "bogus",
        db.to_str().unwrap(),
        mnt.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(
        err(&o).contains("agentfs: bad_mount_option: mount option bogus"),
        "{}",
        err(&o)
    );
    assert!(!common::is_mounted(&mnt));
    // An fstab line, mounted by mount -a.
    let fstab = dir.path().join("fstab");
    fs::write(
        &fstab,
        format!(
            "{} {} fuse.agentfs defaults,nofail,x-agentfs-test 0 0\n",
            db.display(),
            mnt.display()
        ),
    )
    .unwrap();
    let o = mount(&["-a", "-T", fstab.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(fs::read_to_string(mnt.join("f")).unwrap(), "one\n");
    fs::write(mnt.join("f"), "two\n").unwrap();
    let o = common::agentfs(&["umount", mnt.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    let cat = common::agentfs(&["fs", db.to_str().unwrap(), "cat", "/f"]);
    assert_eq!(stdout(&cat), "two\n", "{}", err(&cat));
}

/// A project whose delta has `n` new files.
fn large_delta(w: &World, name: &str, n: usize) -> PathBuf {
    let src = w.source(name);
    let script = format!("for i in $(seq {n}); do echo $i > f$i; done");
    launched(&w.af(&["quick", src.to_str().unwrap(), "--", "sh", "-c", &script]));
    src
}

/// `args` run on a pseudo-terminal (script(1)) with standard output to `out`: what the
/// terminal showed (standard error).
fn on_terminal(w: &World, args: &[&str], out: &Path) -> String {
    let line = format!(
        "'{}' {} > '{}'",
        common::bin().display(),
        args.join(" "),
        out.display()
    );
    let o = w
        .command(Path::new("script"), &["-qec", &line, "/dev/null"])
        .env("TERM", "xterm")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", stdout(&o), err(&o));
    stdout(&o)
}

#[test]
fn apply_and_diff_draw_a_bar_on_a_terminal_only() {
    if !have("script") {
        eprintln!("SKIP: script(1) is not installed");
        return;
    }
    let w = World::new(None);
    let src = large_delta(&w, "big", 3000);
    let plain = w.af(&["diff", "--project", "big", "--patch"]);
    assert!(plain.status.success(), "{}", err(&plain));
    assert!(plain.stderr.is_empty(), "{}", err(&plain));
    let json = w.af(&["diff", "--project", "big", "--json"]);
    assert!(json.stderr.is_empty(), "{}", err(&json));
    let out = w.base.join("patch.out");
    let shown = on_terminal(&w, &["diff", "--project", "big", "--patch"], &out);
    assert!(shown.contains("diff") && shown.contains('%'), "{shown:?}");
    assert_eq!(
        fs::read(&out).unwrap(),
        plain.stdout,
        "the patch changed on a terminal"
    );
    let shown = on_terminal(&w, &["diff", "--project", "big", "--json"], &out);
    assert!(shown.contains('%'), "{shown:?}");
    assert_eq!(fs::read(&out).unwrap(), json.stdout);
    let shown = on_terminal(&w, &["apply", "--project", "big"], &out);
    assert!(shown.contains("apply") && shown.contains('%'), "{shown:?}");
    assert!(stdout_of(&out).ends_with(&format!("applied 3000 step(s) to {}\n", src.display())));
    assert_eq!(fs::read_to_string(src.join("f3000")).unwrap(), "3000\n");
    // Off a terminal, apply draws nothing either.
    let again = large_delta(&w, "big2", 50);
    let o = w.af(&["apply", "--project", "big2"]);
    assert!(o.status.success() && o.stderr.is_empty(), "{}", err(&o));
    assert!(again.join("f50").exists());
}

fn stdout_of(p: &Path) -> String {
    fs::read_to_string(p).unwrap()
}
