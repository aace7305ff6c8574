//! The workloads inside a sandbox on each mount backend, beside the same workloads on a plain
//! mount of the project's delta and in a native ext4 directory, alternating inside each
//! repetition (the sandbox issue allows the sandbox 10% over the mount).
//!
//! Two projects (`agentfs quick` of scratch source directories, their projects root in the
//! scratch space), one per backend. Each repetition gives a project a fresh delta, then runs the
//! suite's workloads (everything `one_rep` runs) in a copy of this bench started as a runner:
//! * `ext4`: the runner a plain child working in a directory on the ext4 disk;
//! * `mount`: on `agentfs mount DELTA MNT -f` (the FUSE project's delta over its directory),
//!   the runner a plain child working under MNT;
//! * `sandbox` (FUSE, with and without automatic checkpoints) and `sandbox, overlayfs`: inside
//!   `agentfs exec <project> --ro-bind HOST -- RUNNER`, working at the project's real path, as
//!   the sandbox's unprivileged user.
//!
//! HOST holds the runner (a copy of this binary), the source tree the copy workloads read and
//! its tar (`tree.tar` beside `tree`, for `untar`), so every target reads the tree from the same
//! ext4 directory. Caches are made cold the same
//! way on all: the runner asks, the bench syncs and drops the kernel's caches (a sandbox cannot
//! be remounted mid-run, so the mount is not remounted either; the server's SQLite cache stays
//! warm). The runner prints one `S key value seconds` line per measurement; before it exits it
//! asks for the resident sets: the mount's server, and a sandbox's supervisor (the server, on
//! FUSE) plus its pid 1.

use super::*;
use std::io::BufRead as _;

/// The argument that makes this bench a runner: `--sandbox-runner DIR TREE quick|full`.
pub const RUNNER_ARG: &str = "--sandbox-runner";

const PROJECT: &str = "wl";
const PROJECT_OV: &str = "wl-ov";

/// A sandbox column: which project (and so which mount backend) and the knobs it runs with.
struct Sandbox<'a> {
    column: &'static str,
    project: &'static str,
    backend: &'static str,
    src: &'a Path,
    knobs: &'static [(&'static str, &'static str)],
}

/// Runner side: run the suite on DIR, talking to the bench on stdin/stdout.
pub fn runner(args: &[String]) -> ! {
    let [dir, tree_dir, size] = args else {
        eprintln!("usage: {RUNNER_ARG} DIR TREE quick|full");
        std::process::exit(2);
    };
    let plan = Plan::new(size == "quick");
    let tree_dir = PathBuf::from(tree_dir);
    let mut entries: Vec<PathBuf> = fs::read_dir(&tree_dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    entries.sort();
    let mut tree = Tree {
        label: tree_dir.display().to_string(),
        entries,
        files: 0,
        bytes: 0,
        tar: tree_dir.with_extension("tar"),
    };
    count_tree(&tree_dir, &mut tree.files, &mut tree.bytes);
    let mut t = Target {
        name: "runner",
        backend: Backend::Runner {
            dir: PathBuf::from(dir),
        },
    };
    match one_rep(&mut t, &plan, &tree) {
        Ok(samples) => {
            for (k, v, secs) in samples {
                println!("S {k} {v} {secs}");
            }
            ask("M");
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("runner: {e}");
            std::process::exit(1)
        }
    }
}

/// Runner side: send `what` to the bench and wait for its answer.
pub fn ask(what: &str) {
    println!("{what}");
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
}

/// Resident set of `pid` in MiB.
fn rss_mib(pid: u32) -> Option<f64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Bench side: drive one runner, answering its cold-cache and memory requests; `rss` measures
/// the target's processes when the runner is done.
fn drive(mut cmd: Command, rss: &dyn Fn() -> Option<f64>) -> Result<Vec<Sample>, String> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    let mut to = child.stdin.take().ok_or("runner stdin")?;
    let from = std::io::BufReader::new(child.stdout.take().ok_or("runner stdout")?);
    let mut out = Vec::new();
    for line in from.lines() {
        let line = line.map_err(|e| e.to_string())?;
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["C"] => drop_caches(),
            ["M"] => {
                if let Some(m) = rss() {
                    out.push(("rss_end", m, 0.0));
                }
            }
            ["S", key, v, secs] => {
                let key = WORKLOADS
                    .iter()
                    .find(|w| w.key == *key)
                    .ok_or_else(|| format!("runner: unknown workload {key}"))?
                    .key;
                let v = v.parse().map_err(|_| format!("runner: {line}"))?;
                out.push((key, v, secs.parse().unwrap_or(0.0)));
                continue;
            }
            _ => return Err(format!("runner: unexpected line {line:?}")),
        }
        to.write_all(b"ok\n").map_err(|e| e.to_string())?;
    }
    let o = child.wait_with_output().map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "runner exited with {}: {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(out)
}

/// The rows this comparison prints: the suite's timed workloads and the end resident set.
fn rows() -> impl Iterator<Item = &'static Workload> {
    WORKLOADS
        .iter()
        .filter(|w| !w.key.starts_with("rss_") || w.key == "rss_end")
}

/// Bench side: the comparison, as a markdown table.
pub fn run_sandbox(bin: &Path, work: &Path, plan: &Plan, tree: &Tree) -> Result<String, String> {
    let dir = work.join("sandbox");
    if dir.exists() {
        io(fs::remove_dir_all(&dir), &dir)?;
    }
    let (projects, host, mnt, ext4) = (
        dir.join("projects"),
        dir.join("host"),
        dir.join("mnt"),
        dir.join("ext4"),
    );
    // One project per backend, each over its own source directory.
    let (src, src_ov) = (dir.join("src"), dir.join("src-ov"));
    for d in [
        &projects,
        &src,
        &src_ov,
        &host,
        &mnt,
        &ext4,
        &host.join("tree"),
    ] {
        io(fs::create_dir_all(d), d)?;
    }
    for s in [&src, &src_ov] {
        io(fs::write(s.join("README"), b"project\n"), s)?;
    }
    // The runner and the tree, readable by the sandbox's unprivileged user.
    let runner = host.join("runner");
    let me = io(std::env::current_exe(), Path::new("current_exe"))?;
    io(fs::copy(&me, &runner), &runner)?;
    run(Command::new("cp")
        .arg("-r")
        .args(&tree.entries)
        .arg(host.join("tree")))?;
    let tar = host.join("tree.tar");
    io(fs::copy(&tree.tar, &tar), &tar)?;
    run(Command::new("chmod").args(["-R", "a+rX"]).arg(&dir))?;
    let af = |args: &[&str]| {
        let mut c = Command::new(bin);
        c.args(args).env("AGENTFS_PROJECTS_DIR", &projects);
        c
    };
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let size = if plan.quick { "quick" } else { "full" };
    let tree_s = s(&host.join("tree"));
    let (host_s, runner_s) = (s(&host), s(&runner));
    // The columns. "no checkpoints" separates the view's cost from the history's (each
    // checkpoint freezes the runner and walks the delta).
    let sandboxes: [Sandbox; 3] = [
        Sandbox {
            column: "sandbox",
            project: PROJECT,
            backend: "fuse",
            src: &src,
            knobs: &[],
        },
        Sandbox {
            column: "sandbox, no checkpoints",
            project: PROJECT,
            backend: "fuse",
            src: &src,
            knobs: &[
                ("AGENTFS_CHECKPOINT_IDLE_MS", "0"),
                ("AGENTFS_CHECKPOINT_MAX_S", "0"),
            ],
        },
        Sandbox {
            column: "sandbox, overlayfs",
            project: PROJECT_OV,
            backend: "overlayfs",
            src: &src_ov,
            knobs: &[],
        },
    ];
    for sb in &sandboxes {
        if !projects.join(sb.project).exists() {
            run(&mut af(&[
                "quick",
                &s(sb.src),
                "--name",
                sb.project,
                "--mount-backend",
                sb.backend,
                "--",
                "true",
            ]))?;
        }
    }
    // A fresh delta of `project` over `src` (and no upper an overlayfs run left).
    let fresh_delta = |project: &str, src: &Path| -> Result<(), String> {
        let pdir = projects.join(project);
        let db = pdir.join("delta.db");
        for suffix in ["", "-wal", "-shm"] {
            let _ = fs::remove_file(format!("{}{suffix}", db.display()));
        }
        for d in ["upper", "work"] {
            let d = pdir.join(d);
            if d.exists() {
                io(fs::remove_dir_all(&d), &d)?;
            }
        }
        run(Command::new(bin)
            .arg("init")
            .arg(&db)
            .arg("--base")
            .arg(src))
    };
    let mut cols: Vec<Column> = ["ext4", "mount"]
        .into_iter()
        .chain(sandboxes.iter().map(|sb| sb.column))
        .map(Column::new)
        .collect();
    for rep in 0..plan.reps {
        for (i, col) in cols.iter_mut().enumerate() {
            if col.missing.is_some() {
                continue;
            }
            eprint!("sandbox rep {}/{} {:8} ...", rep + 1, plan.reps, col.name);
            let t0 = Instant::now();
            let res = match i {
                0 => {
                    let _ = fs::remove_dir_all(&ext4);
                    io(fs::create_dir_all(&ext4), &ext4).and_then(|()| {
                        let mut c = Command::new(&runner);
                        c.arg(RUNNER_ARG).arg(&ext4).arg(&tree_s).arg(size);
                        drive(c, &|| None)
                    })
                }
                1 => fresh_delta(PROJECT, &src).and_then(|()| {
                    let db = projects.join(PROJECT).join("delta.db");
                    let m = AgentFsMount::start(bin, &db, &mnt, &dir.join("server.log"))?;
                    let mut c = Command::new(&runner);
                    c.arg(RUNNER_ARG).arg(&mnt).arg(&tree_s).arg(size);
                    let r = drive(c, &|| m.memory("VmRSS"));
                    drop(m);
                    r
                }),
                _ => {
                    let sb = &sandboxes[i - 2];
                    let src_s = s(sb.src);
                    fresh_delta(sb.project, sb.src).and_then(|()| {
                        let mut c = af(&[
                            "exec",
                            sb.project,
                            "--ro-bind",
                            &host_s,
                            "--",
                            &runner_s,
                            RUNNER_ARG,
                            &src_s,
                            &tree_s,
                            size,
                        ]);
                        c.envs(sb.knobs.iter().copied());
                        let live = projects.join(sb.project);
                        drive(c, &|| {
                            let m = agentfs::sandbox::live(&live)?;
                            Some(rss_mib(m.supervisor as u32)? + rss_mib(m.pid1 as u32)?)
                        })
                    })
                }
            };
            match res {
                Ok(samples) => {
                    eprintln!(" {:.1} s", t0.elapsed().as_secs_f64());
                    col.add(&samples);
                }
                Err(e) => {
                    eprintln!(" FAILED: {e}");
                    col.missing = Some(format!("failed: {e}"));
                }
            }
        }
    }
    let mut s = String::from("| workload | unit |");
    for c in &cols {
        let _ = write!(s, " {} |", c.name);
    }
    for c in &cols[2..] {
        let _ = write!(s, " {} ÷ mount |", c.name);
    }
    s.push_str("\n|---|---|");
    s.push_str(&"---|".repeat(2 * cols.len() - 2));
    s.push('\n');
    for w in rows() {
        let _ = write!(s, "| {} | {} |", w.key, w.unit);
        let native = median(cols[0].get(w.key)).filter(|m| *m > 0.0);
        for c in &cols {
            cell(&mut s, c.missing.is_some(), c.get(w.key), native);
        }
        for c in &cols[2..] {
            match (median(cols[1].get(w.key)), median(c.get(w.key))) {
                (Some(a), Some(b)) if a > 0.0 => {
                    let _ = write!(s, " {:.2} |", b / a);
                }
                _ => s.push_str(" – |"),
            }
        }
        s.push('\n');
    }
    for c in &cols {
        if let Some(why) = &c.missing {
            let _ = writeln!(s, "\n{}: {why}", c.name);
        }
    }
    let _ = writeln!(
        s,
        "\nCells: median of {} runs (× native ext4) [min–max], the columns alternating in each \
         repetition. ext4: the same runner in a directory on the ext4 disk. rss_end: the mount's \
         server; a sandbox's supervisor (its server, on FUSE) plus its pid 1. Throughput ratios \
         under 1 are the sandbox's cost.",
        plan.reps
    );
    let _ = fs::remove_dir_all(&dir);
    Ok(s)
}
