//! `cargo bench --bench workloads -- replicate`: the workload suite on a plain mount, on a
//! mount replicating to a local S3 server (moto) with Litestream and on one replicating to a
//! local directory (`file://`, Litestream without moto), in the same run, repetitions
//! alternating (the columns' order rotating from one repetition to the next); then the
//! replication lag, barrier to replica, on a replicating mount under a steady write load.
//! Litestream and moto come from target/test-venv (validation/install-deps.sh).

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{cell, median, one_rep, Backend, Column, Plan, Target, Tree, WORKLOADS};

#[path = "../../tests/common/s3.rs"]
mod s3;
use s3::S3;

/// Give a replicating mount's command the credentials and the Litestream to run.
pub fn apply_env(cmd: &mut Command) -> &mut Command {
    s3::apply(cmd)
}

/// A fresh replica path per repetition (each starts from a new database).
pub struct Replicas {
    base: String,
    n: u32,
}

impl Replicas {
    pub fn next(&mut self) -> String {
        self.n += 1;
        self.base.replace("{n}", &self.n.to_string())
    }
}

/// Barrier-to-replica times in ms: a lower and an upper bound per barrier, and the barriers
/// given up on (not confirmed within [`CONFIRM_WAIT`]).
#[derive(Default)]
struct Lags {
    low: Vec<f64>,
    high: Vec<f64>,
    abandoned: usize,
}

/// Barriers the lag phase takes, the pause between two, and how often the replica is asked.
const BARRIERS: usize = 40;
const PROBE_PAUSE: Duration = Duration::from_millis(500);
const POLL: Duration = Duration::from_millis(50);
/// Most time one barrier waits for the replica.
const CONFIRM_WAIT: Duration = Duration::from_secs(60);

/// Run the Litestream `bin` with `args` and the moto environment; its JSON output.
fn litestream_json(bin: &Path, args: &[&std::ffi::OsStr]) -> Option<serde_json::Value> {
    let out = s3::apply(Command::new(bin).args(args)).output().ok()?;
    out.status.success().then_some(())?;
    serde_json::from_slice(&out.stdout).ok()
}

fn txid(v: &serde_json::Value) -> Option<u64> {
    u64::from_str_radix(v.as_str()?, 16).ok()
}

/// The newest transaction Litestream took from `db`'s WAL (`litestream status`).
fn local_txid(bin: &Path, config: &Path, db: &Path) -> Option<u64> {
    let v = litestream_json(
        bin,
        &[
            "status".as_ref(),
            "-json".as_ref(),
            "-no-expand-env".as_ref(),
            "-config".as_ref(),
            config.as_os_str(),
            db.as_os_str(),
        ],
    )?;
    txid(v.as_array()?.first()?.get("local_txid")?)
}

/// [`local_txid`], asked again every [`POLL`] until Litestream answers (it does not before
/// its first pass over a new database), for at most [`CONFIRM_WAIT`].
fn local_txid_wait(bin: &Path, config: &Path, db: &Path) -> Option<u64> {
    let end = Instant::now() + CONFIRM_WAIT;
    loop {
        if let Some(x) = local_txid(bin, config, db) {
            return Some(x);
        }
        if Instant::now() > end {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// The newest transaction the replica at `url` holds (`litestream ltx`).
fn replica_txid(bin: &Path, url: &str) -> Option<u64> {
    let v = litestream_json(
        bin,
        &[
            "ltx".as_ref(),
            "-json".as_ref(),
            "-level".as_ref(),
            "all".as_ref(),
            url.as_ref(),
        ],
    )?;
    v.as_array()?
        .iter()
        .filter_map(|f| txid(f.get("max_txid")?))
        .max()
}

/// The lag phase, after the repetitions (so its probing costs them nothing): a fresh mount
/// replicating to `url` under a steady write load (64 KiB files written without fsync, one
/// every 20 ms), and [`BARRIERS`] barriers (a file written and fsynced through the mount)
/// timed until the replica confirms them. Litestream numbers its passes over the WAL, not
/// SQLite's commits, so each barrier is bracketed: with X0 the local transaction just before
/// it and X1 just after, the replica confirming X0+1 is the earliest it can hold the barrier
/// (the lower bound) and X1+2, a pass that began after X1 was read, the latest (the upper
/// bound); the replica is asked every [`POLL`].
fn measure_lag(bin: &Path, work: &Path, url: &str) -> Result<Lags, String> {
    let dir = work.join("lag");
    let mnt = dir.join("mnt");
    if mnt.exists() && !super::is_mounted(&mnt) {
        let _ = std::fs::remove_dir_all(&mnt);
    }
    std::fs::create_dir_all(&mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
    let db = dir.join("fs.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.join(format!("fs.db{suffix}")));
    }
    let mount =
        super::AgentFsMount::start_with(bin, &db, &mnt, &dir.join("server.log"), &[], Some(url))?;
    let rec = agentfs::replica::replicating(&db).ok_or("the lag mount is not replicated")?;
    let (rdb, rurl) = rec.dbs.first().cloned().ok_or("no database replicated")?;
    let litestream = s3::venv().join("litestream");
    let load = Load::start(&mnt);
    let mut lags = Lags::default();
    let probe = mnt.join("barrier");
    for n in 0..BARRIERS {
        std::thread::sleep(PROBE_PAUSE);
        let Some(x0) = local_txid_wait(&litestream, &rec.config, &rdb) else {
            lags.abandoned += 1;
            continue;
        };
        let f = File::create(&probe).map_err(|e| e.to_string())?;
        f.write_all_at(&n.to_le_bytes(), 0)
            .and_then(|_| f.sync_all())
            .map_err(|e| format!("barrier: {e}"))?;
        drop(f);
        let t0 = Instant::now();
        let Some(x1) = local_txid_wait(&litestream, &rec.config, &rdb) else {
            lags.abandoned += 1;
            continue;
        };
        let mut low = None;
        let high = loop {
            let r = replica_txid(&litestream, &rurl).unwrap_or(0);
            let ms = t0.elapsed().as_secs_f64() * 1000.0;
            if r > x0 {
                low.get_or_insert(ms);
            }
            if r >= x1 + 2 {
                break Some(ms);
            }
            if t0.elapsed() > CONFIRM_WAIT {
                break None;
            }
            std::thread::sleep(POLL);
        };
        match (low, high) {
            (Some(l), Some(h)) => {
                lags.low.push(l);
                lags.high.push(h);
            }
            _ => lags.abandoned += 1,
        }
    }
    drop(load);
    drop(mount);
    Ok(lags)
}

/// The lag phase's write load, stopped and joined on drop (before its mount goes, on every
/// path, so it never writes under an unmounted mount point).
struct Load {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(mnt: &Path) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, mnt) = (stop.clone(), mnt.to_path_buf());
        let thread = std::thread::spawn(move || {
            let chunk = vec![5u8; 64 << 10];
            let mut i = 0u32;
            while !s.load(Ordering::Relaxed) && super::is_mounted(&mnt) {
                let _ = std::fs::write(mnt.join(format!("load{}", i % 16)), &chunk);
                i += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Load {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The lag phase as one sentence of figures (or why it has none).
fn lag_text(bin: &Path, work: &Path, url: &str) -> String {
    match measure_lag(bin, work, url) {
        Ok(l) => format!(
            "p50 / p90 / p99 / max of {} barriers: at least {}, at most {} ({} not confirmed \
             within {} s)",
            l.high.len(),
            quantiles(&l.low),
            quantiles(&l.high),
            l.abandoned,
            CONFIRM_WAIT.as_secs()
        ),
        Err(e) => format!("not measured: {e}"),
    }
}

/// `cargo bench --bench workloads -- replicate-lag`: the lag phase alone.
pub fn run_lag(bin: &Path, work: &Path) -> Result<String, String> {
    if !s3::installed() {
        return Err(format!(
            "no {} (run validation/install-deps.sh)",
            s3::venv().display()
        ));
    }
    let moto = S3::start();
    let url = moto.bucket("bench", "lag");
    Ok(format!(
        "Replication lag, barrier to replica confirmation under a steady write load, in ms: {}.\n",
        lag_text(bin, work, &url)
    ))
}

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((s.len() as f64 - 1.0) * p).round() as usize;
    s.get(i).copied().unwrap_or(f64::NAN)
}

/// "p50 / p90 / p99 / max" of `v`, in ms.
fn quantiles(v: &[f64]) -> String {
    [0.5, 0.9, 0.99, 1.0]
        .iter()
        .map(|p| format!("{:.0}", percentile(v, *p)))
        .collect::<Vec<_>>()
        .join(" / ")
}

pub fn run_replica(bin: &Path, work: &Path, plan: &Plan, tree: &Tree) -> Result<String, String> {
    if !s3::installed() {
        return Err(format!(
            "no {} (run validation/install-deps.sh)",
            s3::venv().display()
        ));
    }
    let moto = S3::start();
    let base = moto.bucket("bench", "r{n}");
    // The same replication to a local directory: Litestream's own cost without moto's (a local
    // S3 server in Python, standing in for a remote bucket, competes for the same CPUs).
    let files = work.join("replica-files");
    let file_base = format!("file://{}/r{{n}}", files.display());
    let mut targets = Vec::new();
    for (name, replicate) in [
        ("agentfs", None),
        (
            "agentfs+replica",
            Some(Replicas {
                base: base.clone(),
                n: 0,
            }),
        ),
        (
            "agentfs+replica-dir",
            Some(Replicas {
                base: file_base,
                n: 0,
            }),
        ),
    ] {
        let dir = work.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        targets.push(Target {
            name,
            backend: Backend::AgentFs {
                bin: bin.to_path_buf(),
                dir,
                env: Vec::new(),
                mount: None,
                replicate,
            },
        });
    }
    let mut cols: Vec<Column> = targets.iter().map(|t| Column::new(t.name)).collect();
    for rep in 0..plan.reps {
        // The order rotates from one repetition to the next: whatever the place in a
        // repetition costs (a cold start, a warm disk) falls on every column alike.
        let mut order: Vec<(&mut Target, &mut Column)> =
            targets.iter_mut().zip(cols.iter_mut()).collect();
        let n = order.len().max(1);
        order.rotate_left(rep % n);
        for (t, col) in order {
            eprint!("rep {}/{} {:16} ...", rep + 1, plan.reps, t.name);
            let t0 = Instant::now();
            match one_rep(t, plan, tree) {
                Ok(samples) => {
                    eprintln!(" {:.1} s", t0.elapsed().as_secs_f64());
                    col.add(&samples);
                }
                Err(e) => {
                    let _ = t.end();
                    return Err(format!("{}: {e}", t.name));
                }
            }
        }
    }
    drop(targets);
    eprintln!("lag: {BARRIERS} barriers under a write load ...");
    let lag = lag_text(bin, work, &base.replace("{n}", "lag"));
    let _ = std::fs::remove_dir_all(&files);
    let mut s = String::from("| workload | unit |");
    for c in &cols {
        s.push_str(&format!(" {} |", c.name));
    }
    s.push_str("\n|---|---|");
    s.push_str(&"---|".repeat(cols.len()));
    s.push('\n');
    for w in WORKLOADS {
        let a = cols[0].get(w.key);
        s.push_str(&format!("| {} | {} |", w.key, w.unit));
        cell(&mut s, false, a, None);
        for c in &cols[1..] {
            cell(&mut s, false, c.get(w.key), median(a));
        }
        s.push('\n');
    }
    s.push_str(&format!(
        "\nCells: median of {} repetitions (× agentfs) [min–max], the columns alternating in a rotating order: \
         agentfs+replica replicates to the local S3 server, agentfs+replica-dir to a local \
         directory. Replication \
         lag, from a barrier (fsync through a replicating mount under a steady write load, \
         measured after the repetitions) to the replica confirming it, in ms: {lag}.\n",
        plan.reps,
    ));
    Ok(s)
}
