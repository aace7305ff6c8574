//! `agentfs diff --patch` against `git diff --full-index`: one base tree, a corpus of changes
//! made once through a real overlay mount and once in a git repository holding a copy of the
//! base, and the two patches compared byte for byte (with and without `--binary`), file by file.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{symlink, PermissionsExt as _};
use std::path::Path;
use std::process::{Command, Stdio};

use common::{agentfs, fuse_or_skip};

/// `n` numbered lines, each "line <i> of <tag>".
fn numbered(n: usize, tag: &str) -> String {
    (1..=n).map(|i| format!("line {i} of {tag}\n")).collect()
}

/// The same with line `at` (1-based) replaced.
fn numbered_with(n: usize, tag: &str, at: &[usize]) -> String {
    (1..=n)
        .map(|i| {
            if at.contains(&i) {
                format!("changed {i} of {tag}\n")
            } else {
                format!("line {i} of {tag}\n")
            }
        })
        .collect()
}

/// Every line of `text` behind a tab (so none is a function line).
fn indented(text: &str) -> String {
    text.lines().map(|l| format!("\t{l}\n")).collect()
}

/// Deterministic pseudo-random bytes (with NULs, so git calls them binary).
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect()
}

fn name(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

const C_BEFORE: &str = "#include <stdio.h>\n\nstatic int helper(int x)\n{\n\tint y = x * 2;\n\treturn y + 1;\n}\n\nint main(int argc, char **argv)\n{\n\tint a = 1;\n\tint b = 2;\n\tint c = 3;\n\tint d = 4;\n\tprintf(\"%d\\n\", helper(a + b + c + d));\n\treturn 0;\n}\n";

const PY_BEFORE: &str = "import os\n\n\nclass Thing:\n    def __init__(self):\n        self.a = 1\n        self.b = 2\n        self.c = 3\n        self.d = 4\n\n    def run(self):\n        x = self.a\n        y = self.b\n        z = self.c\n        return x + y + z\n\n\ndef main():\n    t = Thing()\n    print(t.run())\n";

const RS_BEFORE: &str = "use std::io;\n\npub struct Point {\n    x: i32,\n    y: i32,\n}\n\nimpl Point {\n    pub fn new(x: i32, y: i32) -> Self {\n        let p = Point { x, y };\n        p\n    }\n\n    pub fn norm(&self) -> i32 {\n        let a = self.x * self.x;\n        let b = self.y * self.y;\n        a + b\n    }\n}\n\nfn main() {\n    let p = Point::new(1, 2);\n    println!(\"{}\", p.norm());\n}\n";

/// The base tree every case starts from.
fn populate(base: &Path) {
    let w = |rel: &str, data: &[u8]| {
        let p = base.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, data).unwrap();
    };
    w("edit_start.txt", numbered(20, "start").as_bytes());
    w("edit_middle.txt", numbered(30, "middle").as_bytes());
    w("edit_end.txt", numbered(20, "end").as_bytes());
    w("insert_top.txt", numbered(10, "top").as_bytes());
    w("two_hunks.txt", numbered(60, "two").as_bytes());
    w("merged_hunks.txt", numbered(40, "merged").as_bytes());
    w(
        "crlf.txt",
        numbered(12, "crlf").replace('\n', "\r\n").as_bytes(),
    );
    w("lone_cr.txt", b"old\rmac\rline endings\rhere\r");
    w("noeol_old.txt", b"first\nsecond\nthird");
    w("noeol_new.txt", b"first\nsecond\nthird\n");
    w("noeol_both.txt", b"first\nsecond\nthird");
    w("empty_to_text.txt", b"");
    w("text_to_empty.txt", b"all\nof\nthis\ngoes\n");
    w("empty_deleted.txt", b"");
    w("text_deleted.txt", numbered(5, "deleted").as_bytes());
    w("whitespace.txt", b"a\nb \nc\n");
    w("bin_small_edit.bin", &noise(20_000, 1));
    w("bin_rewrite.bin", &noise(3000, 2));
    w("bin_deleted.bin", &noise(500, 3));
    w("bin_grow.bin", &noise(70_000, 4));
    w("text_to_bin.dat", b"plain text\n");
    w("bin_to_text.dat", b"\0\0binary\0");
    let mut late_nul = vec![b'x'; 9000];
    late_nul.push(b'\n');
    late_nul.extend_from_slice(b"\0 after the probe\n");
    w("late_nul.txt", &late_nul);
    w("exec_only.sh", b"#!/bin/sh\necho hi\n");
    w("exec_and_edit.sh", b"#!/bin/sh\necho one\n");
    w("unexec.sh", b"#!/bin/sh\necho two\n");
    chmod(&base.join("unexec.sh"), 0o755);
    w("perm_only.txt", b"group bits are not tracked\n");
    symlink("edit_start.txt", base.join("link_retarget")).unwrap();
    symlink("edit_end.txt", base.join("link_deleted")).unwrap();
    w("file_to_link", b"a file\n");
    symlink("edit_middle.txt", base.join("link_to_file")).unwrap();
    w("file_to_dir", b"will be a directory\n");
    w("dir_to_file/a.txt", b"a\n");
    w("dir_to_file/b.txt", b"b\n");
    w("gone/deep/x.txt", b"x\n");
    w("gone/deep/y.bin", b"\0y");
    w("gone/z.txt", b"z\n");
    w("name with space.txt", b"spaced\nout\n");
    w("\u{fc}tf8-\u{f1}ame.txt", b"unicode\nname\n");
    w("sub dir/inner file.txt", b"inner\n");
    let mut big = String::with_capacity(10 << 20);
    let mut i = 0;
    while big.len() < 10 << 20 {
        big.push_str(&format!(
            "big line {i} with some padding text to make it longer\n"
        ));
        i += 1;
    }
    w("big10m.txt", big.as_bytes());
    w("many_hunks.txt", numbered(12_000, "many").as_bytes());
    w("func.c", C_BEFORE.as_bytes());
    w("func.py", PY_BEFORE.as_bytes());
    w("func.rs", RS_BEFORE.as_bytes());
    let long_fn = format!(
        "{}(void)   \n{{\n{}}}\n",
        "static unsigned long a_function_with_a_name_so_long_that_git_cuts_it_short_in_headers",
        indented(&numbered(12, "body"))
    );
    w("func_long.c", long_fn.as_bytes());
    w(
        "func_repeat.c",
        format!(
            "int only(void)\n{{\n{}}}\n",
            indented(&numbered(40, "only"))
        )
        .as_bytes(),
    );
    let blocks: String = (0..4)
        .map(|k| format!("void f{k}(void)\n{{\n\tcommon();\n}}\n\n"))
        .collect();
    w("slider.c", blocks.as_bytes());
    w("moved.txt", numbered(30, "moved").as_bytes());
}

/// The changes, made the same way under `root` (the mount or the git work tree).
fn change(root: &Path) {
    let p = |rel: &str| root.join(rel);
    let w = |rel: &str, data: &[u8]| {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, data).unwrap();
    };
    w(
        "edit_start.txt",
        numbered_with(20, "start", &[1]).as_bytes(),
    );
    w(
        "edit_middle.txt",
        numbered_with(30, "middle", &[15]).as_bytes(),
    );
    w("edit_end.txt", numbered_with(20, "end", &[20]).as_bytes());
    w(
        "insert_top.txt",
        format!("new first line\n{}", numbered(10, "top")).as_bytes(),
    );
    w(
        "two_hunks.txt",
        numbered_with(60, "two", &[10, 50]).as_bytes(),
    );
    w(
        "merged_hunks.txt",
        numbered_with(40, "merged", &[10, 17, 25, 31]).as_bytes(),
    );
    w(
        "crlf.txt",
        numbered_with(12, "crlf", &[6])
            .replace('\n', "\r\n")
            .as_bytes(),
    );
    w("lone_cr.txt", b"old\rmac\rendings\rhere\r");
    w("noeol_old.txt", b"first\nsecond\nthird\n");
    w("noeol_new.txt", b"first\nsecond\nthird");
    w("noeol_both.txt", b"first\nsecond\n3rd");
    w("empty_to_text.txt", b"now\nsomething\n");
    w("text_to_empty.txt", b"");
    fs::remove_file(p("empty_deleted.txt")).unwrap();
    fs::remove_file(p("text_deleted.txt")).unwrap();
    w("whitespace.txt", b"a\nb\nc\n");
    w("new_empty.txt", b"");
    w("new_text.txt", b"brand\nnew\n");
    w("new_noeol.txt", b"no newline");
    let mut small = noise(20_000, 1);
    small[5000] ^= 0xff;
    small[15_000..15_010].copy_from_slice(b"0123456789");
    w("bin_small_edit.bin", &small);
    w("bin_rewrite.bin", &noise(3000, 22));
    fs::remove_file(p("bin_deleted.bin")).unwrap();
    let mut grown = noise(70_000, 4);
    grown.extend_from_slice(&noise(5000, 44));
    w("bin_grow.bin", &grown);
    w("bin_new.bin", &noise(1000, 5));
    w("text_to_bin.dat", b"plain\0binary now\n");
    w("bin_to_text.dat", b"text now\n");
    let mut late_nul = vec![b'x'; 9000];
    late_nul.push(b'\n');
    late_nul.extend_from_slice(b"\0 after the probe, edited\n");
    w("late_nul.txt", &late_nul);
    chmod(&p("exec_only.sh"), 0o755);
    w("exec_and_edit.sh", b"#!/bin/sh\necho one and more\n");
    chmod(&p("exec_and_edit.sh"), 0o755);
    chmod(&p("unexec.sh"), 0o644);
    chmod(&p("perm_only.txt"), 0o600);
    w("new_exec.sh", b"#!/bin/sh\n");
    chmod(&p("new_exec.sh"), 0o755);
    symlink("edit_end.txt", p("link_new")).unwrap();
    symlink("../outside/target with space", p("link_new_far")).unwrap();
    fs::remove_file(p("link_retarget")).unwrap();
    symlink("edit_middle.txt", p("link_retarget")).unwrap();
    fs::remove_file(p("link_deleted")).unwrap();
    fs::remove_file(p("file_to_link")).unwrap();
    symlink("edit_start.txt", p("file_to_link")).unwrap();
    fs::remove_file(p("link_to_file")).unwrap();
    w("link_to_file", b"now a file\n");
    fs::remove_file(p("file_to_dir")).unwrap();
    w("file_to_dir/inner.txt", b"inside\n");
    fs::remove_dir_all(p("dir_to_file")).unwrap();
    w("dir_to_file", b"was a directory\n");
    fs::remove_dir_all(p("gone")).unwrap();
    w("name with space.txt", b"spaced\nin\n");
    w("tab\tname.txt", b"tab\n");
    w("quote\"name.txt", b"quote\n");
    w("back\\slash.txt", b"backslash\n");
    w("\u{fc}tf8-\u{f1}ame.txt", b"unicode\nnames\n");
    fs::write(root.join(name(b"latin1-\xe9.txt")), b"latin-1 name\n").unwrap();
    w("sub dir/inner file.txt", b"inner edited\n");
    w("new dir/with space/file.txt", b"deep\n");
    w("ctl\x01char.txt", b"control\n");
    let big = fs::read(p("big10m.txt")).unwrap();
    let mut text = String::from_utf8(big).unwrap();
    text.replace_range(0..3, "BIG");
    let mid = text.len() / 2;
    text.insert_str(mid - mid % 4, "\ninserted in the middle\n");
    text.push_str("appended at the end\n");
    w("big10m.txt", text.as_bytes());
    let every: Vec<usize> = (1..=12_000).filter(|i| i % 10 == 5).collect();
    w(
        "many_hunks.txt",
        numbered_with(12_000, "many", &every).as_bytes(),
    );
    w(
        "func.c",
        C_BEFORE
            .replace("\tint c = 3;\n", "\tint c = 30;\n")
            .as_bytes(),
    );
    w(
        "func.py",
        PY_BEFORE
            .replace("        z = self.c\n", "        z = self.c * 2\n")
            .replace("        self.c = 3\n", "        self.c = 33\n")
            .as_bytes(),
    );
    w(
        "func.rs",
        RS_BEFORE
            .replace("        a + b\n", "        a + b + 1\n")
            .as_bytes(),
    );
    let long_fn = format!(
        "{}(void)   \n{{\n{}}}\n",
        "static unsigned long a_function_with_a_name_so_long_that_git_cuts_it_short_in_headers",
        indented(&numbered_with(12, "body", &[9]))
    );
    w("func_long.c", long_fn.as_bytes());
    w(
        "func_repeat.c",
        format!(
            "int only(void)\n{{\n{}}}\n",
            indented(&numbered_with(40, "only", &[12, 35]))
        )
        .as_bytes(),
    );
    let mut blocks: String = (0..4)
        .map(|k| format!("void f{k}(void)\n{{\n\tcommon();\n}}\n\n"))
        .collect();
    blocks.insert_str(
        blocks.find("void f2").unwrap(),
        "void added(void)\n{\n\tcommon();\n}\n\n",
    );
    w("slider.c", blocks.as_bytes());
    let mut moved: Vec<String> = numbered(30, "moved").lines().map(String::from).collect();
    let block: Vec<String> = moved.drain(3..8).collect();
    moved.splice(20..20, block);
    w("moved.txt", format!("{}\n", moved.join("\n")).as_bytes());
}

/// git with no user or system configuration.
fn git(dir: &Path, home: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=golden",
            "-c",
            "user.email=golden@example.invalid",
            "-c",
            "core.autocrlf=false",
            "-c",
            "core.quotepath=true",
        ])
        .args(args)
        .current_dir(dir)
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CEILING_DIRECTORIES", dir.parent().unwrap())
        .stdin(Stdio::null())
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A patch cut into its per-file sections, each with its `diff --git` line.
fn sections(patch: &[u8]) -> Vec<&[u8]> {
    let mut starts: Vec<usize> = (0..patch.len())
        .filter(|&i| patch[i..].starts_with(b"diff --git ") && (i == 0 || patch[i - 1] == b'\n'))
        .collect();
    starts.push(patch.len());
    starts.windows(2).map(|w| &patch[w[0]..w[1]]).collect()
}

/// The first line of a section, for messages.
fn title(section: &[u8]) -> String {
    let end = section
        .iter()
        .position(|&b| b == b'\n')
        .unwrap_or(section.len());
    String::from_utf8_lossy(&section[..end]).into_owned()
}

/// Whether `hay` contains `needle`.
fn has(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The corpus exercises what it claims to: checked on git's own output.
fn assert_coverage(plain: &[u8], binary: &[u8]) {
    for needle in [
        &b"@@ int main(int argc, char **argv)\n"[..],
        b"@@ class Thing:\n",
        b"@@ int only(void)\n",
        b"@@ impl Point {\n",
        b"@@ static unsigned long a_function_with_a_name_so_long_that_git_cuts_it_short_in_he\n",
        b"Binary files a/bin_rewrite.bin and b/bin_rewrite.bin differ\n",
        b"Binary files /dev/null and b/bin_new.bin differ\n",
        b"\"b/latin1-\\351.txt\"",
        b"\"b/tab\\tname.txt\"",
        b"\"b/quote\\\"name.txt\"",
        b"\"a/\\303\\274tf8-\\303\\261ame.txt\"",
        b"+++ b/name with space.txt\t\n",
        b"\\ No newline at end of file\n",
        b"new file mode 120000\n",
        b"deleted file mode 120000\n",
        b"old mode 100644\nnew mode 100755\n",
        b"deleted file mode 100644\nindex e69de29bb2d1d6434b8b29ae775ad8c2e48c5391..",
    ] {
        assert!(has(plain, needle), "{}", String::from_utf8_lossy(needle));
    }
    let many = sections(plain)
        .into_iter()
        .find(|s| s.starts_with(b"diff --git a/many_hunks.txt "))
        .expect("many_hunks.txt");
    let hunks = many.windows(3).filter(|w| *w == b"\n@@").count();
    assert!(hunks > 1000, "{hunks} hunks");
    assert!(has(binary, b"GIT binary patch\ndelta "));
    assert!(has(binary, b"GIT binary patch\nliteral "));
}

/// Compare section by section; every difference is listed.
fn compare(kind: &str, ours: &[u8], theirs: &[u8]) {
    let (a, b) = (sections(ours), sections(theirs));
    let mut bad = Vec::new();
    for i in 0..a.len().max(b.len()) {
        match (a.get(i), b.get(i)) {
            (Some(x), Some(y)) if x == y => {}
            (x, y) => bad.push(format!(
                "=== {}\n--- ours:\n{}\n--- git:\n{}",
                title(x.or(y).copied().unwrap_or_default()),
                x.map_or(String::new(), |s| String::from_utf8_lossy(
                    &s[..s.len().min(3000)]
                )
                .into_owned()),
                y.map_or(String::new(), |s| String::from_utf8_lossy(
                    &s[..s.len().min(3000)]
                )
                .into_owned()),
            )),
        }
    }
    assert!(
        bad.is_empty(),
        "{kind}: {} of {} sections differ:\n{}",
        bad.len(),
        b.len(),
        bad.join("\n")
    );
    assert_eq!(ours, theirs, "{kind}");
    eprintln!("{kind}: {} sections byte-identical", b.len());
}

#[test]
fn patches_are_byte_identical_to_git_diff() {
    if !fuse_or_skip("patches_are_byte_identical_to_git_diff") {
        return;
    }
    if Command::new("git").arg("--version").output().is_err() {
        eprintln!("SKIP patches_are_byte_identical_to_git_diff: no git");
        return;
    }
    // SAFETY: umask only affects files this test process and its children create.
    unsafe { libc::umask(0o022) };
    let mut m = common::Mounted::unmounted();
    let dir = m.dir.path().to_path_buf();
    let base = dir.join("base");
    fs::create_dir(&base).unwrap();
    populate(&base);

    let repo = dir.join("repo");
    let home = dir.join("home");
    fs::create_dir(&home).unwrap();
    let st = Command::new("cp").arg("-a").arg(&base).arg(&repo).status();
    assert!(st.unwrap().success());
    git(&repo, &home, &["init", "-q"]);
    git(&repo, &home, &["add", "-A"]);
    git(&repo, &home, &["commit", "-q", "-m", "base"]);
    change(&repo);
    git(&repo, &home, &["add", "-A"]);

    common::init_overlay(&m.db, &base);
    m.mount();
    change(&m.mnt);
    m.unmount();

    let db = m.db.to_str().unwrap();
    let mut seen = Vec::new();
    for (flags, git_flags) in [
        (
            &["--patch"][..],
            &["diff", "--cached", "--no-renames", "--full-index"][..],
        ),
        (
            &["--patch", "--binary"][..],
            &[
                "diff",
                "--cached",
                "--no-renames",
                "--full-index",
                "--binary",
            ][..],
        ),
    ] {
        let mut args = vec!["diff", db];
        args.extend_from_slice(flags);
        let ours = agentfs(&args);
        assert!(ours.status.success(), "{ours:?}");
        let theirs = git(&repo, &home, git_flags);
        compare(&flags.join(" "), &ours.stdout, &theirs);
        seen.push(theirs);
    }
    assert_coverage(&seen[0], &seen[1]);
}
