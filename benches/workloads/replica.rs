//! `cargo bench --bench workloads -- replicate`: the workload suite on a plain mount and on a
//! mount replicating to a local S3 server (moto) with Litestream, in the same run, repetitions
//! alternating; and the replication lag (`agentfs status`) sampled while the replicated
//! repetitions run. Litestream and moto come from target/test-venv (validation/install-deps.sh).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{median, one_rep, Backend, Column, Plan, Target, Tree, WORKLOADS};

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

/// Sample the lag (Litestream transactions the replica has not confirmed) of every live
/// replication every second until `stop` (each sample runs Litestream twice, which a 2-core machine feels).
fn sampler(bin: PathBuf, stop: Arc<AtomicBool>, lags: Arc<Mutex<Vec<f64>>>) {
    while !stop.load(Ordering::Relaxed) {
        let out = s3::apply(Command::new(&bin).args(["status", "--json"])).output();
        if let Some(v) = out
            .ok()
            .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        {
            for r in v["replications"].as_array().into_iter().flatten() {
                for d in r["databases"].as_array().into_iter().flatten() {
                    if let Some(l) = d["lag_txns"].as_u64() {
                        if let Ok(mut g) = lags.lock() {
                            g.push(l as f64);
                        }
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((s.len() as f64 - 1.0) * p).round() as usize;
    s.get(i).copied().unwrap_or(f64::NAN)
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
    ] {
        let dir = work.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        targets.push(Target {
            name,
            backend: Backend::AgentFs {
                bin: bin.to_path_buf(),
                dir,
                budget: None,
                mount: None,
                replicate,
            },
        });
    }
    let mut cols: Vec<Column> = targets.iter().map(|t| Column::new(t.name)).collect();
    let lags = Arc::new(Mutex::new(Vec::new()));
    for rep in 0..plan.reps {
        for (t, col) in targets.iter_mut().zip(cols.iter_mut()) {
            eprint!("rep {}/{} {:16} ...", rep + 1, plan.reps, t.name);
            let stop = Arc::new(AtomicBool::new(false));
            let sampling = matches!(
                &t.backend,
                Backend::AgentFs {
                    replicate: Some(_),
                    ..
                }
            )
            .then(|| {
                let (b, s, l) = (bin.to_path_buf(), stop.clone(), lags.clone());
                std::thread::spawn(move || sampler(b, s, l))
            });
            let t0 = Instant::now();
            let r = one_rep(t, plan, tree);
            stop.store(true, Ordering::Relaxed);
            if let Some(h) = sampling {
                let _ = h.join();
            }
            match r {
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
    let mut s = String::from(
        "| workload | unit | agentfs | agentfs+replica | replica/plain |\n|---|---|---|---|---|\n",
    );
    for w in WORKLOADS {
        let (a, b) = (median(cols[0].get(w.key)), median(cols[1].get(w.key)));
        let ratio = match (a, b) {
            (Some(a), Some(b)) if a > 0.0 => format!("{:.2}", b / a),
            _ => "–".into(),
        };
        let f = |v: Option<f64>| v.map_or("–".to_string(), super::fmt_num);
        s.push_str(&format!(
            "| {} | {} | {} | {} | {ratio} |\n",
            w.key,
            w.unit,
            f(a),
            f(b)
        ));
    }
    let lags = lags.lock().map(|g| g.clone()).unwrap_or_default();
    s.push_str(&format!(
        "\nMedians of {} repetitions each, alternating. Replication lag (Litestream transactions \
         not yet in the replica, `agentfs status` every second while the replicated repetitions ran, \
         {} samples): p50 {} p90 {} p99 {} max {}.\n",
        plan.reps,
        lags.len(),
        percentile(&lags, 0.5),
        percentile(&lags, 0.9),
        percentile(&lags, 0.99),
        percentile(&lags, 1.0)
    ));
    Ok(s)
}
