//! The knob ledger stays honest: KNOBS.md matches the table, every AGENTFS_ name used in the
//! source is declared, and no code outside the knob module reads the environment for one.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn names_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("AGENTFS_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].trim_end_matches('_').to_string());
        rest = &tail[end..];
    }
    out
}

#[test]
fn knobs_md_is_rendered_from_the_table() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let on_disk = std::fs::read_to_string(root.join("KNOBS.md")).unwrap();
    assert_eq!(
        on_disk,
        agentfs::knobs::LEDGER_MARKDOWN,
        "KNOBS.md is stale: run `cargo build` (build.rs renders it) and commit it"
    );
    for k in agentfs::knobs::TABLE {
        assert!(on_disk.contains(k.name), "{} missing from KNOBS.md", k.name);
    }
}

#[test]
fn every_agentfs_name_in_the_source_is_a_declared_knob() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for d in ["src", "tests", "benches"] {
        rust_files(&root.join(d), &mut files);
    }
    let declared: Vec<&str> = agentfs::knobs::TABLE.iter().map(|k| k.name).collect();
    let mut undeclared = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for name in names_in(&text) {
            // AGENTFS_SANDBOX is a marker the sandbox sets for its command, read by nothing of
            // ours (src/sandbox/request.rs).
            if name != "AGENTFS"
                && name != agentfs::sandbox::request::SANDBOX_ENV
                && !declared.contains(&name.as_str())
                && !f.ends_with("knobs.rs")
                && !f.ends_with("knobs_table.rs")
            {
                undeclared.push(format!("{}: {name}", f.display()));
            }
        }
    }
    assert!(undeclared.is_empty(), "undeclared knobs: {undeclared:?}");
}

#[test]
fn only_the_knob_module_reads_agentfs_variables() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    for f in &files {
        if f.ends_with("src/knobs.rs") {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let reads_env =
                line.contains("env::var(\"AGENTFS_") || line.contains("var_os(\"AGENTFS_");
            assert!(
                !reads_env,
                "{}:{} reads a knob directly",
                f.display(),
                i + 1
            );
        }
    }
}

#[test]
fn the_scanner_finds_names() {
    assert_eq!(
        names_in("x AGENTFS_FOO_BAR=1 y AGENTFS_Z"),
        vec!["AGENTFS_FOO_BAR", "AGENTFS_Z"]
    );
}
