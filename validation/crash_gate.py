#!/usr/bin/env python3
"""Crash-consistency gate for AgentFS: SIGKILL the server under load, remount,
verify that fsynced data survived exactly and nothing else came back as garbage.

    python3 validation/crash_gate.py --agentfs PATH_TO_BINARY [--rounds N]
                                     [--workdir DIR] [--writers W] [--seed S]

CLI contract assumed of the binary (see README-style notes at the bottom of
this docstring):

    agentfs init DB            create a new database file DB (exit 0)
    agentfs mount DB MNT -f    serve DB at MNT in the foreground; this process
                               IS the server. The mount is live once
                               os.path.ismount(MNT) is true (polled <= 10 s).
    agentfs umount MNT         unmount cleanly; the foreground server then exits
    agentfs integrity DB       consistency check: exit 0 clean, 1 findings,
                               2 could not check

Per round:
  1. start `agentfs mount DB MNT -f` (a subprocess we own by pid), wait for
     the mount, create MNT/rNNN/wK for each writer and fsync those dirs;
  2. fork W writer processes. Each loops over random operations on its own
     directory and keeps a journal OUTSIDE the mount (one JSON object per
     line, fsynced after every record):
       intent   {name, cid, size}  written BEFORE creating/overwriting `name`
                with content(cid, size); so every name that can exist in the
                mount is journaled first;
       durable  {name, cid, size, sha256}  written AFTER fsync(file) and
                fsync(dir) returned. A durable file is never touched again
                (fresh names only), which keeps the rule simple;
       rename / unlink / truncate  written BEFORE the operation (only ever
                applied to non-durable files);
       error    an unexpected error, with the CLOCK_MONOTONIC time.
  3. after a random 0.5-3 s, SIGKILL the server. Writers now get ENOTCONN
     and exit; any still alive after a grace period are SIGKILLed (and the
     FUSE connection is aborted via fusectl if they are stuck).
  4. clean the dead mount (`umount -l`, fusectl abort if needed), run
     PRAGMA integrity_check on a COPY of DB (+ -wal) with Python's sqlite3,
     and `agentfs integrity DB`;
  5. remount and verify:
       * every durable file exists with exactly its journaled size and sha256;
       * every other file in MNT/rNNN is a name some intent/rename journaled
         and its content is empty or a clean prefix of content(cid, size) for
         one of the cids that name could hold (never garbage, never longer);
       * no unexpected names or file types appear;
       * no writer reported an error before the kill;
       * every earlier round's directory is exactly as it was when that round
         was verified ("settled" snapshot): later crashes must not damage it.
  6. `agentfs umount MNT` and wait for the server to exit.

Servers inherit this process's environment, so AGENTFS_* knobs select the mode under test
(e.g. AGENTFS_BATCH=0 for one transaction per WRITE, AGENTFS_BATCH_WINDOW_MS=2000 to keep
most acknowledged bytes pending at the kill); the first output line names them.

Output: one summary line per round, then "N passed, M failed" (rounds).
Exit status non-zero on any failure. Everything started is killed and every
mount made is removed on exit (finally blocks + atexit + SIGTERM/SIGINT).

For a self-test without AgentFS use validation/fake_agentfs.py, which serves
a bind mount of a plain directory with the same CLI:
    python3 validation/crash_gate.py --agentfs validation/fake_agentfs.py --rounds 3

Standard library only.
"""

import argparse
import atexit
import errno
import hashlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

KiB = 1024
MAX_FILE = 300 * KiB
MOUNT_TIMEOUT = 10.0
WRITER_GRACE = 5.0

# --------------------------------------------------------------------------
# Deterministic content
# --------------------------------------------------------------------------


def content(cid, size):
    """The intended bytes of content id `cid` (a str like "r003w1n17#0").

    Derived only from (cid, size); every truncation/partial write of this
    content is a prefix of it.
    """
    n = (size + 3) // 4 * 4  # randbytes is deterministic for whole 32-bit words
    return random.Random(cid).randbytes(n)[:size]


def sha(data):
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------
# Process / mount bookkeeping (everything here is undone at exit)
# --------------------------------------------------------------------------

STARTED_PIDS = set()     # writer processes and servers we started
SERVERS = {}             # pid -> Popen
MOUNTS = set()           # mount points we may have left mounted
AGENTFS = None           # argv prefix for the binary


def log(msg):
    print(msg, flush=True)


def run(argv, timeout=30):
    """Run a helper command; returns (rc, combined output). Never raises on
    a non-zero exit; rc is None on timeout/exec failure."""
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        return p.returncode, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired:
        return None, "timed out after %ss" % timeout
    except OSError as e:
        return None, str(e)


def mountinfo_entry(mnt):
    """(major, minor, fstype) of the mount at mnt, from /proc/self/mountinfo,
    without touching the (possibly dead) mount itself. None if not mounted.
    The last (topmost) matching entry wins."""
    mnt = os.path.realpath(mnt)
    found = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                point = fields[4].encode().decode("unicode_escape")  # \040 etc.
                if point == mnt:
                    major, minor = fields[2].split(":")
                    found = (int(major), int(minor), right.split()[0])
    except OSError:
        pass
    return found


def is_mounted(mnt):
    return mountinfo_entry(mnt) is not None


def abort_fuse_connection(mnt):
    """Abort the FUSE connection behind mnt via fusectl (unsticks waiters)."""
    ent = mountinfo_entry(mnt)
    if ent is None or not ent[2].startswith("fuse"):
        return False
    conn_dir = "/sys/fs/fuse/connections"
    if os.path.isdir(conn_dir) and not os.listdir(conn_dir):
        run(["mount", "-t", "fusectl", "none", conn_dir], timeout=10)
    abort = os.path.join(conn_dir, str(ent[1]), "abort")
    try:
        with open(abort, "w") as f:
            f.write("1")
        return True
    except OSError:
        return False


def force_unmount(mnt):
    """Get rid of a (possibly dead) mount at mnt. Returns True if gone."""
    for attempt in range(3):
        if not is_mounted(mnt):
            return True
        if attempt > 0:
            abort_fuse_connection(mnt)
        run(["umount", "-l", mnt], timeout=10)
        if attempt > 0:
            run(["fusermount", "-uz", mnt], timeout=10)
        time.sleep(0.2)
    return not is_mounted(mnt)


def kill_pid(pid, sig=signal.SIGKILL):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def reap(pid, timeout):
    """Wait up to timeout for pid (a child of ours). Returns wait status or None."""
    end = time.monotonic() + timeout
    while True:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            STARTED_PIDS.discard(pid)
            return 0
        if got:
            STARTED_PIDS.discard(pid)
            return status
        if time.monotonic() >= end:
            return None
        time.sleep(0.05)


def cleanup_everything():
    """Kill every process we started and remove every mount we made."""
    for pid in list(STARTED_PIDS):
        kill_pid(pid)
    for p in list(SERVERS.values()):
        try:
            p.kill()
        except OSError:
            pass
    for pid in list(STARTED_PIDS):
        if reap(pid, 2) is None:
            for mnt in list(MOUNTS):
                abort_fuse_connection(mnt)
            reap(pid, 3)
    for p in list(SERVERS.values()):
        try:
            p.wait(timeout=3)
        except Exception:
            pass
    SERVERS.clear()
    for mnt in list(MOUNTS):
        if force_unmount(mnt):
            MOUNTS.discard(mnt)
        else:
            print("WARNING: could not unmount %s" % mnt, file=sys.stderr)


def _on_signal(signum, frame):
    raise SystemExit(128 + signum)


# --------------------------------------------------------------------------
# Server control
# --------------------------------------------------------------------------


def start_server(db, mnt, logpath):
    """Start `agentfs mount DB MNT -f` and wait for the mount. Returns Popen."""
    logf = open(logpath, "ab")
    try:
        p = subprocess.Popen(AGENTFS + ["mount", db, mnt, "-f"], stdout=logf, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        logf.close()
    SERVERS[p.pid] = p
    MOUNTS.add(mnt)
    end = time.monotonic() + MOUNT_TIMEOUT
    while time.monotonic() < end:
        # os.path.ismount is the contract; mountinfo also catches bind mounts
        # (same st_dev), which the fake_agentfs.py self-test uses.
        if os.path.ismount(mnt) or is_mounted(mnt):
            return p
        if p.poll() is not None:
            raise RuntimeError("server exited with %s before mounting; log: %s"
                               % (p.returncode, tail(logpath)))
        time.sleep(0.05)
    raise RuntimeError("mount not live after %.0fs; log: %s" % (MOUNT_TIMEOUT, tail(logpath)))


def kill_server(p):
    p.kill()  # SIGKILL: the crash under test
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    SERVERS.pop(p.pid, None)


def stop_server_cleanly(p, mnt):
    """`agentfs umount MNT`, then the server must exit by itself."""
    problems = []
    rc, out = run(AGENTFS + ["umount", mnt], timeout=30)
    if rc != 0:
        problems.append("agentfs umount failed (rc %s): %s" % (rc, out.strip()[-300:]))
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        problems.append("server still running 10s after umount")
        p.kill()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    SERVERS.pop(p.pid, None)
    if p.returncode not in (0, None) and not problems:
        problems.append("server exited with %s after clean umount" % p.returncode)
    if is_mounted(mnt):
        problems.append("still mounted after agentfs umount")
        force_unmount(mnt)
    if not is_mounted(mnt):
        MOUNTS.discard(mnt)
    return problems


def tail(path, n=600):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace").strip().replace("\n", " | ")
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------
# Writer processes
# --------------------------------------------------------------------------


class Journal:
    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def rec(self, **kw):
        line = (json.dumps(kw, sort_keys=True) + "\n").encode()
        os.write(self.fd, line)  # one write() per record: a kill can only tear the last line
        os.fsync(self.fd)


def _write_chunks(fd, data, start, rng):
    off = start
    while off < len(data):
        n = rng.choice((1, 511, 4096, 4097, 65536, 100000))
        view = memoryview(data)[off:off + n]
        while view:
            w = os.write(fd, view)
            view = view[w:]
            off += w


def writer_main(wdir, journal_path, seed, prefix, fsync_dir=True):
    """Loop of random file operations in wdir until killed or the FS fails."""
    rng = random.Random(seed)
    j = Journal(journal_path)
    volatile = {}   # name -> [cid, size, current_len]; never fsynced, may be mutated
    seq = 0
    op = "start"
    dfd = os.open(wdir, os.O_RDONLY | os.O_DIRECTORY)

    def fresh():
        nonlocal seq
        seq += 1
        return "%sn%d" % (prefix, seq)

    try:
        while True:
            r = rng.random()
            if r < 0.45 or not volatile:
                op = "create"
                name = fresh()
                size = rng.choice((0, 1, 4095, 4096, 4097, 65536, 65537,
                                   rng.randrange(MAX_FILE + 1), rng.randrange(MAX_FILE + 1)))
                cid = name + "#0"
                data = content(cid, size)
                durable = rng.random() < 0.5
                # Volatile files are sometimes left half-written, to be continued.
                upto = size if durable or rng.random() < 0.6 else rng.randrange(size + 1)
                j.rec(op="intent", name=name, cid=cid, size=size)
                path = os.path.join(wdir, name)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    _write_chunks(fd, data[:upto], 0, rng)
                    if durable:
                        op = "fsync"
                        os.fsync(fd)
                finally:
                    os.close(fd)
                if durable:
                    if fsync_dir:
                        os.fsync(dfd)
                    j.rec(op="durable", name=name, cid=cid, size=size, sha256=sha(data))
                else:
                    volatile[name] = [cid, size, upto]
                continue
            name = rng.choice(sorted(volatile))
            cid, size, cur = volatile[name]
            path = os.path.join(wdir, name)
            if r < 0.60:
                op = "overwrite"
                gen = int(cid.rsplit("#", 1)[1]) + 1
                cid, size = "%s#%d" % (name, gen), rng.randrange(MAX_FILE + 1)
                j.rec(op="intent", name=name, cid=cid, size=size)
                fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
                try:
                    _write_chunks(fd, content(cid, size), 0, rng)
                finally:
                    os.close(fd)
                volatile[name] = [cid, size, size]
            elif r < 0.70:
                op = "continue"
                j.rec(op="continue", name=name, cid=cid, frm=cur)
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
                try:
                    _write_chunks(fd, content(cid, size), cur, rng)
                finally:
                    os.close(fd)
                volatile[name][2] = size
            elif r < 0.80:
                op = "truncate"
                new = rng.randrange(cur + 1)
                j.rec(op="truncate", name=name, to=new)
                os.truncate(path, new)
                volatile[name][2] = new
            elif r < 0.90:
                op = "rename"
                dst = fresh()
                j.rec(op="rename", src=name, dst=dst)
                os.rename(path, os.path.join(wdir, dst))
                volatile[dst] = volatile.pop(name)
            else:
                op = "unlink"
                j.rec(op="unlink", name=name)
                os.unlink(path)
                del volatile[name]
    except OSError as e:
        # Expected once the server is gone (ENOTCONN/ECONNABORTED); the gate
        # decides from the timestamp whether it happened before the kill.
        j.rec(op="error", t=time.monotonic(), errno=e.errno, msg=str(e), during=op)


def start_writer(wdir, journal_path, seed, prefix, fsync_dir):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            writer_main(wdir, journal_path, seed, prefix, fsync_dir)
        except BaseException:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)  # never run the gate's atexit/finally in a writer
    STARTED_PIDS.add(pid)
    return pid


# --------------------------------------------------------------------------
# Journal model and verification
# --------------------------------------------------------------------------


def read_journal(path):
    recs = []
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return recs
    for line in data.split(b"\n")[:-1]:  # a torn last line (no newline) is ignored
        recs.append(json.loads(line))
    return recs


class Model:
    """What may exist in one writer directory after a crash."""

    def __init__(self, recs):
        self.allowed = {}   # name -> {cid: size}: contents the name may hold
        self.durable = {}   # name -> (size, sha256)
        self.errors = []    # error records
        for r in recs:
            op = r["op"]
            if op == "intent":
                self.allowed.setdefault(r["name"], {})[r["cid"]] = r["size"]
            elif op == "durable":
                self.durable[r["name"]] = (r["size"], r["sha256"])
            elif op == "rename":
                # The destination may hold anything the source could hold; the
                # source keeps its possibilities (the rename may be lost).
                self.allowed.setdefault(r["dst"], {}).update(self.allowed.get(r["src"], {}))
            elif op == "error":
                self.errors.append(r)
            # unlink/truncate/continue: absence and prefixes are always allowed.


def classify(name, data, model):
    """Return (ok, kind) for a file found in the mount."""
    if name in model.durable:
        size, digest = model.durable[name]
        if len(data) == size and sha(data) == digest:
            return True, "durable"
        return False, "durable file %s has %d bytes (sha %s), journal says %d bytes (sha %s)" % (
            name, len(data), sha(data)[:12], size, digest[:12])
    cands = model.allowed.get(name)
    if cands is None:
        return False, "unexpected name %s (never journaled)" % name
    if not data:
        return True, "empty"
    for cid, size in cands.items():
        if len(data) <= size and content(cid, size)[:len(data)] == data:
            return True, "complete" if len(data) == size else "prefix"
    return False, "%s: %d bytes that are not a prefix of any of its %d journaled contents %s (%s)" % (
        name, len(data), len(cands), sorted(cands)[:4], explain(data, cands))


def explain(data, cands):
    """Where `data` departs from each candidate content, and what its tail matches then."""
    out = []
    for cid, size in sorted(cands.items())[:4]:
        want = content(cid, size)
        n = 0
        while n < min(len(data), len(want)) and data[n] == want[n]:
            n += 1
        tail = data[n:]
        what = "zeros" if tail and not tail.strip(b"\0") else None
        for other, osize in cands.items():
            if what is None and other != cid and content(other, osize)[n:len(data)] == tail:
                what = other
        out.append("%s matches %d bytes, then %s" % (cid, n, what or "unknown bytes"))
    return "; ".join(out)


def snapshot(root):
    """{relative path: ('f', sha) | ('d',) | ('other', mode)} of a tree."""
    snap = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        snap[rel] = ("d",)
        for n in filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    snap[os.path.join(rel, n)] = ("f", sha(f.read()))
            else:
                snap[os.path.join(rel, n)] = ("other", st.st_mode)
    return snap


def verify_round(mnt, rdir_name, nwriters, journal_paths, kill_t):
    """Check one round's directory against the writers' journals."""
    problems = []
    stats = {"durable": 0, "complete": 0, "prefix": 0, "empty": 0, "absent": 0}
    rdir = os.path.join(mnt, rdir_name)
    if not os.path.isdir(rdir):
        return ["round directory %s missing (it was fsynced)" % rdir_name], stats
    for k in range(nwriters):
        model = Model(read_journal(journal_paths[k]))
        for e in model.errors:
            if e["t"] < kill_t:
                problems.append("writer %d: %s during %s BEFORE the kill (%.2fs early): %s" % (
                    k, errno.errorcode.get(e["errno"], e["errno"]), e["during"], kill_t - e["t"], e["msg"]))
        wdir = os.path.join(rdir, "w%d" % k)
        if not os.path.isdir(wdir):
            problems.append("writer dir w%d missing (it was fsynced)" % k)
            continue
        present = set()
        for name in sorted(os.listdir(wdir)):
            p = os.path.join(wdir, name)
            st = os.lstat(p)
            if not os.path.isfile(p) or os.path.islink(p):
                problems.append("w%d/%s is not a regular file (mode %o)" % (k, name, st.st_mode))
                continue
            present.add(name)
            with open(p, "rb") as f:
                data = f.read()
            if len(data) != st.st_size:
                problems.append("w%d/%s: read %d bytes but st_size is %d" % (k, name, len(data), st.st_size))
            ok, kind = classify(name, data, model)
            if ok:
                stats[kind] += 1
            else:
                problems.append("w%d/%s" % (k, kind))
        for name in sorted(set(model.durable) - present):
            problems.append("w%d: durable file %s is missing" % (k, name))
        stats["absent"] += len(set(model.allowed) - present - set(model.durable))
    return problems, stats


# --------------------------------------------------------------------------
# Database checks
# --------------------------------------------------------------------------


def integrity_check(db, scratch):
    """PRAGMA integrity_check on a copy of DB (+WAL), leaving the original
    exactly as the crash left it for AgentFS's own recovery."""
    os.makedirs(scratch, exist_ok=True)
    copy = os.path.join(scratch, "check.db")
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.unlink(copy + suffix)
        except FileNotFoundError:
            pass
    if not os.path.exists(db):
        return "database file %s does not exist" % db
    shutil.copyfile(db, copy)
    for suffix in ("-wal", "-journal"):  # -shm is rebuilt from the WAL
        if os.path.exists(db + suffix):
            shutil.copyfile(db + suffix, copy + suffix)
    try:
        con = sqlite3.connect(copy, timeout=30)
        try:
            rows = con.execute("PRAGMA integrity_check").fetchall()
        finally:
            con.close()
    except sqlite3.Error as e:
        return "sqlite error: %s" % e
    if rows != [("ok",)]:
        return "integrity_check: %s" % "; ".join(str(r[0]) for r in rows[:5])
    return None


def agentfs_check(db, after_crash=False):
    """Returns (status, detail): status 'ok', 'orphans' or 'fail'. `agentfs integrity` exits 0
    when clean, 1 with findings, 2 when it could not check.

    After a crash, `orphan` findings (nlink 0, no names) are legal: an inode unlinked while the
    kernel still referenced it keeps its rows until its last FORGET, and a kill in between
    leaves it for the next mount to reap (SPEC "Runtime invariants"). Any other rule fails."""
    rc, out = run(AGENTFS + ["integrity", db], timeout=300)
    if rc == 0:
        return "ok", ""
    if rc == 1 and after_crash:
        lines = [l for l in out.strip().splitlines() if l.strip()]
        findings = [l for l in lines if not l.rstrip().endswith("finding(s)")]
        if findings and all(l.startswith("orphan:") for l in findings):
            return "orphans", "%d orphan(s) left by the kill" % len(findings)
    return "fail", "agentfs integrity rc %s: %s" % (rc, out.strip()[-400:])


# --------------------------------------------------------------------------
# Main loop
# --------------------------------------------------------------------------


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def one_round(r, args, db, mnt, work, settled):
    """Run round r; returns (problems, summary text)."""
    problems = []
    rname = "r%03d" % r
    jdir = os.path.join(work, "journal")
    os.makedirs(jdir, exist_ok=True)
    journals = [os.path.join(jdir, "%s-w%d.log" % (rname, k)) for k in range(args.writers)]
    srv = start_server(db, mnt, os.path.join(work, "server.log"))
    writers = []
    try:
        # Verify that earlier rounds' data survived this mount.
        for old, snap in settled.items():
            now = snapshot(os.path.join(mnt, old))
            if now != snap:
                diff = sorted(set(k for k in set(now) | set(snap) if now.get(k) != snap.get(k)))
                problems.append("settled round %s changed: %s" % (old, diff[:5]))
        rdir = os.path.join(mnt, rname)
        os.mkdir(rdir)
        for k in range(args.writers):
            os.mkdir(os.path.join(rdir, "w%d" % k))
        fsync_path(rdir)
        fsync_path(mnt)
        rng = random.Random("%s/%d" % (args.seed, r))
        for k in range(args.writers):
            writers.append(start_writer(os.path.join(rdir, "w%d" % k), journals[k],
                                        "%s/%d/%d" % (args.seed, r, k), "%sw%d" % (rname, k),
                                        not args.file_fsync_only))
        delay = rng.uniform(args.kill_min, args.kill_max)
        time.sleep(delay)
        for k, pid in enumerate(writers):  # a writer that died early is a bug in the gate/FS
            st = reap(pid, 0)
            if st is not None and os.waitstatus_to_exitcode(st) != 0:
                problems.append("writer %d crashed before the kill (exit %s)" % (k, os.waitstatus_to_exitcode(st)))
        kill_t = time.monotonic()
        kill_server(srv)
    except BaseException:
        kill_server(srv)
        raise
    finally:
        # Writers must not hang on the dead mount: grace period, then SIGKILL,
        # then abort the FUSE connection if they are stuck in the kernel.
        for pid in writers:
            if reap(pid, WRITER_GRACE) is None:
                kill_pid(pid)
                if reap(pid, 3) is None:
                    abort_fuse_connection(mnt)
                    if reap(pid, 5) is None:
                        problems.append("writer pid %d unkillable after abort" % pid)
        if not force_unmount(mnt):
            problems.append("could not clean the dead mount")
        else:
            MOUNTS.discard(mnt)

    err = integrity_check(db, os.path.join(work, "dbcheck"))
    if err:
        problems.append(err)
    cstat, cdetail = agentfs_check(db, after_crash=True)
    if cstat == "fail":
        problems.append(cdetail)

    srv = start_server(db, mnt, os.path.join(work, "server.log"))
    try:
        vprobs, stats = verify_round(mnt, rname, args.writers, journals, kill_t)
        problems += vprobs
        settled[rname] = snapshot(os.path.join(mnt, rname))
    finally:
        problems += stop_server_cleanly(srv, mnt)
    err = integrity_check(db, os.path.join(work, "dbcheck"))
    if err:
        problems.append("after clean unmount: " + err)
    # The remount reaped the kill's orphans: after a clean unmount every rule must hold.
    c2, c2detail = agentfs_check(db)
    if c2 != "ok":
        problems.append("after clean unmount: " + c2detail)
    summary = ("killed after %.2fs; durable %d, complete %d, prefix %d, empty %d, absent %d; "
               "integrity ok%s; check %s" % (delay, stats["durable"], stats["complete"], stats["prefix"],
                                             stats["empty"], stats["absent"],
                                             "" if not err else " NOT", cstat))
    return problems, summary


def main(argv=None):
    global AGENTFS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agentfs", required=True, help="path to the agentfs binary")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--workdir", help="where DB, mount point and journals live (default: a new temp dir)")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--seed", default="crash-gate")
    ap.add_argument("--kill-min", type=float, default=0.5)
    ap.add_argument("--kill-max", type=float, default=3.0)
    ap.add_argument("--file-fsync-only", action="store_true",
                    help="writers fsync only the file, not its directory, before journaling it durable "
                         "(tests the stronger guarantee that fsync(file) also persists its name)")
    ap.add_argument("--keep", action="store_true", help="keep the workdir even if everything passed")
    args = ap.parse_args(argv)

    binary = os.path.abspath(args.agentfs)
    if not os.access(binary, os.X_OK):
        ap.error("%s is not executable" % binary)
    AGENTFS = [binary]
    made_workdir = args.workdir is None
    work = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="crash_gate."))
    os.makedirs(work, exist_ok=True)
    db = os.path.join(work, "agentfs.db")
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    if is_mounted(mnt):
        ap.error("%s is already a mount point" % mnt)

    atexit.register(cleanup_everything)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    knobs = sorted("%s=%s" % kv for kv in os.environ.items() if kv[0].startswith("AGENTFS_"))
    log("server knobs: %s" % (" ".join(knobs) or "(defaults)"))
    npass = nfail = 0
    try:
        if not os.path.exists(db):
            rc, out = run(AGENTFS + ["init", db], timeout=60)
            if rc != 0:
                log("FAIL init: agentfs init rc %s: %s" % (rc, out.strip()[-400:]))
                log("0 passed, 1 failed")
                return 1
        settled = {}
        for r in range(args.rounds):
            try:
                problems, summary = one_round(r, args, db, mnt, work, settled)
            except Exception as e:  # noqa: BLE001 - a broken round must not stop the gate
                problems, summary = ["round aborted: %s: %s" % (type(e).__name__, e)], "aborted"
                cleanup_everything()
            if problems:
                nfail += 1
                log("FAIL round %d: %s" % (r, summary))
                for p in problems[:20]:
                    log("    " + p)
                if len(problems) > 20:
                    log("    ... %d more" % (len(problems) - 20))
            else:
                npass += 1
                log("PASS round %d: %s" % (r, summary))
    finally:
        cleanup_everything()
    log("%d passed, %d failed" % (npass, nfail))
    if nfail == 0 and made_workdir and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    elif nfail:
        log("workdir kept for inspection: %s" % work)
    return 0 if nfail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
