//! Launch overhead of the sandbox: `sandbox::run` and `sandbox::exec` (joining a live sandbox)
//! of `true`, beside `unshare -Urmpf true` and, where installed, `bwrap ... true`, in the same
//! run. Median and p99 of `AGENTFS_BENCH_SANDBOX_N` launches each. Then 16 sandboxes of 16
//! projects at once, each running a small workload: how many finished, and the resident set of
//! an idle sandbox (its server and its pid 1) with the total.
//!
//! `cargo bench --bench sandbox` (root, /dev/fuse). The bench runs the library API in a copy of
//! itself (as the tests do), so every launch pays for one process start, as `agentfs run` would.
//! The project is a scratch directory under target/tmp, removed at the end.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agentfs::sandbox::request::{HomeMode, Net, Policy, SandboxRequest};

const ROLE: &str = "BENCH_SANDBOX_ROLE";
const ROOT: &str = "BENCH_SANDBOX_ROOT";

fn request(root: &Path, command: &[&str]) -> SandboxRequest {
    let source = root.join("src");
    SandboxRequest {
        project: "bench".into(),
        project_dir: root.join("project"),
        source: source.clone(),
        db: root.join("project/delta.db"),
        command: command.iter().map(Into::into).collect(),
        cwd: source.clone(),
        home_dir: root.join("home"),
        home: HomeMode::FullRo,
        masks: vec![],
        binds: vec![],
        policy: Policy {
            mode: None,
            writable: vec![source],
        },
        refuse_escaping_symlinks: false,
        net: Net::Host,
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        replicate: None,
        backend: Default::default(),
        backend_reason: String::new(),
    }
}

/// The copy of the bench that runs one sandbox call and exits with its status.
fn role(role: &str, root: &Path) -> ! {
    let knobs = agentfs::knobs::get();
    let res = match role {
        "run" => agentfs::sandbox::run(&request(root, &["true"]), knobs),
        "exec" => agentfs::sandbox::exec(&request(root, &["true"]), knobs),
        "many" => {
            let stop = root.join("home/stop");
            let script = format!(
                "{SMALL_WORKLOAD}; while [ ! -e {} ]; do sleep 0.05; done",
                stop.display()
            );
            agentfs::sandbox::run(&request(root, &["/bin/sh", "-c", &script]), knobs)
        }
        _ => {
            let stop = root.join("home/stop");
            let wait = format!("while [ ! -e {} ]; do sleep 0.05; done", stop.display());
            agentfs::sandbox::run(&request(root, &["/bin/sh", "-c", &wait]), knobs)
        }
    };
    match res {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("sandbox: {e}");
            std::process::exit(250)
        }
    }
}

fn me(role: &str, root: &Path) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("own path"));
    c.env(ROLE, role).env(ROOT, root).stdout(Stdio::null());
    c
}

fn time(n: usize, mut cmd: impl FnMut() -> Command) -> Option<Vec<Duration>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let st = cmd().status().ok()?;
        if !st.success() {
            return None;
        }
        out.push(t.elapsed());
    }
    out.sort();
    Some(out)
}

/// Print the median and p99 of `d` and give the median back.
fn row(name: &str, d: Option<Vec<Duration>>) -> Option<Duration> {
    match d {
        Some(d) => {
            let med = d[d.len() / 2];
            let p99 = d[(d.len() * 99 / 100).min(d.len() - 1)];
            println!(
                "| {name} | {:.1} ms | {:.1} ms |",
                med.as_secs_f64() * 1e3,
                p99.as_secs_f64() * 1e3
            );
            Some(med)
        }
        None => {
            println!("| {name} | failed | failed |");
            None
        }
    }
}

fn main() {
    if let (Ok(r), Ok(root)) = (std::env::var(ROLE), std::env::var(ROOT)) {
        role(&r, Path::new(&root));
    }
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let n = agentfs::knobs::get().bench_sandbox_n as usize;
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bench-sandbox-{}", std::process::id()));
    std::fs::create_dir_all(root.join("src")).expect("scratch");
    std::fs::create_dir_all(root.join("project")).expect("scratch");
    std::fs::create_dir_all(root.join("home")).expect("scratch");
    let init = Command::new(env!("CARGO_BIN_EXE_agentfs"))
        .arg("init")
        .arg(root.join("project/delta.db"))
        .arg("--base")
        .arg(root.join("src"))
        .status();
    if !matches!(init, Ok(s) if s.success()) {
        eprintln!("cannot create the project's delta");
        return;
    }
    println!("| launch of `true` ({n} each) | median | p99 |\n|---|---|---|");
    row(
        "unshare -Urmpf true",
        time(n, || {
            let mut c = Command::new("unshare");
            c.args(["-Urmpf", "true"]);
            c
        }),
    );
    let mut bwrap_median = None;
    if Command::new("bwrap").arg("--version").output().is_ok() {
        let d = time(n, || {
            let mut c = Command::new("bwrap");
            c.args([
                "--unshare-all",
                "--die-with-parent",
                "--ro-bind",
                "/",
                "/",
                "true",
            ]);
            c
        });
        bwrap_median = row(
            "bwrap --unshare-all --die-with-parent --ro-bind / / true",
            d,
        );
        row(
            "bwrap, a view like ours (ro system dirs and /sys, proc, dev, tmpfs /tmp) true",
            time(n, || {
                let mut c = Command::new("bwrap");
                c.args(["--unshare-user", "--unshare-pid", "--die-with-parent"]);
                for dir in ["/usr", "/etc", "/opt", "/sys"] {
                    c.args(["--ro-bind-try", dir, dir]);
                }
                for (link, target) in [("/bin", "usr/bin"), ("/sbin", "usr/sbin")] {
                    c.args(["--symlink", target, link]);
                }
                for (link, target) in [("/lib", "usr/lib"), ("/lib64", "usr/lib64")] {
                    c.args(["--symlink", target, link]);
                }
                c.args(["--proc", "/proc", "--dev", "/dev"]);
                c.args(["--tmpfs", "/tmp", "--tmpfs", "/var/tmp", "true"]);
                c
            }),
        );
    } else {
        println!("| bwrap | not installed (apt-get install bubblewrap) | |");
    }
    let run = row("agentfs run -- true", time(n, || me("run", &root)));
    let mut live = me("live", &root).spawn().expect("live sandbox");
    let marker = root.join("project/live.json");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !marker.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let exec = row(
        "agentfs exec -- true (joining)",
        time(n, || me("exec", &root)),
    );
    let _ = std::fs::write(root.join("home/stop"), b"");
    let _ = live.wait();
    if let Some(b) = bwrap_median {
        for (name, m) in [("run", run), ("exec", exec)] {
            if let Some(m) = m {
                println!(
                    "{name}: {:.2}x bwrap --unshare-all (median; target within 2x)",
                    m.as_secs_f64() / b.as_secs_f64()
                );
            }
        }
    }
    many(&root);
    let _ = std::fs::remove_dir_all(&root);
}

/// Sandboxes of distinct projects live at once.
const MANY: usize = 16;

/// The small workload each of the `MANY` sandboxes runs: 200 files written, listed and read back
/// in its project, then a line on stdout, then idle until the bench says stop.
const SMALL_WORKLOAD: &str = "set -e; mkdir -p w; i=0; while [ $i -lt 200 ]; do \
     echo \"file $i\" > w/f$i; i=$((i+1)); done; ls w | wc -l > /dev/null; cat w/* > /dev/null; \
     echo done";

/// A scratch project for one of the `MANY` sandboxes: its source, delta and home under `root`.
fn make_project(root: &Path) -> bool {
    for d in ["src", "project", "home"] {
        if std::fs::create_dir_all(root.join(d)).is_err() {
            return false;
        }
    }
    let init = Command::new(env!("CARGO_BIN_EXE_agentfs"))
        .arg("init")
        .arg(root.join("project/delta.db"))
        .arg("--base")
        .arg(root.join("src"))
        .stdout(Stdio::null())
        .status();
    matches!(init, Ok(s) if s.success())
}

/// Resident set of `pid` in KiB (0 when it is gone).
fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            let l = t.lines().find(|l| l.starts_with("VmRSS:"))?;
            l.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// `MANY` sandboxes of `MANY` projects at once, each running `SMALL_WORKLOAD`; every one must
/// finish. Then, all of them idle and live, the resident set of each (server + pid 1).
fn many(base: &Path) {
    println!("\n{MANY} sandboxes of {MANY} projects at once, each writing and reading 200 files:");
    let roots: Vec<PathBuf> = (0..MANY)
        .map(|i| base.join(format!("many-{i:02}")))
        .collect();
    if !roots.iter().all(|r| make_project(r)) {
        println!("failed: cannot create the projects");
        return;
    }
    let t = Instant::now();
    let mut children = Vec::new();
    for r in &roots {
        let mut c = me("many", r);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        match c.spawn() {
            Ok(child) => children.push(child),
            Err(e) => println!("failed: spawn: {e}"),
        }
    }
    // Each prints one line when its workload is done; then it idles.
    let mut finished = 0;
    let mut outs = Vec::new();
    for c in children.iter_mut() {
        let mut line = String::new();
        if let Some(out) = c.stdout.take() {
            let mut out = std::io::BufReader::new(out);
            let _ = std::io::BufRead::read_line(&mut out, &mut line);
            outs.push(out);
        }
        if line.trim() == "done" {
            finished += 1;
        }
    }
    let all_done = t.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let mut per: Vec<u64> = roots
        .iter()
        .filter_map(|r| agentfs::sandbox::live(&r.join("project")))
        .map(|m| rss_kib(m.supervisor) + rss_kib(m.pid1))
        .collect();
    per.sort();
    for r in &roots {
        let _ = std::fs::write(r.join("home/stop"), b"");
    }
    let mut failed = Vec::new();
    for (i, c) in children.into_iter().enumerate() {
        match c.wait_with_output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => failed.push(format!(
                "sandbox {i}: {}: {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => failed.push(format!("sandbox {i}: {e}")),
        }
    }
    drop(outs);
    println!(
        "finished workloads: {finished} of {MANY} in {:.2} s (all started at once)",
        all_done.as_secs_f64()
    );
    if let (Some(lo), Some(hi)) = (per.first(), per.last()) {
        let total: u64 = per.iter().sum();
        println!(
            "idle sandbox (server + pid 1 RSS), {} measured: median {:.1} MiB, min {:.1}, max {:.1}; total {:.1} MiB",
            per.len(),
            per[per.len() / 2] as f64 / 1024.0,
            *lo as f64 / 1024.0,
            *hi as f64 / 1024.0,
            total as f64 / 1024.0
        );
    }
    if failed.is_empty() && finished == MANY {
        println!("all {MANY} sandboxes finished");
    } else {
        println!(
            "FAILED: {} sandbox(es) did not finish",
            MANY - finished.min(MANY)
        );
        for f in failed {
            println!("  {f}");
        }
    }
}
