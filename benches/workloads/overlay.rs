//! The overlay form of the workloads: one read-only lower tree (the source tree, committed to
//! git, plus a 50 MiB file) seen through kernel overlayfs, fuse-overlayfs and AgentFS overlay
//! mode (partial-origin off and on), a fresh upper layer / delta database per repetition.
//!
//! Workloads, in this order on each target: `ov_cat_all` (read every file after dropping caches),
//! `ov_find_stat`, `ov_git_status` (files of the tree per second) — the read-heavy part, after
//! which the delta is measured — then `ov_edit_big` (1 byte in the middle of the 50 MiB file +
//! fsync; the delta is measured again), `ov_copy_up` (append a line to every 8th file) and
//! `ov_create` (new 4 KiB files).
//!
//! Delta growth: for AgentFS the database after unmount (the WAL is checkpointed into the main
//! file then) in bytes over its size right after `agentfs init`, and its fs_data rows; for the
//! kernel peers the bytes of regular files in the upper directory.

use super::*;

const BIG_MIB: usize = 50;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Kernel,
    Fuse,
    AgentFs { partial: bool },
}

struct OvTarget {
    name: &'static str,
    kind: Kind,
    dir: PathBuf,
}

/// A target, its results and the delta after each repetition's read part and big edit.
type OvColumn = (OvTarget, Column, Vec<(Growth, Growth)>);

/// The delta after a phase: bytes and (AgentFS) fs_data rows.
#[derive(Clone, Copy, Default)]
struct Growth {
    bytes: i64,
    rows: i64,
}

struct OvMount<'a> {
    t: &'a OvTarget,
    lower: &'a Path,
    bin: Option<&'a Path>,
    agentfs: Option<AgentFsMount>,
    kernel_mounted: bool,
    db_init_bytes: i64,
}

impl OvTarget {
    fn mnt(&self) -> PathBuf {
        self.dir.join("mnt")
    }
    fn upper(&self) -> PathBuf {
        self.dir.join("upper")
    }
    fn db(&self) -> PathBuf {
        self.dir.join("delta.db")
    }
}

fn file_bytes(p: &Path) -> i64 {
    fs::metadata(p).map(|m| m.len() as i64).unwrap_or(0)
}

fn tree_bytes(p: &Path) -> i64 {
    let (mut files, mut bytes) = (0usize, 0u64);
    count_tree(p, &mut files, &mut bytes);
    bytes as i64
}

impl<'a> OvMount<'a> {
    /// A fresh upper layer / delta database, mounted.
    fn fresh(t: &'a OvTarget, lower: &'a Path, bin: Option<&'a Path>) -> Result<Self, String> {
        let _ = fs::remove_dir_all(&t.dir);
        for d in [t.mnt(), t.upper(), t.dir.join("ovwork")] {
            io(fs::create_dir_all(&d), &d)?;
        }
        let mut m = OvMount {
            t,
            lower,
            bin,
            agentfs: None,
            kernel_mounted: false,
            db_init_bytes: 0,
        };
        if let Kind::AgentFs { partial } = t.kind {
            let bin = bin.ok_or("no agentfs binary")?;
            let po = if partial { "on" } else { "off" };
            run(Command::new(bin)
                .arg("init")
                .arg(t.db())
                .arg("--base")
                .arg(lower)
                .args(["--partial-origin", po]))?;
            m.db_init_bytes = file_bytes(&t.db()) + file_bytes(&t.dir.join("delta.db-wal"));
        }
        m.mount()?;
        Ok(m)
    }

    fn mount(&mut self) -> Result<(), String> {
        let t = self.t;
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            self.lower.display(),
            t.upper().display(),
            t.dir.join("ovwork").display()
        );
        match t.kind {
            Kind::Kernel => {
                run(Command::new("mount")
                    .args(["-t", "overlay", "overlay", "-o", &opts])
                    .arg(t.mnt()))?;
                self.kernel_mounted = true;
            }
            Kind::Fuse => {
                run(Command::new("fuse-overlayfs")
                    .args(["-o", &opts])
                    .arg(t.mnt()))?;
                self.kernel_mounted = true;
            }
            Kind::AgentFs { .. } => {
                let bin = self.bin.ok_or("no agentfs binary")?;
                self.agentfs = Some(AgentFsMount::start(
                    bin,
                    &t.db(),
                    &t.mnt(),
                    &t.dir.join("server.log"),
                )?);
            }
        }
        Ok(())
    }

    fn unmount(&mut self) -> Result<(), String> {
        if let Some(mut m) = self.agentfs.take() {
            m.stop()?;
        }
        if std::mem::replace(&mut self.kernel_mounted, false) {
            umount(&self.t.mnt(), 0).map_err(|e| format!("umount: {e}"))?;
        }
        Ok(())
    }

    /// Unmount (AgentFS checkpoints its WAL), measure the delta, mount again.
    fn growth(&mut self) -> Result<Growth, String> {
        let t = self.t;
        if let Kind::AgentFs { .. } = t.kind {
            self.unmount()?;
            let bytes =
                file_bytes(&t.db()) + file_bytes(&t.dir.join("delta.db-wal")) - self.db_init_bytes;
            let rows = rusqlite::Connection::open_with_flags(
                t.db(),
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )
            .and_then(|c| c.query_row("SELECT count(*) FROM fs_data", [], |r| r.get(0)))
            .map_err(|e| format!("{}: {e}", t.db().display()))?;
            self.mount()?;
            return Ok(Growth { bytes, rows });
        }
        Ok(Growth {
            bytes: tree_bytes(&t.upper()),
            rows: 0,
        })
    }
}

impl Drop for OvMount<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.unmount() {
            eprintln!("warning: {}: {e}", self.t.mnt().display());
            let _ = umount(&self.t.mnt(), libc::MNT_DETACH);
        }
    }
}

const OV_WORKLOADS: &[(&str, &str, &str)] = &[
    (
        "ov_cat_all",
        "files/s",
        "read every file of the lower tree, caches dropped",
    ),
    (
        "ov_find_stat",
        "files/s",
        "find . | xargs stat over the lower tree",
    ),
    (
        "ov_git_status",
        "files/s",
        "git status over the lower tree (a git repository)",
    ),
    (
        "ov_edit_big",
        "edits/s",
        "1 byte in the middle of a 50 MiB lower file + fsync",
    ),
    (
        "ov_copy_up",
        "files/s",
        "append a line to every 8th lower file",
    ),
    (
        "ov_create",
        "files/s",
        "create 4 KiB files in a lower directory",
    ),
];

fn files_under(root: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = fs::read_dir(root) else { return };
    for e in rd.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            if e.file_name() != ".git" {
                files_under(&e.path(), out);
            }
        } else if ft.is_file() {
            out.push(e.path());
        }
    }
}

/// One repetition on one target: samples and the delta after the read part and the big edit.
fn ov_rep(
    t: &OvTarget,
    lower: &Path,
    bin: Option<&Path>,
    rel_files: &[PathBuf],
) -> Result<(Vec<Sample>, Growth, Growth), String> {
    let mut m = OvMount::fresh(t, lower, bin)?;
    let mut out = Vec::new();
    let root = t.mnt().join("tree");
    let n = rel_files.len() as f64;
    drop_caches();
    let mut buf = Vec::new();
    let (_, secs) = timed(|| {
        for r in rel_files {
            let p = root.join(r);
            buf.clear();
            io(io(File::open(&p), &p)?.read_to_end(&mut buf), &p)?;
        }
        Ok(())
    })?;
    out.push(("ov_cat_all", n / secs, secs));
    let (_, secs) = timed(|| {
        run(Command::new("sh")
            .current_dir(&root)
            .args(["-c", "find . -print0 | xargs -0 stat > /dev/null"]))
    })?;
    out.push(("ov_find_stat", n / secs, secs));
    let (_, secs) = timed(|| run(git(&root).arg("status")))?;
    out.push(("ov_git_status", n / secs, secs));
    let after_read = m.growth()?;

    let big = t.mnt().join("big.bin");
    let (_, secs) = timed(|| {
        let f = io(OpenOptions::new().write(true).open(&big), &big)?;
        io(f.write_all_at(b"!", (BIG_MIB * MIB / 2 + 7) as u64), &big)?;
        io(f.sync_all(), &big)
    })?;
    out.push(("ov_edit_big", 1.0 / secs, secs));
    let after_edit = m.growth()?;

    let edits: Vec<&PathBuf> = rel_files.iter().step_by(8).collect();
    let (_, secs) = timed(|| {
        for r in &edits {
            let p = root.join(r);
            let mut f = io(OpenOptions::new().append(true).open(&p), &p)?;
            io(f.write_all(b"// edited\n"), &p)?;
        }
        Ok(())
    })?;
    out.push(("ov_copy_up", edits.len() as f64 / secs, secs));
    let data = vec![0x61u8; 4096];
    let count = 1000;
    let (_, secs) = timed(|| {
        for i in 0..count {
            let p = root.join(format!("new-{i:04}.txt"));
            io(fs::write(&p, &data), &p)?;
        }
        Ok(())
    })?;
    out.push(("ov_create", count as f64 / secs, secs));
    m.unmount()?;
    Ok((out, after_read, after_edit))
}

/// Build the lower tree once: the source tree as a git repository, plus big.bin.
fn build_lower(lower: &Path, tree: &Tree) -> Result<Vec<PathBuf>, String> {
    let _ = fs::remove_dir_all(lower);
    let dir = lower.join("tree");
    io(fs::create_dir_all(&dir), &dir)?;
    run(Command::new("cp").arg("-r").args(&tree.entries).arg(&dir))?;
    run(git(&dir).arg("init").arg("-q"))?;
    run(git(&dir).args(["add", "-A"]))?;
    run(git(&dir).args(["commit", "-q", "-m", "lower"]))?;
    let big = lower.join("big.bin");
    let mut f = io(File::create(&big), &big)?;
    let mut rng = Rng(0x0123_4567_89AB_CDEF);
    let mut block = vec![0u8; MIB];
    for _ in 0..BIG_MIB {
        for c in block.chunks_mut(8) {
            c.copy_from_slice(&rng.next().to_le_bytes());
        }
        io(f.write_all(&block), &big)?;
    }
    io(f.sync_all(), &big)?;
    let mut files = Vec::new();
    files_under(&dir, &mut files);
    files.sort();
    Ok(files
        .into_iter()
        .filter_map(|p| p.strip_prefix(&dir).ok().map(Path::to_path_buf))
        .collect())
}

/// Run the overlay form; returns (markdown, JSON object text).
pub fn run_overlay(
    bin: Option<&Path>,
    work: &Path,
    plan: &Plan,
    tree: &Tree,
) -> Result<(String, String), String> {
    let lower = work.join("ov-lower");
    let rel_files = build_lower(&lower, tree)?;
    let have_fuse = Command::new("fuse-overlayfs")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let all = [
        ("overlayfs", Kind::Kernel),
        ("fuse-overlayfs", Kind::Fuse),
        ("agentfs (partial off)", Kind::AgentFs { partial: false }),
        ("agentfs (partial on)", Kind::AgentFs { partial: true }),
    ];
    let mut cols: Vec<OvColumn> = Vec::new();
    for (i, (name, kind)) in all.into_iter().enumerate() {
        let mut col = Column::new(name);
        col.values = OV_WORKLOADS.iter().map(|w| (w.0, Vec::new())).collect();
        if kind == Kind::Fuse && !have_fuse {
            col.missing = Some("missing: apt-get install fuse-overlayfs".into());
        }
        if matches!(kind, Kind::AgentFs { .. }) && bin.is_none() {
            col.missing = Some("missing: no agentfs binary".into());
        }
        let t = OvTarget {
            name,
            kind,
            dir: work.join(format!("ov-{i}")),
        };
        cols.push((t, col, Vec::new()));
    }
    for rep in 0..plan.reps {
        for (t, col, growth) in cols.iter_mut() {
            if col.missing.is_some() {
                continue;
            }
            eprint!("overlay rep {}/{} {:22} ...", rep + 1, plan.reps, t.name);
            let t0 = Instant::now();
            match ov_rep(t, &lower, bin, &rel_files) {
                Ok((samples, a, b)) => {
                    eprintln!(" {:.1} s", t0.elapsed().as_secs_f64());
                    col.add(&samples);
                    growth.push((a, b));
                }
                Err(e) => {
                    eprintln!(" FAILED: {e}");
                    col.missing = Some(format!("failed: {e}"));
                }
            }
            let _ = fs::remove_dir_all(&t.dir);
        }
    }
    let _ = fs::remove_dir_all(&lower);

    // Throughput table: ratios against kernel overlayfs.
    let mut s = String::from("| workload | unit |");
    for (_, c, _) in &cols {
        let _ = write!(s, " {} |", c.name);
    }
    s.push_str("\n|---|---|");
    for _ in &cols {
        s.push_str("---|");
    }
    s.push('\n');
    for (key, unit, _) in OV_WORKLOADS {
        let _ = write!(s, "| {key} | {unit} |");
        let limit = median(cols[0].1.get(key));
        for (_, c, _) in &cols {
            let v = c.get(key);
            super::cell(&mut s, c.missing.is_some(), v, limit);
        }
        s.push('\n');
    }
    s.push_str("\nDelta growth (last repetition): bytes [fs_data rows]\n\n");
    s.push_str("| target | after cat + stat + git status | after 1-byte edit of 50 MiB |\n");
    s.push_str("|---|---|---|\n");
    let mut js = String::from("{\"workloads\": [");
    for (i, (key, unit, what)) in OV_WORKLOADS.iter().enumerate() {
        let _ = write!(
            js,
            "{}{{\"key\": {}, \"unit\": {}, \"what\": {}, \"targets\": {{",
            if i > 0 { ", " } else { "" },
            json_str(key),
            json_str(unit),
            json_str(what)
        );
        for (j, (_, c, _)) in cols.iter().enumerate() {
            let runs: Vec<String> = c.get(key).iter().map(|x| format!("{x:.3}")).collect();
            let _ = write!(
                js,
                "{}{}: {}",
                if j > 0 { ", " } else { "" },
                json_str(c.name),
                match &c.missing {
                    Some(why) => format!("{{\"missing\": {}}}", json_str(why)),
                    None => format!("{{\"runs\": [{}]}}", runs.join(", ")),
                }
            );
        }
        js.push_str("}}");
    }
    js.push_str("], \"growth\": {");
    for (j, (_, c, g)) in cols.iter().enumerate() {
        let row = match (&c.missing, g.last()) {
            (None, Some((a, b))) => {
                let _ = writeln!(
                    s,
                    "| {} | {} [{}] | {} [{}] |",
                    c.name, a.bytes, a.rows, b.bytes, b.rows
                );
                format!(
                    "{{\"after_read_bytes\": {}, \"after_read_fs_data_rows\": {}, \
                     \"after_edit_bytes\": {}, \"after_edit_fs_data_rows\": {}}}",
                    a.bytes, a.rows, b.bytes, b.rows
                )
            }
            _ => {
                let _ = writeln!(s, "| {} | missing | missing |", c.name);
                "null".to_string()
            }
        };
        let _ = write!(
            js,
            "{}{}: {row}",
            if j > 0 { ", " } else { "" },
            json_str(c.name)
        );
    }
    js.push_str("}}");
    for (_, c, _) in &cols {
        if let Some(why) = &c.missing {
            let _ = writeln!(s, "\n{}: {why}", c.name);
        }
    }
    let _ = writeln!(
        s,
        "\nCells: median of {} runs (× kernel overlayfs) [min–max]. Lower: {} files of the \
         tree above as a git repository, plus one {BIG_MIB} MiB file. AgentFS rows: bytes of \
         the database after unmount over its size after init; overlays: bytes in the upper \
         directory.",
        plan.reps,
        rel_files.len()
    );
    Ok((s, js))
}
