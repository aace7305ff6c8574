#!/usr/bin/env python3
"""Close/flush coherence gate: what must hold whether or not close(2) sends FLUSH.

    python3 validation/flush-coherence.py DIR [-k PATTERN]... [--list] [--timeout-scale F]

AgentFS answers FLUSH with ENOSYS by default ("no-flush": close(2) sends nothing to the server;
with the writeback cache the kernel still writes the dirty pages back before close returns);
AGENTFS_FUSE_NOFLUSH=0 restores FLUSH on every close. Every check here must pass in both modes,
and on ext4: after close() returns another process at once sees the full size and bytes (0, 1,
4096, 1 MiB, ...), also after a cache drop that makes the kernel ask the server again (root
only); size and mtime are stable after close (no late writeback changes them); write+unlink+close
is not an error; O_APPEND records from two processes all arrive intact; fsync after the close of
another fd; dup'd fds; exit without close.

Each check runs in a forked child (own process group) with a deadline, inside its own
subdirectory of a scratch directory in DIR that is removed at the end. Output: "PASS name" /
"FAIL name: why" / "SKIP name: why" per check, then a final line "N passed, M failed"; exit 0
iff nothing failed.

Standard library only (Python 3.11).
"""

import argparse
import hashlib
import errno
import json
import mmap
import os
import pickle
import random
import select
import shutil
import signal
import socket
import stat
import struct
import sys
import time
import traceback

# --------------------------------------------------------------------------
# Harness (same shape as posix_gate.py)
# --------------------------------------------------------------------------

CHECKS = []
DEFAULT_TIMEOUT = 60.0


def check(name, timeout=DEFAULT_TIMEOUT):
    def deco(fn):
        if any(n == name for n, _, _ in CHECKS):
            raise RuntimeError("duplicate check name " + name)
        CHECKS.append((name, fn, timeout))
        return fn
    return deco


class Skip(Exception):
    pass


class Failed(AssertionError):
    pass


class Ctx:
    def __init__(self, directory):
        self.dir = directory

    def p(self, *parts):
        return os.path.join(self.dir, *parts)


def ename(n):
    return errno.errorcode.get(n, str(n)) if n is not None else "success"


def fail(msg):
    raise Failed(msg)


def expect(cond, msg):
    if not cond:
        fail(msg)


def describe_bytes_diff(actual, expected):
    if len(actual) != len(expected):
        n = min(len(actual), len(expected))
        first = next((i for i in range(n) if actual[i] != expected[i]), None)
        extra = "" if first is None else ", first difference at offset %d" % first
        return "length %d, expected %d%s" % (len(actual), len(expected), extra)
    for i in range(len(actual)):
        if actual[i] != expected[i]:
            return "byte %d is %#x, expected %#x (len %d)" % (i, actual[i], expected[i], len(actual))
    return "equal"


def expect_eq(actual, expected, what):
    if actual != expected:
        if isinstance(actual, (bytes, bytearray)) and isinstance(expected, (bytes, bytearray)):
            fail("%s: %s" % (what, describe_bytes_diff(actual, expected)))
        fail("%s: got %r, expected %r" % (what, actual, expected))


def expect_errno(expected, fn, *args, what=None):
    if isinstance(expected, int):
        expected = (expected,)
    label = what or getattr(fn, "__name__", "call")
    try:
        res = fn(*args)
    except OSError as e:
        if e.errno in expected:
            return e
        fail("%s: expected %s, got %s (%s)" % (label, "/".join(map(ename, expected)), ename(e.errno), e))
    if fn is os.open and isinstance(res, int):
        os.close(res)
    fail("%s: expected %s, but it succeeded" % (label, "/".join(map(ename, expected))))


def pattern(n, seed=0):
    """Deterministic n bytes; different seeds give different data of the same length."""
    return random.Random(seed * 1000003 + n).randbytes(n)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            fail("write returned %d" % n)
        view = view[n:]


def write_file(path, data=b"", mode=0o644, flags=0):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, mode)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def read_all(fd):
    chunks = []
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def read_file(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_all(fd)
    finally:
        os.close(fd)


def pread_all(fd, size):
    chunks, off = [], 0
    while off < size:
        b = os.pread(fd, size - off, off)
        if not b:
            break
        chunks.append(b)
        off += len(b)
    return b"".join(chunks)


# ---- another process: a forked peer on a socketpair ----

class Chan:
    def __init__(self, sock):
        self.sock = sock
        self.sock.settimeout(60)

    def send(self, obj):
        data = pickle.dumps(obj)
        self.sock.sendall(struct.pack("<I", len(data)) + data)

    def _exact(self, n):
        buf = b""
        while len(buf) < n:
            b = self.sock.recv(n - len(buf))
            if not b:
                raise EOFError("peer closed the channel")
            buf += b
        return buf

    def recv(self):
        (n,) = struct.unpack("<I", self._exact(4))
        return pickle.loads(self._exact(n))


def _describe(e):
    if isinstance(e, AssertionError):
        return str(e) or "assertion failed"
    tb = traceback.extract_tb(e.__traceback__)
    where = next((f"line {fr.lineno}" for fr in reversed(tb) if fr.filename == __file__), "")
    if isinstance(e, OSError):
        return "unexpected %s: %s (%s)" % (ename(e.errno), e, where)
    return "%s: %s (%s)" % (type(e).__name__, e, where)


class PeerSide:
    """What a peer's fn gets: send(x) arrives as Peer.recv(), recv() returns Peer.send(x)."""

    def __init__(self, raw):
        self.raw = raw

    def send(self, obj):
        self.raw.send(("msg", obj))

    def recv(self):
        return self.raw.recv()[1]


class Peer:
    """fn(chan, *args) runs in a forked process. chan.send(x) there arrives as peer.recv() here,
    peer.send(x) here arrives as chan.recv() there. peer.join() returns fn's result."""

    def __init__(self, fn, *args, name="peer"):
        self.name = name
        a, b = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                a.close()
                raw = Chan(b)
                try:
                    raw.send(("ok", fn(PeerSide(raw), *args)))
                except BaseException as e:  # noqa: BLE001
                    raw.send(("err", _describe(e)))
                    code = 1
            finally:
                os._exit(code)
        b.close()
        self.pid = pid
        self.ch = Chan(a)
        self.done = False

    def send(self, obj):
        self.ch.send(("msg", obj))

    def _get(self):
        kind, val = self.ch.recv()
        if kind == "err":
            self._reap()
            fail("%s: %s" % (self.name, val))
        return kind, val

    def recv(self):
        kind, val = self._get()
        if kind != "msg":
            fail("%s finished while a message was expected" % self.name)
        return val

    def join(self):
        while True:
            kind, val = self._get()
            if kind == "ok":
                self._reap()
                return val

    def _reap(self):
        if not self.done:
            os.waitpid(self.pid, 0)
            self.done = True


def _peer_recv(ch):
    return ch.recv()


def errno_of(fn, *args):
    """None on success (an fd result is closed), else the errno."""
    try:
        res = fn(*args)
        if fn is os.open:
            os.close(res)
        return None
    except OSError as e:
        return e.errno


def other(fn, *args, name="other process"):
    """Run fn(*args) in another process and return its result."""
    return Peer(lambda ch, *a: fn(*a), *args, name=name).join()


# ---- runner ----

def _safe_name(name):
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def _rmtree(path):
    def onerror(func, p, exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
        except OSError:
            pass
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)
        except FileNotFoundError:
            pass
    if os.path.lexists(path):
        shutil.rmtree(path, onerror=onerror)


def run_forked(fn, timeout):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            os.setpgid(0, 0)
            try:
                out = json.dumps({"value": fn()})
            except BaseException:  # noqa: BLE001
                out = json.dumps({"error": "internal error: %s" % traceback.format_exc(limit=3)})
                code = 3
            data = out.encode()
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(code)
    os.close(w)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass
    deadline = time.monotonic() + timeout
    buf, timed_out = b"", False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([r], [], [], left)
        if ready:
            b = os.read(r, 65536)
            if not b:
                break
            buf += b
    os.close(r)
    if timed_out:
        for target in (-pid, pid):
            try:
                os.kill(target, signal.SIGKILL)
            except OSError:
                pass
        end = time.monotonic() + 5
        while time.monotonic() < end:
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
            time.sleep(0.05)
        return None, "timed out after %.0fs (killed)" % timeout
    _, status = os.waitpid(pid, 0)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    if not buf:
        return None, "child died without a result (wait status %#x)" % status
    try:
        res = json.loads(buf.decode())
    except ValueError:
        return None, "garbled result from child: %r" % buf[:200]
    if "error" in res:
        return None, res["error"]
    return res["value"], None


def _check_body(name, fn, scratch):
    os.umask(0o022)
    os.chdir("/")
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    d = os.path.join(scratch, _safe_name(name))
    os.mkdir(d)
    os.chmod(d, 0o755)
    result = ("FAIL", "did not finish")
    try:
        fn(Ctx(d))
        result = ("PASS", "")
    except Skip as e:
        result = ("SKIP", str(e))
    except BaseException as e:  # noqa: BLE001
        result = ("FAIL", _describe(e))
    finally:
        os.chdir("/")
        try:
            _rmtree(d)
        except OSError as e:
            if result[0] != "FAIL":
                result = ("FAIL", "cleanup of check dir failed: %s" % e)
    return result


def main(argv=None, prefix=".coherence"):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?")
    ap.add_argument("-k", dest="pattern", action="append", default=[],
                    help="only checks whose name contains PATTERN (repeatable)")
    ap.add_argument("--timeout-scale", type=float, default=1.0)
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    selected = [c for c in CHECKS if not args.pattern or any(p in c[0] for p in args.pattern)]
    if args.list:
        for n, _, _ in selected:
            print(n)
        return 0
    if not args.dir or not os.path.isdir(args.dir):
        ap.error("DIR must be an existing directory")
    base = os.path.abspath(args.dir)
    scratch = os.path.join(base, "%s.%d.%d" % (prefix, os.getpid(), random.randrange(1 << 30)))
    os.mkdir(scratch)
    os.chmod(scratch, 0o755)
    npass = nfail = nskip = 0
    t_all = time.monotonic()
    try:
        for name, fn, timeout in selected:
            value, err = run_forked(lambda: _check_body(name, fn, scratch), timeout * args.timeout_scale)
            status, detail = value if err is None else ("FAIL", err)
            npass += status == "PASS"
            nfail += status == "FAIL"
            nskip += status == "SKIP"
            print("%s %s%s" % (status, name, (": " + detail) if detail else ""), flush=True)
    finally:
        _, err = run_forked(lambda: _rmtree(scratch), 120)
        if err is None and os.path.lexists(scratch):
            err = "scratch directory still exists"
        if err is not None:
            nfail += 1
            print("FAIL gate.cleanup: could not remove %s: %s" % (scratch, err), flush=True)
    print("%d passed, %d failed" % (npass, nfail) + (", %d skipped" % nskip if nskip else ""), flush=True)
    print("# %.1fs" % (time.monotonic() - t_all), file=sys.stderr, flush=True)
    return 0 if nfail == 0 else 1


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------

SIZES = (0, 1, 4096, 4097, 65535, 1 << 20, (1 << 20) + 7, 3 << 20)


def sha(b):
    return hashlib.sha256(b).hexdigest()


def _observe(path):
    """What another process sees: (size, sha256 of the bytes, mtime_ns)."""
    st = os.stat(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        data = read_all(fd)
        fst = os.fstat(fd)
    finally:
        os.close(fd)
    if fst.st_size != st.st_size:
        fail("stat size %d but fstat size %d" % (st.st_size, fst.st_size))
    return st.st_size, sha(data), st.st_mtime_ns, len(data)


def observer(ch):
    """A persistent other process: each message is a path, the answer is _observe(path)."""
    while True:
        path = ch.recv()
        if path is None:
            return True
        ch.send(_observe(path))


def expect_seen(seen, data, what):
    size, digest, _, nread = seen
    expect_eq(size, len(data), what + ": size")
    expect_eq(nread, len(data), what + ": bytes read")
    expect(digest == sha(data), what + ": bytes differ from what was written")


def write_chunks(fd, data):
    """Write in uneven chunks, so pages get dirtied piecewise."""
    off, step = 0, 1
    while off < len(data):
        n = min(len(data) - off, step)
        write_all(fd, data[off:off + n])
        off += n
        step = step * 3 + 1
    return off


@check("close.visible_at_once_sizes")
def _(t):
    b = Peer(observer, name="observer B")
    for i, size in enumerate(SIZES):
        f = t.p("f%d" % i)
        data = pattern(size, i)
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        write_chunks(fd, data)
        os.close(fd)
        b.send(f)
        expect_seen(b.recv(), data, "new file of %d bytes, seen by another process right after close" % size)
        st = os.stat(f)
        expect_eq(st.st_size, size, "size of %d-byte file in the writing process" % size)
    # Rewrites of an existing file, growing and shrinking, in the writer process A.
    f = t.p("rw")
    for i, size in enumerate(SIZES[::-1] + SIZES):
        data = pattern(size, 100 + i)
        other(write_file, f, data, name="writer A")
        b.send(f)
        expect_seen(b.recv(), data, "rewrite to %d bytes, seen right after A's close" % size)
    b.send(None)
    b.join()


@check("close.visible_after_exit_without_close")
def _(t):
    # The process exits with the fd open: the kernel closes it; nothing may be lost.
    b = Peer(observer, name="observer B")
    for i, size in enumerate((1, 4096, 1 << 20)):
        f = t.p("f%d" % i)
        data = pattern(size, 20 + i)

        def w():
            fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o644)
            write_all(fd, data)
            return True  # the fd is closed by exit
        other(w, name="writer A")
        b.send(f)
        expect_seen(b.recv(), data, "%d bytes written by a process that exited without close" % size)
    b.send(None)
    b.join()


@check("close.stat_same_and_other_process")
def _(t):
    b = Peer(observer, name="observer B")
    f = t.p("f")
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    total = b""
    for rnd in range(150):
        piece = pattern(rnd * 37 % 5000 + 1, rnd)
        os.pwrite(fd, piece, len(total))
        total += piece
        if rnd % 10 == 9:
            # Close and reopen: stat in this process and the other must agree with the bytes.
            os.close(fd)
            st = os.stat(f)
            expect_eq(st.st_size, len(total), "round %d: size in the writing process" % rnd)
            b.send(f)
            seen = b.recv()
            expect_seen(seen, total, "round %d: another process" % rnd)
            expect_eq(seen[2], st.st_mtime_ns, "round %d: mtime seen by another process" % rnd)
            fd = os.open(f, os.O_RDWR)
    os.close(fd)
    # ftruncate to extend, and a sparse pwrite far out.
    fd = os.open(f, os.O_RDWR)
    os.ftruncate(fd, 10 << 20)
    os.close(fd)
    b.send(f)
    expect_seen(b.recv(), total + bytes((10 << 20) - len(total)), "after ftruncate to 10 MiB")
    fd = os.open(f, os.O_WRONLY)
    os.pwrite(fd, b"far", 20 << 20)
    os.close(fd)
    b.send(f)
    expect_seen(b.recv(), total + bytes((20 << 20) - len(total)) + b"far", "after a sparse pwrite at 20 MiB")
    # Shrink: a late writeback must not resurrect the old tail.
    write_file(f, b"tiny")
    b.send(f)
    expect_seen(b.recv(), b"tiny", "after O_TRUNC rewrite to 4 bytes")
    b.send(None)
    b.join()


@check("close.size_mtime_stable_after_sync")
def _(t):
    files = []
    for i, size in enumerate((1, 4096, 1 << 20, 3 << 20)):
        f = t.p("f%d" % i)
        data = pattern(size, 30 + i)
        fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o644)
        write_chunks(fd, data)
        os.close(fd)
        st = os.stat(f)
        files.append((f, data, st.st_size, st.st_mtime_ns))
    time.sleep(0.1)
    os.sync()
    time.sleep(0.1)
    for f, data, size, mtime in files:
        seen = other(_observe, f)
        expect_seen(seen, data, "%d bytes after sync" % len(data))
        expect_eq(seen[2], mtime, "mtime of the %d-byte file after sync (changed after close)" % len(data))


def _drop_caches():
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
    except OSError as e:
        raise Skip("cannot drop caches: %s" % e)


@check("close.reread_after_cache_drop")
def _(t):
    # After close (no fsync), drop the page, dentry and inode caches: the kernel forgets the
    # inode and asks the filesystem again. What it gets must be what was written before close.
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        raise Skip("/proc/sys/vm/drop_caches is not writable (needs root)")
    files = []
    for i, size in enumerate(SIZES):
        f = t.p("f%d" % i)
        data = pattern(size, 40 + i)
        fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o640)
        write_chunks(fd, data)
        os.close(fd)
        st = os.stat(f)
        files.append((f, data, st))
    # A shrink after a big write, and a rewrite of the same size.
    g = t.p("shrunk")
    write_file(g, pattern(1 << 20, 1))
    write_file(g, b"small")
    files.append((g, b"small", os.stat(g)))
    h = t.p("same")
    write_file(h, pattern(65536, 2))
    write_file(h, pattern(65536, 3))
    files.append((h, pattern(65536, 3), os.stat(h)))
    _drop_caches()
    problems = []
    for f, data, st in files:
        name = os.path.basename(f)
        try:
            seen = other(_observe, f)
            expect_seen(seen, data, "%s (%d bytes) after a cache drop" % (name, len(data)))
            st2 = os.stat(f)
            expect_eq(st2.st_mtime_ns, st.st_mtime_ns, "%s: mtime after a cache drop (was %d bytes)" % (name, len(data)))
            expect_eq(oct(st2.st_mode), oct(st.st_mode), "%s: mode after a cache drop" % name)
            expect_eq(st2.st_ino, st.st_ino, "%s: inode number after a cache drop" % name)
        except AssertionError as e:
            problems.append(str(e))
    expect(not problems, "; ".join(problems))


@check("close.write_unlink_close_no_error")
def _(t):
    for i, size in enumerate((0, 1, 4096, 1 << 20)):
        f = t.p("f%d" % i)
        fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
        write_chunks(fd, pattern(size, 50 + i))
        os.unlink(f)
        if i % 2:
            os.fsync(fd)
        expect_eq(pread_all(fd, size + 10), pattern(size, 50 + i), "read of the unlinked %d-byte file" % size)
        os.close(fd)  # must not raise
    # The same with a second fd open and closed in another order, and from another process.
    f = t.p("g")

    def w():
        fd1 = os.open(f, os.O_WRONLY | os.O_CREAT, 0o644)
        fd2 = os.open(f, os.O_RDONLY)
        write_all(fd1, pattern(200000, 9))
        os.unlink(f)
        os.close(fd2)
        os.close(fd1)
        return True
    other(w, name="writer A")
    expect_eq(os.listdir(t.dir), [], "listing after the unlinked files were closed")
    write_file(f, b"recreated")
    expect_eq(other(read_file, f), b"recreated", "the name recreated")
    os.sync()


@check("append.two_processes_records_intact")
def _(t):
    f = t.p("log")
    write_file(f, b"")
    n = 1500

    def appender(ch, wid):
        fd = os.open(f, os.O_WRONLY | os.O_APPEND)
        ch.send("ready")
        ch.recv()
        rnd = random.Random(wid)
        for seq in range(n):
            body = ("%x" % (wid * 7 + seq)) * rnd.randrange(1, 60)
            rec = "w%d %d %d %s\n" % (wid, seq, len(body), body)
            if os.write(fd, rec.encode()) != len(rec):
                fail("short append")
        os.close(fd)
        return True

    peers = [Peer(appender, w, name="appender %d" % w) for w in (0, 1)]
    for p in peers:
        expect_eq(p.recv(), "ready", "appender")
    for p in peers:
        p.send("go")
    for p in peers:
        p.join()
    data = other(read_file, f)
    expect_eq(os.stat(f).st_size, len(data), "size vs bytes read")
    lines = data.split(b"\n")
    expect_eq(lines[-1], b"", "file does not end with a complete record")
    seqs = {0: [], 1: []}
    for i, line in enumerate(lines[:-1]):
        parts = line.split(b" ")
        ok = len(parts) == 4 and parts[0] in (b"w0", b"w1")
        if ok:
            wid, seq, ln = int(parts[0][1:]), int(parts[1]), int(parts[2])
            ok = ln == len(parts[3]) and parts[3] == (("%x" % (wid * 7 + seq)).encode() * (ln // max(1, len("%x" % (wid * 7 + seq)))))
        if not ok:
            fail("record %d is torn or garbled: %r" % (i, line[:120]))
        seqs[wid].append(seq)
    for wid in (0, 1):
        expect_eq(seqs[wid], list(range(n)), "sequence of appender %d's records" % wid)


@check("fsync.after_close_of_other_fd")
def _(t):
    f = t.p("f")
    fd1 = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    fd2 = os.open(f, os.O_RDWR)
    data = pattern(300000, 60)
    write_all(fd1, data)
    os.close(fd1)
    os.fsync(fd2)
    os.fdatasync(fd2)
    expect_eq(pread_all(fd2, 1 << 20), data, "read through the surviving fd")
    os.pwrite(fd2, b"MORE", len(data))
    os.fsync(fd2)
    expect_eq(other(read_file, f), data + b"MORE", "another process after fsync of the surviving fd")
    os.close(fd2)
    # fsync of a read-only fd after a writer in another process closed.
    fd3 = os.open(f, os.O_RDONLY)
    other(write_file, f, b"replaced", name="writer A")
    os.fsync(fd3)
    expect_eq(pread_all(fd3, 100), b"replaced", "read-only fd after another process rewrote the file")
    os.close(fd3)


@check("dup.close_one_write_other")
def _(t):
    f = t.p("f")
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    write_all(fd, b"first;")
    fd2 = os.dup(fd)
    os.close(fd)
    write_all(fd2, b"second;")  # shares the offset
    fd3 = os.dup2(fd2, 100)
    os.close(fd2)
    write_all(fd3, b"third;")
    os.close(fd3)
    expect_eq(other(read_file, f), b"first;second;third;", "content after writes through dup'd fds")
    # A read-only fd closed while a write fd still holds dirty data.
    w = os.open(f, os.O_WRONLY | os.O_APPEND)
    r = os.open(f, os.O_RDONLY)
    write_all(w, pattern(100000, 61))
    os.close(r)
    write_all(w, b"end")
    os.close(w)
    expect_eq(other(read_file, f), b"first;second;third;" + pattern(100000, 61) + b"end",
              "content after closing a reader before the writer")
    # Shared fd across fork: the child writes and closes, the parent writes and closes.
    fd = os.open(f, os.O_WRONLY | os.O_TRUNC)
    pid = os.fork()
    if pid == 0:
        try:
            write_all(fd, b"child;")
            os.close(fd)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    write_all(fd, b"parent;")
    os.close(fd)
    expect_eq(other(read_file, f), b"child;parent;", "content after writes through a fork-shared fd")


@check("close.repeated_append_cycles")
def _(t):
    f = t.p("f")
    b = Peer(observer, name="observer B")
    total = b""
    for rnd in range(200):
        piece = pattern(rnd % 7 * 600 + 1, rnd)
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        write_all(fd, piece)
        os.close(fd)
        total += piece
        if rnd % 5 == 0:
            b.send(f)
            expect_seen(b.recv(), total, "cycle %d" % rnd)
    b.send(None)
    b.join()
    expect_eq(read_file(f), total, "content after 200 append cycles")


@check("close.rename_while_open_then_close")
def _(t):
    a, b = t.p("a"), t.p("b")
    fd = os.open(a, os.O_WRONLY | os.O_CREAT, 0o644)
    write_all(fd, pattern(500000, 70))
    os.rename(a, b)
    write_all(fd, b"after-rename")
    os.close(fd)
    expect_eq(other(read_file, b), pattern(500000, 70) + b"after-rename", "content under the new name")
    expect_eq(os.listdir(t.dir), ["b"], "listing")


if __name__ == "__main__":
    sys.exit(main(prefix=".flush_coherence"))
