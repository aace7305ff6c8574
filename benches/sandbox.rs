//! Launch overhead of the sandbox: `sandbox::run` and `sandbox::exec` (joining a live sandbox)
//! of `true`, beside `unshare -Urmpf true` and, where installed, `bwrap ... true`, in the same
//! run. Median and p99 of `AGENTFS_BENCH_SANDBOX_N` launches each.
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
        net: Net::Host,
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
    }
}

/// The copy of the bench that runs one sandbox call and exits with its status.
fn role(role: &str, root: &Path) -> ! {
    let knobs = agentfs::knobs::get();
    let res = match role {
        "run" => agentfs::sandbox::run(&request(root, &["true"]), knobs),
        "exec" => agentfs::sandbox::exec(&request(root, &["true"]), knobs),
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

fn row(name: &str, d: Option<Vec<Duration>>) {
    match d {
        Some(d) => {
            let med = d[d.len() / 2];
            let p99 = d[(d.len() * 99 / 100).min(d.len() - 1)];
            println!(
                "| {name} | {:.1} ms | {:.1} ms |",
                med.as_secs_f64() * 1e3,
                p99.as_secs_f64() * 1e3
            );
        }
        None => println!("| {name} | failed | failed |"),
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
    if Command::new("bwrap").arg("--version").output().is_ok() {
        row(
            "bwrap (ro /usr, proc, dev, tmpfs /tmp) true",
            time(n, || {
                let mut c = Command::new("bwrap");
                c.args([
                    "--unshare-user",
                    "--unshare-pid",
                    "--ro-bind",
                    "/usr",
                    "/usr",
                    "--symlink",
                    "usr/bin",
                    "/bin",
                    "--symlink",
                    "usr/lib",
                    "/lib",
                    "--symlink",
                    "usr/lib64",
                    "/lib64",
                    "--proc",
                    "/proc",
                    "--dev",
                    "/dev",
                    "--tmpfs",
                    "/tmp",
                    "true",
                ]);
                c
            }),
        );
    } else {
        println!("| bwrap | not installed | |");
    }
    row("agentfs run -- true", time(n, || me("run", &root)));
    let mut live = me("live", &root).spawn().expect("live sandbox");
    let marker = root.join("project/live.json");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !marker.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    row(
        "agentfs exec -- true (joining)",
        time(n, || me("exec", &root)),
    );
    let _ = std::fs::write(root.join("home/stop"), b"");
    let _ = live.wait();
    let _ = std::fs::remove_dir_all(&root);
}
