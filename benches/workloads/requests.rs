//! FUSE requests per workload (`cargo bench --bench workloads -- requests`): the suite's
//! workloads (everything `one_rep` runs) once on an AgentFS mount with default knobs, the
//! requests of each timed workload counted by the kernel tracepoint `fuse:fuse_request_send`.
//! The ext4 and tmpfs columns have no FUSE, so nothing to count there.
//!
//! The event is enabled in a tracing instance of our own (`instances/agentfs-bench-<pid>` under
//! tracefs, which is mounted for the run when it was not): the instance has its own buffer and
//! its own enable switch, so the machine's global buffer and the event's global enable state are
//! never touched and anyone else tracing is not disturbed. The instance, buffer included, is
//! removed at the end. The event carries the connection (the mount's device number); the
//! instance's filter keeps only the bench mount's, set again for each workload because a cold
//! read remounts (a new connection).
//!
//! Counted: the requests the kernel sent while a workload ran. A FORGET for an inode evicted
//! later, or a request sent after the workload returned, falls outside it. Events the buffer
//! lost fail the run rather than show a short count.

use super::*;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

const TRACEFS: &str = "/sys/kernel/tracing";
const EVENT: &str = "events/fuse/fuse_request_send";
/// Per-CPU buffer of the instance; a workload of 10,000 files sends some 40,000 events of
/// about 40 bytes.
const BUFFER_KIB: u32 = 32 * 1024;
/// Opcodes named in a row of the table, the most frequent first.
const TOP: usize = 6;

/// Requests by opcode name (without the `FUSE_` prefix).
type Counts = BTreeMap<String, u64>;

struct Tracer {
    /// The instance's directory.
    dir: PathBuf,
    /// The mount point whose connection is counted.
    mnt: PathBuf,
    /// The connection of the section under way.
    conn: u64,
    /// Whether tracefs was mounted for this run (then it is unmounted at the end).
    mounted: bool,
    /// Events the instance had lost when the section began.
    lost: u64,
    /// The counts of every section so far, in order.
    sections: Vec<Counts>,
}

/// The tracer while the requests mode runs; `timed` finds it here.
static TRACER: Mutex<Option<Tracer>> = Mutex::new(None);

fn tracer() -> MutexGuard<'static, Option<Tracer>> {
    TRACER.lock().unwrap_or_else(|e| e.into_inner())
}

impl Tracer {
    fn start(mnt: &Path) -> Result<Tracer, String> {
        let root = Path::new(TRACEFS);
        let mounted = !root.join("instances").is_dir();
        if mounted {
            run(Command::new("mount").args(["-t", "tracefs", "nodev", TRACEFS]))?;
        }
        let dir = root
            .join("instances")
            .join(format!("agentfs-bench-{}", std::process::id()));
        if let Err(e) = fs::create_dir(&dir) {
            if mounted {
                let _ = umount(root, 0);
            }
            return Err(format!("{}: {e}", dir.display()));
        }
        // From here Drop removes the instance (and unmounts tracefs if it was mounted for us).
        let t = Tracer {
            dir,
            mnt: mnt.to_path_buf(),
            conn: 0,
            mounted,
            lost: 0,
            sections: Vec::new(),
        };
        if !t.dir.join(EVENT).is_dir() {
            return Err(format!(
                "no {EVENT} in {TRACEFS} (kernel without FUSE tracepoints?)"
            ));
        }
        t.write("buffer_size_kb", &BUFFER_KIB.to_string())?;
        Ok(t)
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        let p = self.dir.join(file);
        io(fs::write(&p, value), &p)
    }

    /// Events the instance's buffer overwrote or dropped, over all CPUs.
    fn lost_events(&self) -> Result<u64, String> {
        let per_cpu = self.dir.join("per_cpu");
        let mut lost = 0;
        for cpu in io(fs::read_dir(&per_cpu), &per_cpu)?.flatten() {
            let stats = cpu.path().join("stats");
            for line in io(fs::read_to_string(&stats), &stats)?.lines() {
                if let Some(("overrun" | "dropped events", n)) = line.split_once(':') {
                    lost += n.trim().parse::<u64>().unwrap_or(0);
                }
            }
        }
        Ok(lost)
    }

    fn begin(&mut self) -> Result<(), String> {
        self.conn = connection(&self.mnt)?;
        self.write(
            &format!("{EVENT}/filter"),
            &format!("connection == {}", self.conn),
        )?;
        self.write("trace", "")?; // opening `trace` for truncation empties the buffer
        self.lost = self.lost_events()?;
        self.write(&format!("{EVENT}/enable"), "1")
    }

    fn end(&mut self) -> Result<(), String> {
        self.write(&format!("{EVENT}/enable"), "0")?;
        let lost = self.lost_events()?.saturating_sub(self.lost);
        if lost > 0 {
            return Err(format!(
                "the trace buffer lost {lost} events ({BUFFER_KIB} KiB per CPU)"
            ));
        }
        let p = self.dir.join("trace");
        let text = io(fs::read_to_string(&p), &p)?;
        let mut counts = Counts::new();
        for line in text.lines().filter(|l| l.contains("fuse_request_send:")) {
            let (conn, op) =
                parse(line).ok_or_else(|| format!("unexpected trace line {line:?}"))?;
            if conn == self.conn {
                *counts.entry(op.to_string()).or_default() += 1;
            }
        }
        self.write("trace", "")?;
        self.sections.push(counts);
        Ok(())
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.write(&format!("{EVENT}/enable"), "0");
        if let Err(e) = fs::remove_dir(&self.dir) {
            eprintln!("warning: {}: {e}", self.dir.display());
        }
        if self.mounted {
            let _ = umount(Path::new(TRACEFS), 0);
        }
    }
}

/// The connection of the FUSE mount at `mnt` as the event shows it: the superblock's device
/// number in the kernel's own encoding (major in the bits above the low 20, minor below).
fn connection(mnt: &Path) -> Result<u64, String> {
    use std::os::unix::fs::MetadataExt as _;
    let dev = io(fs::metadata(mnt), mnt)?.dev();
    Ok((u64::from(libc::major(dev)) << 20) | u64::from(libc::minor(dev)))
}

/// `... fuse_request_send: connection C req U opcode N (FUSE_NAME) len L` → (C, NAME).
fn parse(line: &str) -> Option<(u64, &str)> {
    let (_, rest) = line.split_once("fuse_request_send:")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    match f.as_slice() {
        ["connection", conn, "req", _, "opcode", _, name, ..] => Some((
            conn.parse().ok()?,
            name.trim_matches(|c| c == '(' || c == ')')
                .trim_start_matches("FUSE_"),
        )),
        _ => None,
    }
}

/// Start of a timed workload: counting begins when the requests mode runs, else nothing.
pub fn section_start() -> Result<(), String> {
    match tracer().as_mut() {
        Some(t) => t.begin(),
        None => Ok(()),
    }
}

/// End of a timed workload: its requests are counted and kept.
pub fn section_end() -> Result<(), String> {
    match tracer().as_mut() {
        Some(t) => t.end(),
        None => Ok(()),
    }
}

/// Holds the tracer in `TRACER` for the run; Drop takes it out, which removes the instance.
struct Installed;

impl Installed {
    fn new(mnt: &Path) -> Result<Installed, String> {
        let t = Tracer::start(mnt)?;
        *tracer() = Some(t);
        Ok(Installed)
    }
    fn sections(&self) -> Vec<Counts> {
        tracer()
            .as_mut()
            .map(|t| std::mem::take(&mut t.sections))
            .unwrap_or_default()
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        drop(tracer().take());
    }
}

/// One row: the workload, how much work it did (in its unit), and its requests.
struct Row {
    w: &'static Workload,
    work: f64,
    counts: Counts,
}

impl Row {
    fn total(&self) -> u64 {
        self.counts.values().sum()
    }
    /// Opcodes by count, the most frequent first.
    fn by_count(&self) -> Vec<(&str, u64)> {
        let mut v: Vec<(&str, u64)> = self.counts.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v
    }
}

/// "files/s" → ("files", "file"): the unit of work of a row, plural and singular.
fn unit_of_work(unit: &str) -> (&str, String) {
    let plural = unit.trim_end_matches("/s");
    let one = if let Some(stem) = plural.strip_suffix("ies") {
        format!("{stem}y")
    } else {
        plural.strip_suffix('s').unwrap_or(plural).to_string()
    };
    (plural, one)
}

fn table(rows: &[Row], plan: &Plan, tree: &Tree) -> String {
    let mut s = String::from(
        "| workload | work | requests | per unit | top opcodes |\n|---|---:|---:|---:|---|\n",
    );
    for r in rows {
        let (plural, one) = unit_of_work(r.w.unit);
        let by = r.by_count();
        // All of them when only one would be left for "the rest".
        let shown = if by.len() > TOP + 1 { TOP } else { by.len() };
        let mut top: Vec<String> = by[..shown]
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        if shown < by.len() {
            let rest: u64 = by[shown..].iter().map(|(_, n)| n).sum();
            top.push(format!("{} other opcodes {rest}", by.len() - shown));
        }
        let per = match r.total() as f64 / r.work {
            x if !x.is_finite() => "–".into(),
            x if x > 0.0 && x < 0.1 => format!("{x:.4} / {one}"),
            x => format!("{} / {one}", fmt_num(x)),
        };
        let _ = writeln!(
            s,
            "| {} | {} {plural} | {} | {per} | {} |",
            r.w.key,
            r.work,
            r.total(),
            if top.is_empty() {
                "none".into()
            } else {
                top.join(", ")
            }
        );
    }
    let _ = writeln!(
        s,
        "\nFUSE requests sent while each workload ran, one run on an AgentFS mount with default \
         knobs, counted by the fuse:fuse_request_send tracepoint filtered to the bench mount's \
         connection (FORGETs of inodes evicted later are not counted). Sizes: seq {} MiB, \
         random {} MiB, {} files, {} small files, tree {} files ({}). ext4 and tmpfs: no FUSE.",
        plan.seq_mib, plan.rand_mib, plan.files, plan.small_files, tree.files, tree.label
    );
    s
}

fn json(rows: &[Row], plan: &Plan, tree: &Tree, unix: u64, machine: &str) -> String {
    let mut s = String::from("{\n");
    let _ = writeln!(s, "  \"unix_time\": {unix},");
    let _ = writeln!(s, "  \"quick\": {},", plan.quick);
    let _ = writeln!(s, "  \"machine\": {},", json_str(machine));
    let _ = writeln!(
        s,
        "  \"counted\": \"fuse:fuse_request_send, the bench mount's connection, AgentFS with default knobs, one run\","
    );
    let _ = writeln!(s, "  \"sizes\": {},", sizes_json(plan, tree));
    s.push_str("  \"workloads\": [\n");
    for (i, r) in rows.iter().enumerate() {
        let ops: Vec<String> = r
            .by_count()
            .iter()
            .map(|(k, n)| format!("{}: {n}", json_str(k)))
            .collect();
        let per = if r.work > 0.0 {
            format!("{:.4}", r.total() as f64 / r.work)
        } else {
            "null".into()
        };
        let _ = write!(
            s,
            "    {{\"key\": {}, \"unit\": {}, \"work\": {}, \"requests\": {}, \"per_unit\": {per}, \"opcodes\": {{{}}}}}",
            json_str(r.w.key),
            json_str(unit_of_work(r.w.unit).0),
            r.work,
            r.total(),
            ops.join(", ")
        );
        s.push_str(if i + 1 < rows.len() { ",\n" } else { "\n" });
    }
    s.push_str("  ]\n}\n");
    s
}

/// The requests mode: the table, also written as JSON to `results`.
pub fn run_requests(
    bin: &Path,
    work: &Path,
    results: &Path,
    plan: &Plan,
    tree: &Tree,
) -> Result<String, String> {
    let dir = work.join("agentfs");
    io(fs::create_dir_all(&dir), &dir)?;
    let mut t = Target {
        name: "agentfs",
        backend: Backend::AgentFs {
            bin: bin.to_path_buf(),
            dir: dir.clone(),
            env: Vec::new(),
            mount: None,
            replicate: None,
        },
    };
    let on = Installed::new(&dir.join("mnt"))?;
    eprint!("requests: the workloads once on agentfs ...");
    let t0 = Instant::now();
    let samples = one_rep(&mut t, plan, tree).inspect_err(|_| {
        let _ = t.end();
    })?;
    eprintln!(" {:.1} s", t0.elapsed().as_secs_f64());
    let sections = on.sections();
    drop(on);
    drop(t);
    let timed: Vec<&Sample> = samples
        .iter()
        .filter(|(k, _, _)| !k.starts_with("rss_"))
        .collect();
    if timed.len() != sections.len() {
        return Err(format!(
            "{} timed workloads but {} counted sections",
            timed.len(),
            sections.len()
        ));
    }
    let mut rows = Vec::new();
    for ((key, value, secs), counts) in timed.into_iter().zip(sections) {
        let w = WORKLOADS
            .iter()
            .find(|w| w.key == *key)
            .ok_or_else(|| format!("unknown workload {key}"))?;
        rows.push(Row {
            w,
            work: (value * secs).round(),
            counts,
        });
    }
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let m = machine();
    let j = json(&rows, plan, tree, unix, &m);
    let file = results.join(format!("requests-{unix}.json"));
    for p in [&file, &results.join("requests-latest.json")] {
        io(fs::write(p, &j), p)?;
    }
    let _ = fs::remove_dir_all(&dir);
    Ok(format!(
        "FUSE requests per workload{} — {m}\n\n{}\nresults: {}",
        if plan.quick { " (quick)" } else { "" },
        table(&rows, plan, tree),
        file.display()
    ))
}
