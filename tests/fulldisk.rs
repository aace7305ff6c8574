//! A full disk and space coming back, through real mounts. The full-disk tests put the
//! database on a small tmpfs (root only: mounting a tmpfs needs CAP_SYS_ADMIN) and fill it
//! through the mount.

mod common;

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{agentfs, fuse_or_skip, Mounted};

/// A tmpfs of a fixed size, unmounted on drop (after the mount that uses it: declare it after
/// the [`Mounted`] in a struct, so it drops second).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(at: &Path, mib: u64) -> Tmpfs {
        fs::create_dir_all(at).expect("mkdir tmpfs");
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(at)
            .status()
            .expect("run mount");
        assert!(st.success(), "mounting a tmpfs failed");
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A mount whose database lives on a small tmpfs. Tests run them in parallel: every fresh tmpfs
/// numbers its first file alike, and a mount must not take another tmpfs's database for its own.
struct SmallDisk {
    m: Mounted,
    _disk: Tmpfs,
}

impl SmallDisk {
    fn new(mib: u64, env: &[(&str, &str)]) -> SmallDisk {
        let mut m = Mounted::unmounted_with_env(env);
        let disk = Tmpfs::new(&m.dir.path().join("disk"), mib);
        m.db = disk.0.join("db.sqlite");
        let out = agentfs(&["init", m.db.to_str().expect("utf8")]);
        assert!(out.status.success(), "init failed");
        m.mount();
        SmallDisk { m, _disk: disk }
    }
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// Write 1 MiB pieces to `path` until a write or the final fsync fails; that error.
fn fill(path: &Path) -> std::io::Error {
    let piece = vec![0x5au8; 1 << 20];
    let mut f = match File::create(path) {
        Ok(f) => f,
        Err(e) => return e,
    };
    for _ in 0..1024 {
        if let Err(e) = f.write_all(&piece) {
            return e;
        }
    }
    match f.sync_all() {
        Err(e) => e,
        Ok(()) => panic!("1 GiB fitted on a small disk"),
    }
}

fn write_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// What an operation answered: Ok or its errno.
fn outcome(r: std::io::Result<()>) -> Result<(), i32> {
    r.map_err(|e| errno(&e))
}

#[test]
fn full_disk_answers_enospc_and_never_undoes_an_acknowledged_operation() {
    let test = "full_disk_answers_enospc_and_never_undoes_an_acknowledged_operation";
    if !fuse_or_skip(test) || !common::fuse_only(test, "what a full disk does to `agentfs mount`") {
        return;
    }
    let mut d = SmallDisk::new(16, &[]);
    let mnt = d.m.mnt.clone();
    let p = |rel: &str| mnt.join(rel);
    fs::create_dir(p("keep")).unwrap();
    for i in 0..4 {
        write_file(&p(&format!("keep/f{i}")), format!("file {i}\n").as_bytes()).unwrap();
    }

    // Writers get ENOSPC, not another errno.
    let e = fill(&p("big"));
    assert_eq!(errno(&e), libc::ENOSPC, "filling the disk failed with {e}");

    // On the full disk: creates and mkdirs either happen or fail with ENOSPC; removals happen.
    // The refusal that ended the fill may have handed space back (the WAL folded into the
    // main file), so small creates go on until they too meet the reserve.
    let mut created = Vec::new();
    let mut refused = 0;
    for i in 0..5000 {
        let name = format!("new{i}");
        match outcome(write_file(&p(&name), b"x")) {
            Ok(()) => created.push(name),
            Err(e) => {
                assert_eq!(e, libc::ENOSPC, "create {name}");
                refused += 1;
            }
        }
        let dir = format!("dir{i}");
        match outcome(fs::create_dir(p(&dir))) {
            Ok(()) => created.push(dir),
            Err(e) => {
                assert_eq!(e, libc::ENOSPC, "mkdir {dir}");
                refused += 1;
            }
        }
        if refused >= 4 {
            break;
        }
    }
    assert!(
        refused >= 4,
        "the disk is not full: {} creates succeeded",
        created.len()
    );
    fs::remove_file(p("keep/f0")).expect("rm on a full disk");
    fs::remove_file(p("keep/f1")).expect("rm on a full disk");

    // An offline rm on the full disk works too.
    let out = agentfs(&["fs", d.m.db.to_str().unwrap(), "rm", "/keep/f2"]);
    assert!(
        out.status.success(),
        "agentfs fs rm on a full disk: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Deleting frees space: writes work again, without a remount.
    fs::remove_file(p("big")).expect("rm big");
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    write_file(&p("after"), &data).expect("write after deleting");
    fs::create_dir(p("after-dir")).expect("mkdir after deleting");

    // Everything answered with success is in the database, and nothing else came back.
    d.m.unmount();
    d.m.mount();
    for name in &created {
        assert!(p(name).exists(), "{name} was acknowledged, then lost");
    }
    for gone in ["keep/f0", "keep/f1", "keep/f2", "big"] {
        assert!(!p(gone).exists(), "{gone} was removed, then came back");
    }
    assert_eq!(fs::read(p("keep/f3")).unwrap(), b"file 3\n");
    assert_eq!(fs::read(p("after")).unwrap(), data);
    assert!(p("after-dir").is_dir());
    d.m.unmount();
    common::assert_consistent(&d.m.db);
}

/// With little space left (below `AGENTFS_SPACE_LOW_MIB`) the WAL is checkpointed at SQLite's
/// own 1,000 pages, not at `AGENTFS_WAL_CHECKPOINT_PAGES` (16,000 by default, more than this
/// disk holds): it stays near 4 times that bound while 20 MiB are written, and everything reads
/// back after a remount.
#[test]
fn with_little_space_left_the_wal_stays_short() {
    let test = "with_little_space_left_the_wal_stays_short";
    if !fuse_or_skip(test) || !common::fuse_only(test, "what a full disk does to `agentfs mount`") {
        return;
    }
    let mut d = SmallDisk::new(48, &[]);
    let wal = PathBuf::from(format!("{}-wal", d.m.db.display()));
    let mut most = 0;
    let mut expect = Vec::new();
    for i in 0..20u32 {
        let data: Vec<u8> = (0..1u32 << 20).map(|b| ((b ^ i) % 251) as u8).collect();
        write_file(&d.m.path(&format!("f{i}")), &data).unwrap();
        expect.push(data);
        most = most.max(fs::metadata(&wal).map_or(0, |md| md.len()));
    }
    // 4,000 pages of 4 KiB and a 24-byte header each, plus what commits while a checkpoint
    // runs (a file's transaction is under 300 pages).
    let bound = (4 * 1000 + 3 * 300) * (4096 + 24);
    assert!(
        most <= bound,
        "the WAL reached {most} bytes on a nearly full disk"
    );
    d.m.unmount();
    d.m.mount();
    for (i, data) in expect.iter().enumerate() {
        assert_eq!(&fs::read(d.m.path(&format!("f{i}"))).unwrap(), data, "f{i}");
    }
    d.m.unmount();
    common::assert_consistent(&d.m.db);
}

#[test]
fn full_disk_data_writes_fail_where_they_happen() {
    let test = "full_disk_data_writes_fail_where_they_happen";
    if !fuse_or_skip(test) || !common::fuse_only(test, "what a full disk does to `agentfs mount`") {
        return;
    }
    // Without the kernel's writeback cache every WRITE is answered by the server: once the
    // disk is full a write(2) itself fails with ENOSPC, and every byte written before it is
    // stored.
    let mut d = SmallDisk::new(16, &[("AGENTFS_FUSE_WRITEBACK_CACHE", "0")]);
    let path = d.m.path("big");
    let mut f = File::create(&path).unwrap();
    let piece = vec![0xa5u8; 256 << 10];
    let mut written = 0u64;
    let err = loop {
        match f.write_all(&piece) {
            Ok(()) => written += piece.len() as u64,
            Err(e) => break e,
        }
        assert!(written < 64 << 20, "64 MiB fitted on a 16 MiB disk");
    };
    assert_eq!(errno(&err), libc::ENOSPC, "write failed with {err}");
    drop(f);
    d.m.unmount();
    d.m.mount();
    let stored = fs::read(&path).unwrap();
    assert!(
        stored.len() as u64 >= written,
        "{written} bytes were acknowledged, {} are stored",
        stored.len()
    );
    let lost = stored[..written as usize]
        .iter()
        .filter(|b| **b != 0xa5)
        .count();
    assert_eq!(lost, 0, "acknowledged bytes were lost");
    d.m.unmount();
    common::assert_consistent(&d.m.db);
}

/// Bytes the database takes on its filesystem: the main file and the WAL.
fn db_bytes(db: &Path) -> u64 {
    let wal = PathBuf::from(format!("{}-wal", db.display()));
    [db.to_path_buf(), wal]
        .iter()
        .map(|p| fs::metadata(p).map_or(0, |m| m.len()))
        .sum()
}

#[test]
fn space_comes_back_after_deleting() {
    let test = "space_comes_back_after_deleting";
    if !fuse_or_skip(test) || !common::fuse_only(test, "what a full disk does to `agentfs mount`") {
        return;
    }
    let mut m = Mounted::unmounted();
    let out = agentfs(&["init", m.db.to_str().unwrap()]);
    assert!(out.status.success());
    m.mount();
    let piece: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 % 253) as u8).collect();
    for i in 0..40 {
        write_file(&m.path(&format!("f{i}")), &piece).unwrap();
    }
    let high = db_bytes(&m.db);
    assert!(high >= 40 << 20, "40 MiB written, database is {high} bytes");
    for i in 0..40 {
        fs::remove_file(m.path(&format!("f{i}"))).unwrap();
    }
    write_file(&m.path("small"), b"still here").unwrap();

    // While mounted: once the server is idle it hands the free pages back.
    let deadline = Instant::now() + Duration::from_secs(20);
    while db_bytes(&m.db) > 8 << 20 {
        assert!(
            Instant::now() < deadline,
            "database still {} bytes 20 s after deleting 40 MiB",
            db_bytes(&m.db)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = agentfs(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("FREE"),
        "status shows no free-page share:\n{text}"
    );
    m.unmount();
    let after = fs::metadata(&m.db).unwrap().len();
    assert!(
        after < 4 << 20,
        "after unmount the database is {after} bytes"
    );
    m.mount();
    assert_eq!(fs::read(m.path("small")).unwrap(), b"still here");
    m.unmount();
    common::assert_consistent(&m.db);
}

/// A project whose delta runs out of space in a sandbox: the write fails with ENOSPC, the
/// project is marked in `status` (text and JSON, with the time) beyond the sandbox's life, what
/// was committed before stays, and a successful apply (the promotion) clears the mark.
#[test]
fn a_project_out_of_space_is_marked_in_status_until_applied() {
    if !fuse_or_skip("a_project_out_of_space_is_marked_in_status_until_applied") {
        return;
    }
    out_of_space_until_applied(None);
}

/// [`a_project_out_of_space_is_marked_in_status_until_applied`] as an ordinary user (the tmpfs
/// mounted by root and given to the user).
#[test]
fn a_project_out_of_space_is_marked_in_status_until_applied_as_a_user() {
    if !fuse_or_skip("a_project_out_of_space_is_marked_in_status_until_applied_as_a_user") {
        return;
    }
    out_of_space_until_applied(Some(common::world::USER));
}

fn out_of_space_until_applied(user: Option<u32>) {
    use common::world::{err, launched, World};
    let w = World::new(user);
    let _disk = Tmpfs::new(&w.root(), 16);
    w.own(&w.root());
    let src = w.source("src-full");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    launched(&w.af(&["init", "full", "--source", &s(&src)]));
    launched(&w.af(&[
        "exec",
        "full",
        "--",
        "sh",
        "-c",
        &format!("echo kept > {}/kept", s(&src)),
    ]));
    let status = |w: &World| {
        let out = w.af(&["status", "full", "--json"]);
        assert!(out.status.success(), "{}", err(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["projects"][0].clone()
    };
    assert_eq!(
        status(&w)["capacity_exhausted_since"],
        serde_json::Value::Null
    );
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let out = w.af(&[
        "exec",
        "full",
        "--",
        "sh",
        "-c",
        &format!(
            "dd if=/dev/zero of={}/big bs=1M count=64 conv=fsync 2>&1; echo dd=$?",
            s(&src)
        ),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("No space left on device"), "{text}");
    assert!(!text.contains("dd=0"), "{text}");
    // On overlayfs the write filled the upper directory beside the database, so the import at
    // the run's end fails for lack of space: named so, and the upper stays the project's truth.
    let upper = w.root().join("full").join("upper");
    let overlayfs = common::backend() == "overlayfs";
    if overlayfs {
        assert!(err(&out).contains("capacity_exhausted"), "{}", err(&out));
        assert!(!err(&out).contains("upper_failed"), "{}", err(&out));
        assert!(upper.is_dir(), "the upper is gone after a failed import");
        // Applying the delta without the upper's changes would promote less than the run
        // did: refused, and the mark stays.
        let out = w.af(&["apply", "full"]);
        assert!(
            !out.status.success(),
            "apply promoted a delta whose changes are in the upper"
        );
        assert!(err(&out).contains("capacity_exhausted"), "{}", err(&out));
    }
    // The sandbox and its server are gone; the mark stays.
    let p = status(&w);
    let since = p["capacity_exhausted_since"].as_u64().expect("marked");
    assert!(since >= before.saturating_sub(1), "{p}");
    assert_eq!(p["live"], false);
    let text = String::from_utf8_lossy(&w.af(&["status", "full"]).stdout).into_owned();
    assert!(text.contains("DIRTY: out of space since"), "{text}");
    // Nothing committed before was lost.
    let out = w.af(&["exec", "full", "--", "cat", &s(&src.join("kept"))]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept\n");
    // Promoting (here after dropping the partial file) clears the mark. On overlayfs the run
    // that drops it works on the left-over upper, and its end takes the upper in.
    let out = w.af(&["exec", "full", "--", "rm", "-f", &s(&src.join("big"))]);
    launched(&out);
    if overlayfs {
        assert!(err(&out).contains("capacity_exhausted"), "{}", err(&out));
        assert!(!upper.exists(), "the upper stayed after space came back");
    }
    launched(&w.af(&["apply", "full"]));
    assert_eq!(fs::read_to_string(src.join("kept")).unwrap(), "kept\n");
    assert_eq!(
        status(&w)["capacity_exhausted_since"],
        serde_json::Value::Null
    );
    let text = String::from_utf8_lossy(&w.af(&["status", "full"]).stdout).into_owned();
    assert!(!text.contains("DIRTY"), "{text}");
}

/// An upper directory an overlayfs run left that the delta has no room to take in: the upper
/// stays, the project is marked, and once there is room the next launch takes it in. A FUSE
/// launch cannot serve it and refuses with `capacity_exhausted` (not `upper_failed`); an
/// overlayfs launch runs over it with a warning, and a checkpoint there fails.
#[test]
fn an_upper_the_delta_has_no_room_for_waits_for_space() {
    if !fuse_or_skip("an_upper_the_delta_has_no_room_for_waits_for_space") {
        return;
    }
    use common::world::{err, launched, World};
    let w = World::new(None);
    let _disk = Tmpfs::new(&w.root(), 16);
    let src = w.source("src-left");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    launched(&w.af(&["init", "left", "--source", &s(&src)]));
    launched(&w.af(&["exec", "left", "--", "true"]));
    // What an overlayfs run that filled the disk leaves: an upper as big as the room left,
    // but for the little the delta needs to open.
    let upper = w.root().join("left").join("upper");
    fs::create_dir(&upper).unwrap();
    let big = upper.join("big");
    let e = fill(&big);
    assert_eq!(errno(&e), libc::ENOSPC, "filling the disk failed with {e}");
    let len = fs::metadata(&big).unwrap().len();
    let shrink = |to: u64| {
        let f = File::options().write(true).open(&big).unwrap();
        f.set_len(to).unwrap();
    };
    shrink(len.saturating_sub(256 << 10));
    let bind = format!("{}:/tmp/agentfs", common::bin().display());
    let script = "/tmp/agentfs checkpoint; echo checkpoint=$?";
    let out = w.af(&["run", "left", "--ro-bind", &bind, "--", "sh", "-c", script]);
    assert!(!out.status.success(), "the upper was not taken in");
    assert!(err(&out).contains("capacity_exhausted"), "{}", err(&out));
    assert!(!err(&out).contains("upper_failed"), "{}", err(&out));
    if common::backend() == "overlayfs" {
        // The command ran over the upper; a checkpoint cannot take the upper in (here its
        // watcher cannot even start on the full disk) and never says it did.
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("checkpoint="), "{text}: {}", err(&out));
        assert!(!text.contains("checkpoint=0"), "{text}: {}", err(&out));
    } else {
        assert!(
            out.stdout.is_empty(),
            "launched over an upper it could not take in"
        );
    }
    assert!(big.is_file(), "the upper was lost");
    let text = String::from_utf8_lossy(&w.af(&["status", "left"]).stdout).into_owned();
    assert!(text.contains("DIRTY: out of space since"), "{text}");
    // Whatever would change the delta first takes the upper in, and there is no room: refused
    // as `capacity_exhausted`, the upper kept; discard without --force refuses to lose it.
    let other = match common::backend() {
        "overlayfs" => "fuse",
        _ => "overlayfs",
    };
    for verb in [
        &["undo", "left"][..],
        &["apply", "left"],
        &["convert", "left", "--to", other],
    ] {
        let out = w.af(verb);
        assert!(!out.status.success(), "{verb:?} went on without the upper");
        assert!(
            err(&out).contains("capacity_exhausted"),
            "{verb:?}: {}",
            err(&out)
        );
        assert!(big.is_file(), "{verb:?} lost the upper");
    }
    let out = w.af(&["discard", "left"]);
    assert!(err(&out).contains("unapplied_changes"), "{}", err(&out));
    assert!(big.is_file(), "discard lost the upper");
    // Room again (the file shrinks): the next launch takes the upper in and serves it.
    shrink(5);
    let out = w.af(&[
        "exec",
        "left",
        "--",
        "stat",
        "-c",
        "%s",
        &s(&src.join("big")),
    ]);
    launched(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "5\n");
    assert!(!upper.exists(), "the upper stayed after it was taken in");
}
