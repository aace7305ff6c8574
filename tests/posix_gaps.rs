//! POSIX behaviour ext4 has and a FUSE server must provide itself, through a real mount:
//! O_TMPFILE (FUSE_TMPFILE) and the blocks fallocate reserves.

mod common;

use std::ffi::CString;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{fuse_or_skip, Mounted};

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600): close-on-exec like every std open, so the
/// servers other tests start do not inherit it (and keep this mount busy).
fn tmpfile(dir: &Path) -> std::io::Result<fs::File> {
    let d = cstr(dir);
    // SAFETY: `d` is NUL-terminated and outlives the call.
    let fd = unsafe {
        libc::open(
            d.as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { fs::File::from_raw_fd(fd) })
}

/// Give the open file `f` the name `to` (linkat through /proc/self/fd, as without
/// CAP_DAC_READ_SEARCH).
fn link_open(f: &fs::File, to: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let from = cstr(Path::new(&format!("/proc/self/fd/{}", f.as_raw_fd())));
    let to = cstr(to);
    // SAFETY: both paths are NUL-terminated and outlive the call.
    let rc = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Write, read back, name it with linkat, and find the content after a remount.
fn tmpfile_round_trip(m: &mut Mounted, dir: &str) {
    let mut f = tmpfile(&m.path(dir)).expect("O_TMPFILE");
    f.write_all(b"unnamed at first\n").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut got = String::new();
    f.read_to_string(&mut got).unwrap();
    assert_eq!(got, "unnamed at first\n");
    let md = f.metadata().unwrap();
    assert_eq!(md.nlink(), 0, "an O_TMPFILE file has no name");
    assert_eq!(md.mode() & 0o7777, 0o600);
    let names = fs::read_dir(m.path(dir)).unwrap().count();
    let named = m.path(&format!("{dir}/named.txt"));
    link_open(&f, &named).expect("linkat of an O_TMPFILE file");
    assert_eq!(f.metadata().unwrap().nlink(), 1);
    f.write_all(b"and then named\n").unwrap();
    drop(f);
    assert_eq!(
        fs::read_dir(m.path(dir)).unwrap().count(),
        names + 1,
        "exactly one new name"
    );
    m.unmount();
    m.mount();
    assert_eq!(
        fs::read_to_string(&named).unwrap(),
        "unnamed at first\nand then named\n"
    );
}

#[test]
fn o_tmpfile_is_written_linked_and_kept_across_a_remount() {
    if !fuse_or_skip("o_tmpfile_is_written_linked_and_kept_across_a_remount") {
        return;
    }
    let mut m = Mounted::new();
    fs::create_dir(m.path("d")).unwrap();
    tmpfile_round_trip(&mut m, "d");
    // O_TMPFILE on something that is not a directory.
    fs::write(m.path("plain"), b"x").unwrap();
    let err = tmpfile(&m.path("plain")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR), "{err}");
    m.unmount();
    common::assert_consistent(&m.db);
}

/// A tmpfile never linked leaves no row once it is closed (the kernel forgets the inode).
#[test]
fn an_unlinked_tmpfile_leaves_no_row_after_close() {
    if !fuse_or_skip("an_unlinked_tmpfile_leaves_no_row_after_close") {
        return;
    }
    let mut m = Mounted::with_env(&[("AGENTFS_BATCH_WINDOW_MS", "20")]);
    let mut f = tmpfile(&m.mnt).expect("O_TMPFILE");
    f.write_all(&vec![7u8; 300_000]).unwrap();
    f.sync_all().unwrap();
    assert_eq!(
        common::orphans(&m.db),
        1,
        "the open tmpfile is an orphan row"
    );
    drop(f);
    let deadline = Instant::now() + Duration::from_secs(20);
    while common::orphans(&m.db) != 0 {
        assert!(
            Instant::now() < deadline,
            "the closed tmpfile was not reaped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    m.unmount();
    common::assert_consistent(&m.db);
    let c = rusqlite::Connection::open(&m.db).unwrap();
    let rows: i64 = c
        .query_row("SELECT count(*) FROM fs_data", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 0, "its data went with it");
}

/// In an overlay mount: a tmpfile in a base directory, then named, lands in the delta.
#[test]
fn o_tmpfile_in_an_overlay_base_directory() {
    if !fuse_or_skip("o_tmpfile_in_an_overlay_base_directory") {
        return;
    }
    let mut m = Mounted::unmounted();
    let base = m.dir.path().join("base");
    fs::create_dir_all(base.join("d")).unwrap();
    fs::write(base.join("d/old.txt"), b"base\n").unwrap();
    let out = common::agentfs(&[
        "init",
        m.db.to_str().unwrap(),
        "--base",
        base.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    m.mount();
    tmpfile_round_trip(&mut m, "d");
    assert_eq!(fs::read_to_string(m.path("d/old.txt")).unwrap(), "base\n");
    m.unmount();
    assert!(
        !base.join("d/named.txt").exists(),
        "the base is not written"
    );
    let diff = common::agentfs(&["diff", m.db.to_str().unwrap()]);
    assert_eq!(String::from_utf8_lossy(&diff.stdout), "A /d/named.txt\n");
}

/// fallocate reserves: st_blocks covers the range at once (ext4 does the same), the bytes
/// read as zeros, and KEEP_SIZE keeps the size.
#[test]
fn fallocate_reserves_blocks() {
    use std::os::fd::AsRawFd;
    if !fuse_or_skip("fallocate_reserves_blocks") {
        return;
    }
    let m = Mounted::new();
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.path("big"))
        .unwrap();
    // SAFETY: plain syscall on an open descriptor.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 1 << 20) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let md = f.metadata().unwrap();
    assert_eq!(md.len(), 1 << 20);
    assert!(md.blocks() >= 2048, "st_blocks {} after 1 MiB", md.blocks());
    let mut buf = Vec::new();
    (&f).read_to_end(&mut buf).unwrap();
    assert!(buf.len() == 1 << 20 && buf.iter().all(|b| *b == 0));

    // Inside a sparse file: only the range gets blocks; its stored bytes stay.
    let g = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.path("sparse"))
        .unwrap();
    g.set_len(8 << 20).unwrap();
    {
        use std::os::unix::fs::FileExt;
        g.write_all_at(b"keep", (1 << 20) + 10).unwrap();
    }
    // SAFETY: as above.
    let rc = unsafe {
        libc::fallocate(
            g.as_raw_fd(),
            libc::FALLOC_FL_KEEP_SIZE,
            1 << 20,
            (1 << 20) + 12345,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let md = g.metadata().unwrap();
    assert_eq!(md.len(), 8 << 20, "KEEP_SIZE keeps the size");
    let blocks = md.blocks();
    assert!(
        (2048 + 24..=4096 + 256).contains(&blocks),
        "st_blocks {blocks} for a reserved range of 1 MiB + 12345 bytes"
    );
    let mut got = [0u8; 4];
    {
        use std::os::unix::fs::FileExt;
        g.read_exact_at(&mut got, (1 << 20) + 10).unwrap();
    }
    assert_eq!(&got, b"keep");
    drop((f, g));
}
