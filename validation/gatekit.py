"""gatekit: the framework and helpers shared by the validation gates.

Used by posix_gate.py, noopen-coherence.py, flush-coherence.py (the check framework) and
coherence-stress.py (forked workers, file helpers). Not a gate itself.

Framework: a gate makes one `Gate`, registers checks with `@gate.check("group.what")` and
ends with `sys.exit(gate.main(argv, doc=__doc__, prefix=".name"))`. Every check runs in a
forked child (own process group) with a deadline, in its own empty subdirectory of a scratch
directory inside DIR that is removed at the end. A check gets a `Ctx` and raises `Failed`
(or AssertionError, via fail/expect/expect_eq/expect_errno) to fail and `Skip` to skip.
Output: "PASS name" / "FAIL name: why" / "SKIP name: why" per check, then
"N passed, M failed" (", K skipped" if any); main returns 0 iff nothing failed.

The gates import it as a sibling module: each puts its own directory on sys.path first, so
it works from any cwd and when a gate is imported rather than run.

Standard library only (Python >= 3.8; developed on 3.11).
"""

import argparse
import errno
import json
import os
import pickle
import random
import select
import shutil
import signal
import socket
import struct
import sys
import sysconfig
import time
import traceback

# --------------------------------------------------------------------------
# Registry and runner
# --------------------------------------------------------------------------


class Skip(Exception):
    pass


class Failed(AssertionError):
    pass


class Ctx:
    """What a check gets: its own empty directory and the run options."""

    def __init__(self, directory, quick=False):
        self.dir = directory
        self.quick = quick

    def p(self, *parts):
        return os.path.join(self.dir, *parts)


class Gate:
    """One gate's check registry (list of (name, function, timeout_seconds)) and its main()."""

    def __init__(self, default_timeout=30.0):
        self.default_timeout = default_timeout
        self.checks = []

    def check(self, name, timeout=None):
        """Register a check. The function receives a Ctx and returns nothing;
        it raises Failed (or AssertionError) to fail and Skip to skip."""
        if timeout is None:
            timeout = self.default_timeout

        def deco(fn):
            if any(n == name for n, _, _ in self.checks):
                raise RuntimeError("duplicate check name " + name)
            self.checks.append((name, fn, timeout))
            return fn

        return deco

    def main(self, argv=None, *, doc, prefix, quick=False, json_report=False, elapsed=False):
        """Parse the gate's command line, run the selected checks, print, return the exit status.

        doc: the gate's docstring (its first paragraph is the --help description);
        prefix: name of the scratch directory in DIR (".prefix.<pid>.<random>");
        quick, json_report: offer --quick / --json; elapsed: "# N.Ns" on stderr at the end."""
        ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
        ap.add_argument("dir", nargs="?", help="directory to test in (on the filesystem under test)")
        if quick:
            ap.add_argument("--quick", action="store_true", help="smaller sizes/counts")
        ap.add_argument("-k", dest="pattern", action="append", default=[],
                        help="only run checks whose name contains PATTERN (repeatable; any matches)")
        if json_report:
            ap.add_argument("--json", action="store_true", help="print a JSON report on stdout")
        ap.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every check's timeout")
        ap.add_argument("--list", action="store_true", help="list check names and exit")
        args = ap.parse_args(argv)
        is_quick = getattr(args, "quick", False)
        as_json = getattr(args, "json", False)

        selected = [(n, f, to) for n, f, to in self.checks
                    if not args.pattern or any(p in n for p in args.pattern)]
        if args.list:
            for n, _, _ in selected:
                print(n)
            return 0
        if not args.dir:
            ap.error("DIR is required")
        if not os.path.isdir(args.dir):
            ap.error("%s is not a directory" % args.dir)

        human = sys.stderr if as_json else sys.stdout
        base = os.path.abspath(args.dir)
        scratch = os.path.join(base, "%s.%d.%d" % (prefix, os.getpid(), random.randrange(1 << 30)))
        os.mkdir(scratch)
        os.chmod(scratch, 0o755)  # ordinary users need to search it
        t_all = time.monotonic()
        results = self.run(selected, scratch, quick=is_quick, timeout_scale=args.timeout_scale,
                           out=human)
        npass = sum(r["status"] == "PASS" for r in results)
        nfail = sum(r["status"] == "FAIL" for r in results)
        nskip = sum(r["status"] == "SKIP" for r in results)
        summary = summary_line(npass, nfail, nskip)
        if as_json:
            print(summary, file=human, flush=True)
            json.dump({"dir": base, "quick": is_quick, "passed": npass, "failed": nfail,
                       "skipped": nskip, "summary": summary, "results": results}, sys.stdout, indent=1)
            print()
        else:
            print(summary, flush=True)
        if elapsed:
            print("# %.1fs" % (time.monotonic() - t_all), file=sys.stderr, flush=True)
        return 0 if nfail == 0 else 1

    def run(self, selected, scratch, *, quick=False, timeout_scale=1.0, out=sys.stdout, label=""):
        """Run the (name, fn, timeout) checks in `selected`, each in scratch/<name>, print a
        result line per check (names prefixed with `label`) and remove `scratch` at the end.
        Returns the list of result dicts.

        A check directory that already exists is used as it is (not created, not chmod-ed):
        another gate can prepare them, e.g. as directories of an overlay's read-only base, so
        that the checks run in directories that are copied up when they are first changed."""
        results = []
        try:
            for name, fn, timeout in selected:
                t0 = time.monotonic()
                value, err = run_forked(lambda: _check_body(name, fn, scratch, quick),
                                        timeout * timeout_scale)
                status, detail = (value if err is None else ("FAIL", err))
                results.append({"name": label + name, "status": status, "detail": detail,
                                "seconds": round(time.monotonic() - t0, 3)})
                print(result_line(status, label + name, detail), file=out, flush=True)
        finally:
            # Clean up in a child with a deadline too: a broken FS must not hang us.
            _, err = run_forked(lambda: rmtree(scratch), 120)
            if err is None and os.path.lexists(scratch):
                err = "scratch directory still exists"
            if err is not None:
                detail = "could not remove %s: %s" % (scratch, err)
                results.append({"name": label + "gate.cleanup", "status": "FAIL",
                                "detail": detail, "seconds": 0})
                print(result_line("FAIL", label + "gate.cleanup", detail), file=out, flush=True)
        return results


def result_line(status, name, detail=""):
    return "%s %s%s" % (status, name, (": " + detail) if detail else "")


def summary_line(npass, nfail, nskip=0):
    return "%d passed, %d failed" % (npass, nfail) + (", %d skipped" % nskip if nskip else "")


def safe_name(name):
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def rmtree(path):
    """Remove a tree as robustly as possible (fix permissions on the way)."""

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


def _internal_error(e):
    return "internal error: %s" % traceback.format_exc(limit=3)


def spawn(fn, own_group=True, on_error=_internal_error):
    """Run fn() in a forked child; its JSON-serialisable value comes back on a pipe.

    Returns (pid, read fd) for collect(). With own_group the child gets its own process
    group, so that a deadline kills everything it forked. An exception in fn is sent back
    as the error text on_error(e)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            if own_group:
                os.setpgid(0, 0)
            try:
                out = json.dumps({"value": fn()})
            except BaseException as e:  # noqa: BLE001
                out = json.dumps({"error": on_error(e)})
                code = 3
            data = out.encode()
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(code)
    os.close(w)
    if own_group:
        try:
            os.setpgid(pid, pid)  # also done in the child; avoids a race
        except OSError:
            pass
    return pid, r


def collect(pid, r, timeout):
    """Wait (at most timeout seconds) for a spawn()ed child's result and reap it.

    Returns (value, None) or (None, error text). A child that exceeds the deadline is
    SIGKILLed together with its process group."""
    deadline = time.monotonic() + timeout
    buf = b""
    timed_out = False
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
        # Reap, but never wait forever (a task stuck in D state can't die).
        end = time.monotonic() + 5
        while time.monotonic() < end:
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
            time.sleep(0.05)
        return None, "timed out after %.0fs (killed)" % timeout
    _, status = os.waitpid(pid, 0)
    # Kill any stragglers the child left in its process group.
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


def run_forked(fn, timeout):
    """Run fn() in a forked child (own process group) with a deadline.

    fn returns a JSON-serialisable value. Returns (value, None) or
    (None, error text). A child that exceeds the deadline is SIGKILLed
    together with everything it forked.
    """
    return collect(*spawn(fn), timeout)


def _check_body(name, fn, scratch, quick):
    """Executed inside the forked child: set up, run one check, clean up."""
    os.umask(0o022)
    os.chdir("/")
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    d = os.path.join(scratch, safe_name(name))
    if not os.path.isdir(d):
        os.mkdir(d)
        os.chmod(d, 0o755)
    result = ("FAIL", "did not finish")
    try:
        fn(Ctx(d, quick))
        result = ("PASS", "")
    except Skip as e:
        result = ("SKIP", str(e))
    except BaseException as e:  # noqa: BLE001
        result = ("FAIL", describe(e))
    finally:
        os.chdir("/")
        try:
            rmtree(d)
        except OSError as e:
            if result[0] != "FAIL":
                result = ("FAIL", "cleanup of check dir failed: %s" % e)
    return result


# --------------------------------------------------------------------------
# Assertion helpers
# --------------------------------------------------------------------------

_NOT_GATE_CODE = tuple(os.path.join(p, "") for p in {
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})


def where(e):
    """"line N" of the innermost frame of e's traceback in a gate's own code (not in
    gatekit, not in the standard library); else "gatekit.py line N"; else ""."""
    frames = [fr for fr in traceback.extract_tb(e.__traceback__)
              if not fr.filename.startswith(_NOT_GATE_CODE) and not fr.filename.startswith("<")]
    for fr in reversed(frames):
        if fr.filename != __file__:
            return "line %d" % fr.lineno
    return "gatekit.py line %d" % frames[-1].lineno if frames else ""


def describe_exception(e):
    return "%s: %s (%s)" % (type(e).__name__, e, where(e))


def describe(e):
    """The FAIL text for an exception a check (or a peer) raised."""
    if isinstance(e, AssertionError):
        return str(e) or "assertion failed"
    if isinstance(e, OSError):
        return "unexpected %s: %s (%s)" % (ename(e.errno), e, where(e))
    return describe_exception(e)


def ename(n):
    return errno.errorcode.get(n, str(n)) if n is not None else "success"


def _enames(expected):
    return "/".join(ename(e) for e in expected)


def fail(msg):
    raise Failed(msg)


def expect(cond, msg):
    if not cond:
        fail(msg)


def expect_eq(actual, expected, what):
    if actual != expected:
        a, e = actual, expected
        if isinstance(a, (bytes, bytearray)) and isinstance(e, (bytes, bytearray)):
            fail("%s: %s" % (what, describe_bytes_diff(a, e)))
        if isinstance(a, int) and isinstance(e, int) and what.endswith("mode"):
            fail("%s: got %o, expected %o" % (what, a, e))
        fail("%s: got %r, expected %r" % (what, a, e))


def describe_bytes_diff(actual, expected):
    if len(actual) != len(expected):
        n = min(len(actual), len(expected))
        first = next((i for i in range(n) if actual[i] != expected[i]), None)
        extra = "" if first is None else ", first difference at offset %d" % first
        return "length %d, expected %d%s" % (len(actual), len(expected), extra)
    for i in range(len(actual)):
        if actual[i] != expected[i]:
            return "byte %d is %#x, expected %#x (len %d)" % (
                i, actual[i], expected[i], len(actual))
    return "equal"


def expect_errno(expected, fn, *args, what=None, **kw):
    """Call fn(*args, **kw); it must fail with one of the expected errnos."""
    if isinstance(expected, int):
        expected = (expected,)
    label = what or getattr(fn, "__name__", "call")
    try:
        res = fn(*args, **kw)
    except OSError as e:
        if e.errno in expected:
            return e
        fail("%s: expected %s, got %s (%s)" % (label, _enames(expected), ename(e.errno), e))
    # Close any fd we accidentally got so it doesn't leak.
    if fn is os.open and isinstance(res, int):
        os.close(res)
    fail("%s: expected %s, but it succeeded" % (label, _enames(expected)))


def xerrno(fn, *args, **kw):
    """Run fn; return None on success (an fd result is closed) or the errno it failed with."""
    try:
        res = fn(*args, **kw)
        if fn is os.open and isinstance(res, int):
            os.close(res)
        return None
    except OSError as e:
        return e.errno


# --------------------------------------------------------------------------
# File helpers
# --------------------------------------------------------------------------

_PATTERN_CYCLE = 251  # prime, so the pattern never lines up with 2^k sizes


def pattern(n, seed=0):
    """Deterministic content of n bytes; different seeds give different data."""
    base = bytes(((i * 7 + seed * 13 + 1) % 256) for i in range(_PATTERN_CYCLE))
    start = seed % _PATTERN_CYCLE
    cyc = base[start:] + base[:start]
    reps = n // _PATTERN_CYCLE + 1
    return (cyc * reps)[:n]


def random_pattern(n, seed=0):
    """Deterministic pseudo-random n bytes (no period: no two pages alike); different seeds
    give different data of the same length. The coherence gates use it to catch stale pages."""
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


def pwrite_all(fd, data, off):
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, off)
        if n <= 0:
            fail("pwrite returned %d" % n)
        view = view[n:]
        off += n


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


def pread_exact(fd, n, off=0):
    """Up to n bytes from offset off (fewer only at end of file)."""
    chunks = []
    while n > 0:
        b = os.pread(fd, n, off)
        if not b:
            break
        chunks.append(b)
        n -= len(b)
        off += len(b)
    return b"".join(chunks)


def touch(path, mode=0o644):
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, mode))


def tick():
    """Sleep long enough for the (coarse, jiffy-based) file clock to move."""
    time.sleep(0.03)


# --------------------------------------------------------------------------
# Another process: a forked peer on a socketpair
# --------------------------------------------------------------------------


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
                    raw.send(("err", describe(e)))
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


def peer_recv(ch):
    """A peer fn that returns the first message it is sent."""
    return ch.recv()


def other(fn, *args, name="other process"):
    """Run fn(*args) in another process and return its result."""
    return Peer(lambda ch, *a: fn(*a), *args, name=name).join()


# --------------------------------------------------------------------------
# Running code as an ordinary user
# --------------------------------------------------------------------------

UID_A, GID_A = 12345, 12346   # "user A" (unused ids on a normal system)
UID_B, GID_B = 12347, 12348   # "user B"
GID_SHARED = 4242             # a group used for setgid/chgrp checks


def as_user(fn, uid=UID_A, gid=GID_A, groups=(), cwd=None):
    """Run fn() in a forked child with the given credentials.

    The child chdirs to cwd *before* dropping privileges, so fn may use paths
    relative to cwd even if the ancestors of DIR are not searchable by uid.
    Returns ("ok", value) or ("err", errno, message) or ("exc", text).
    """
    if os.geteuid() != 0:
        raise Skip("needs root to switch to an ordinary uid")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            try:
                if cwd is not None:
                    os.chdir(cwd)
                os.setgroups(list(groups))
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
                os.umask(0o022)
                try:
                    res = ("ok", fn())
                except OSError as e:
                    res = ("err", e.errno, str(e))
                except BaseException as e:  # noqa: BLE001 - report everything
                    res = ("exc", "".join(traceback.format_exception_only(type(e), e)).strip())
            except BaseException as e:  # noqa: BLE001
                res = ("exc", "credential setup failed: %r" % (e,))
            try:
                data = pickle.dumps(res)
            except Exception as e:  # unpicklable return value
                data = pickle.dumps(("exc", "unpicklable result: %r" % (e,)))
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    with os.fdopen(r, "rb") as f:
        chunks.append(f.read())
    os.waitpid(pid, 0)
    data = b"".join(chunks)
    if not data:
        fail("user child (uid %d) died without a result" % uid)
    return pickle.loads(data)


def user_ok(fn, what, **kw):
    """fn must succeed as the ordinary user; returns its value."""
    res = as_user(fn, **kw)
    if res[0] == "ok":
        return res[1]
    if res[0] == "err":
        fail("%s as uid %d: expected success, got %s (%s)" % (
            what, kw.get("uid", UID_A), ename(res[1]), res[2]))
    fail("%s as uid %d: %s" % (what, kw.get("uid", UID_A), res[1]))


def user_errno(expected, fn, what, **kw):
    """fn must fail with one of the expected errnos as the ordinary user."""
    if isinstance(expected, int):
        expected = (expected,)
    res = as_user(fn, **kw)
    who = "uid %d" % kw.get("uid", UID_A)
    if res[0] == "ok":
        fail("%s as %s: expected %s, but it succeeded" % (what, who, _enames(expected)))
    if res[0] == "exc":
        fail("%s as %s: %s" % (what, who, res[1]))
    if res[1] not in expected:
        fail("%s as %s: expected %s, got %s (%s)" % (what, who, _enames(expected), ename(res[1]), res[2]))


def need_root():
    if os.geteuid() != 0:
        raise Skip("needs root")
