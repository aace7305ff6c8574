#!/usr/bin/env python3
"""Concurrent coherence stress: writers replace, rename, link, unlink and chmod; readers validate.

    python3 validation/coherence-stress.py DIR [--seconds 15] [--writers 4] [--readers 4]
                                               [--dirs 3] [--names 30] [--seed S]

Shared directories d0..d{dirs-1}, each with names n00..n{names-1}. Name nJ belongs to writer
J % writers (in every directory); only its owner ever creates, replaces, renames, links, unlinks
or chmods it. Every file's content is a complete version:

    COH1 w=<writer> v=<version> len=<body length> sha=<sha256 of body>\\n<body>

and a writer never modifies a visible file in place: it writes a temp file (.tmp.w<W>.<seq>, in
any of the directories, sometimes truncating and rewriting it before it is done), optionally
fsyncs/fchmods it, and renames it over the target (also across directories). Other operations:
rename one own name over another, link an own name to another own name (via a temp link and a
rename, so the replacement is atomic), unlink, chmod, and read back an own name (read-your-writes
against the writer's model).

Readers (other processes) list the directories, stat, open, read (read() or mmap) and check:
every listed name is a known name or a writer's temp file; a non-temp file's content parses,
its length and checksum match its header, its writer is the name's owner; the fd's fstat size
equals the bytes read; the mode is one the writers use.

At the end (writers stopped, readers stopped) each writer's model (name -> object, object ->
content and mode) is merged and compared with the tree: exactly the same names (no temp files
left), and for each name size, mode, nlink, content, and hard links sharing one inode.

Output: "PASS x" / "FAIL x: why" lines, then "N passed, M failed"; exit 0 iff nothing failed.
Standard library only (Python 3.11).
"""

import argparse
import errno
import hashlib
import json
import mmap
import os
import random
import re
import shutil
import stat
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gatekit.py, from any cwd
from gatekit import collect, describe_exception, read_all, result_line, summary_line, write_all  # noqa: E402
from gatekit import spawn as gatekit_spawn  # noqa: E402

MODES = (0o600, 0o640, 0o644, 0o664, 0o700, 0o755)
SIZES = (0, 1, 100, 4095, 4096, 4097, 10000, 65536, 70001, 200000)
NAME_RE = re.compile(r"^n(\d+)$")
TMP_RE = re.compile(r"^\.tmp\.w(\d+)\.(\d+)$")


def body_of(w, v, n):
    return random.Random((w << 32) | v).randbytes(n)


def make_content(w, v, n):
    body = body_of(w, v, n)
    head = b"COH1 w=%d v=%d len=%d sha=%s\n" % (w, v, n, hashlib.sha256(body).hexdigest().encode())
    return head + body


def parse(data):
    """(writer, version, length) of a complete version, or raise ValueError why not."""
    nl = data.find(b"\n")
    if nl < 0 or nl > 200:
        raise ValueError("no header line (%d bytes, starts %r)" % (len(data), data[:40]))
    m = re.match(rb"^COH1 w=(\d+) v=(\d+) len=(\d+) sha=([0-9a-f]{64})$", data[:nl])
    if not m:
        raise ValueError("bad header %r" % data[:nl][:100])
    w, v, n = int(m.group(1)), int(m.group(2)), int(m.group(3))
    body = data[nl + 1:]
    if len(body) != n:
        raise ValueError("header says %d body bytes, got %d (torn: w=%d v=%d)" % (n, len(body), w, v))
    if hashlib.sha256(body).hexdigest().encode() != m.group(4):
        raise ValueError("checksum mismatch (w=%d v=%d len=%d)" % (w, v, n))
    return w, v, n


# --------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------

class Writer:
    def __init__(self, root, wid, args, deadline):
        self.root, self.w, self.args, self.deadline = root, wid, args, deadline
        self.rnd = random.Random(args.seed * 1000 + wid)
        self.names = [(d, j) for d in range(args.dirs) for j in range(args.names) if j % args.writers == wid]
        self.at = {}       # (d, j) -> object id
        self.objs = {}     # object id -> [version, size, mode]
        self.version = 0
        self.seq = 0
        self.ops = {}

    def path(self, key):
        return os.path.join(self.root, "d%d" % key[0], "n%02d" % key[1])

    def tmp(self):
        self.seq += 1
        d = self.rnd.randrange(self.args.dirs)
        return os.path.join(self.root, "d%d" % d, ".tmp.w%d.%d" % (self.w, self.seq))

    def count(self, op):
        self.ops[op] = self.ops.get(op, 0) + 1

    def gc(self):
        live = set(self.at.values())
        for o in list(self.objs):
            if o not in live:
                del self.objs[o]

    def postmortem(self, e):
        """What the tree says now about the paths of a failed operation (for the report)."""
        out = []
        for p in (e.filename, e.filename2):
            if not p:
                continue
            try:
                st = os.lstat(p)
                what = "exists (ino %d, nlink %d, size %d)" % (st.st_ino, st.st_nlink, st.st_size)
            except OSError as e2:
                what = "lstat %s" % errno.errorcode.get(e2.errno, e2.errno)
            listed = os.path.basename(p) in os.listdir(os.path.dirname(p))
            key = None
            m = NAME_RE.match(os.path.basename(p))
            if m:
                key = (int(os.path.basename(os.path.dirname(p))[1:]), int(m.group(1)))
            model = ("model: object %s" % self.at.get(key)) if key else "temp name"
            out.append("%s: %s, %s in its directory listing, %s" % (
                os.path.relpath(p, self.root), what, "listed" if listed else "not listed", model))
        return "; ".join(out)

    def op_replace(self):
        key = self.rnd.choice(self.names)
        self.version += 1
        v = self.version
        size = self.rnd.choice(SIZES) + self.rnd.randrange(3)
        mode = self.rnd.choice(MODES)
        data = make_content(self.w, v, size)
        t = self.tmp()
        fd = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            how = self.rnd.randrange(4)
            if how == 0:  # write garbage first, truncate, rewrite
                write_all(fd, os.urandom(self.rnd.randrange(1, 50000)))
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                write_all(fd, data)
            elif how == 1:  # back to front with pwrite
                step = max(1, len(data) // 3)
                for off in sorted(range(0, len(data), step), reverse=True):
                    os.pwrite(fd, data[off:off + step], off)
            elif how == 2:  # longer, then truncate down
                write_all(fd, data + b"TRAILING-GARBAGE" * 10)
                os.ftruncate(fd, len(data))
            else:
                write_all(fd, data)
            if self.rnd.random() < 0.2:
                os.fsync(fd)
            if self.rnd.random() < 0.2:
                mode = self.rnd.choice(MODES)
                os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.rename(t, self.path(key))
        self.at[key] = v
        self.objs[v] = [v, size, mode]
        self.count("replace")

    def op_unlink(self):
        have = [k for k in self.names if k in self.at]
        if not have:
            return
        key = self.rnd.choice(have)
        os.unlink(self.path(key))
        del self.at[key]
        self.count("unlink")

    def op_rename(self):
        have = [k for k in self.names if k in self.at]
        if not have:
            return
        src = self.rnd.choice(have)
        dst = self.rnd.choice(self.names)
        if src == dst or self.at.get(dst) == self.at[src]:
            return  # same name or same inode: rename is a no-op, skip
        os.rename(self.path(src), self.path(dst))
        self.at[dst] = self.at.pop(src)
        self.count("rename")

    def op_link(self):
        have = [k for k in self.names if k in self.at]
        if not have:
            return
        src = self.rnd.choice(have)
        dst = self.rnd.choice(self.names)
        if src == dst or self.at.get(dst) == self.at[src]:
            return
        t = self.tmp()
        os.link(self.path(src), t)
        os.rename(t, self.path(dst))
        self.at[dst] = self.at[src]
        self.count("link")

    def op_chmod(self):
        have = [k for k in self.names if k in self.at]
        if not have:
            return
        key = self.rnd.choice(have)
        mode = self.rnd.choice(MODES)
        os.chmod(self.path(key), mode)
        self.objs[self.at[key]][2] = mode
        self.count("chmod")

    def op_verify(self):
        key = self.rnd.choice(self.names)
        p = self.path(key)
        if key not in self.at:
            try:
                os.lstat(p)
            except FileNotFoundError:
                self.count("verify")
                return
            raise AssertionError("writer %d: %s exists but the writer removed it" % (self.w, p))
        v, size, mode = self.objs[self.at[key]]
        with open(p, "rb") as fh:
            got = fh.read()
            st = os.fstat(fh.fileno())
        want = make_content(self.w, v, size)
        if got != want:
            raise AssertionError("writer %d: read-your-writes of %s: got %d bytes (%s), expected v=%d len=%d"
                                 % (self.w, p, len(got), _why(got), v, len(want)))
        if stat.S_IMODE(st.st_mode) != mode:
            raise AssertionError("writer %d: %s mode %o, expected %o" % (self.w, p, stat.S_IMODE(st.st_mode), mode))
        n = sum(1 for o in self.at.values() if o == self.at[key])
        if st.st_nlink != n:
            raise AssertionError("writer %d: %s nlink %d, expected %d" % (self.w, p, st.st_nlink, n))
        self.count("verify")

    def run(self):
        ops = [(self.op_replace, 45), (self.op_unlink, 8), (self.op_rename, 12), (self.op_link, 10),
               (self.op_chmod, 12), (self.op_verify, 13)]
        fns = [f for f, _ in ops]
        weights = [w for _, w in ops]
        # Start with every name present.
        for key in self.names:
            if self.rnd.random() < 0.8:
                self.version += 1
                v = self.version
                mode = self.rnd.choice(MODES)
                data = make_content(self.w, v, self.rnd.choice(SIZES))
                t = self.tmp()
                fd = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
                write_all(fd, data)
                os.close(fd)
                os.rename(t, self.path(key))
                self.at[key] = v
                self.objs[v] = [v, len(data) - data.index(b"\n") - 1, mode]
        while time.monotonic() < self.deadline:
            fn = self.rnd.choices(fns, weights)[0]
            try:
                fn()
            except OSError as e:
                raise AssertionError("writer %d: %s failed: %s; afterwards %s" % (
                    self.w, fn.__name__, e, self.postmortem(e))) from e
            if self.rnd.random() < 0.05:
                self.gc()
        self.gc()
        return {"w": self.w, "ops": self.ops,
                "at": [[d, j, o] for (d, j), o in self.at.items()],
                "objs": {str(o): val for o, val in self.objs.items()}}


def _why(data):
    try:
        w, v, n = parse(data)
        return "a complete w=%d v=%d len=%d" % (w, v, n)
    except ValueError as e:
        return str(e)


# --------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------

def reader(root, rid, args, stop_at):
    rnd = random.Random(args.seed * 7777 + rid)
    n = {"lists": 0, "reads": 0, "validated": 0, "vanished": 0, "tmp_seen": 0, "mmap": 0}
    errors = []

    def err(msg):
        if len(errors) < 20:
            errors.append(msg)

    while time.monotonic() < stop_at() and len(errors) < 20:
        d = rnd.randrange(args.dirs)
        dp = os.path.join(root, "d%d" % d)
        names = os.listdir(dp)
        n["lists"] += 1
        for name in names:
            m = NAME_RE.match(name)
            if TMP_RE.match(name):
                n["tmp_seen"] += 1
                continue
            if not m or int(m.group(1)) >= args.names:
                err("unexpected name %s in d%d" % (name, d))
                continue
        rnd.shuffle(names)
        for name in names[: rnd.randrange(1, 12)] if names else []:
            m = NAME_RE.match(name)
            if not m:
                continue
            owner = int(m.group(1)) % args.writers
            p = os.path.join(dp, name)
            try:
                lst = os.lstat(p)
                if not stat.S_ISREG(lst.st_mode):
                    err("%s: lstat says not a regular file (%o)" % (p, lst.st_mode))
                fd = os.open(p, os.O_RDONLY)
            except FileNotFoundError:
                n["vanished"] += 1
                continue
            try:
                st = os.fstat(fd)
                if st.st_size > 0 and rnd.random() < 0.25:
                    mm = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, mmap.PROT_READ)
                    try:
                        data = bytes(mm[:])
                    finally:
                        mm.close()
                    n["mmap"] += 1
                else:
                    data = read_all(fd)
                st2 = os.fstat(fd)
            finally:
                os.close(fd)
            n["reads"] += 1
            if st2.st_size != len(data) or st.st_size != len(data):
                err("%s: fstat size %d/%d but %d bytes read (%s)" % (p, st.st_size, st2.st_size, len(data), _why(data)))
                continue
            if stat.S_IMODE(st2.st_mode) not in MODES or not stat.S_ISREG(st2.st_mode):
                err("%s: mode %o is not one the writers use" % (p, st2.st_mode))
            try:
                w, v, ln = parse(data)
            except ValueError as e:
                err("%s: %s" % (p, e))
                continue
            if w != owner:
                err("%s: content written by writer %d, but the name belongs to writer %d" % (p, w, owner))
                continue
            n["validated"] += 1
    return {"r": rid, "counts": n, "errors": errors}


# --------------------------------------------------------------------------
# Runner
# --------------------------------------------------------------------------

def spawn(fn):
    """fork; fn() -> JSON value sent back on a pipe. Returns (pid, read fd) for collect().
    The child stays in our process group, so that ^C stops readers and writers too."""
    return gatekit_spawn(fn, own_group=False, on_error=describe_exception)


def compare(root, args, models):
    """Compare the tree with the merged writer models. Returns a list of problems."""
    probs = []
    expect = {}   # relpath -> (writer, obj)
    objs = {}     # (writer, obj) -> (version, size, mode)
    for m in models:
        for d, j, o in m["at"]:
            expect["d%d/n%02d" % (d, j)] = (m["w"], o)
        for o, val in m["objs"].items():
            objs[(m["w"], int(o))] = tuple(val)
    actual = set()
    for d in range(args.dirs):
        for name in os.listdir(os.path.join(root, "d%d" % d)):
            actual.add("d%d/%s" % (d, name))
    for extra in sorted(actual - set(expect)):
        probs.append("unexpected name %s" % extra)
    for missing in sorted(set(expect) - actual):
        probs.append("missing name %s" % missing)
    inode_of = {}
    nlinks = {}
    for rel, key in expect.items():
        nlinks[key] = nlinks.get(key, 0) + 1
    for rel in sorted(set(expect) & actual):
        w, o = expect[rel]
        v, size, mode = objs[(w, o)]
        p = os.path.join(root, rel)
        st = os.lstat(p)
        with open(p, "rb") as fh:
            data = fh.read()
        want = make_content(w, v, size)
        if data != want:
            probs.append("%s: content %s, expected w=%d v=%d (%d bytes)" % (rel, _why(data), w, v, len(want)))
        if st.st_size != len(want):
            probs.append("%s: size %d, expected %d" % (rel, st.st_size, len(want)))
        if stat.S_IMODE(st.st_mode) != mode or not stat.S_ISREG(st.st_mode):
            probs.append("%s: mode %o, expected %o" % (rel, st.st_mode, stat.S_IFREG | mode))
        if st.st_nlink != nlinks[(w, o)]:
            probs.append("%s: nlink %d, expected %d" % (rel, st.st_nlink, nlinks[(w, o)]))
        prev = inode_of.setdefault((w, o), (st.st_ino, rel))
        if prev[0] != st.st_ino:
            probs.append("%s and %s should be one inode (hard links), got %d and %d"
                         % (prev[1], rel, prev[0], st.st_ino))
    seen_inos = {}
    for key, (ino, rel) in inode_of.items():
        if ino in seen_inos:
            probs.append("%s and %s share inode %d but are different files" % (seen_inos[ino], rel, ino))
        seen_inos[ino] = rel
    return probs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--dirs", type=int, default=3)
    ap.add_argument("--names", type=int, default=30)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    if not os.path.isdir(args.dir):
        ap.error("DIR must be an existing directory")
    root = os.path.join(os.path.abspath(args.dir), ".coherence_stress.%d" % os.getpid())
    os.mkdir(root)
    for d in range(args.dirs):
        os.mkdir(os.path.join(root, "d%d" % d))
    os.umask(0)
    t0 = time.monotonic()
    results = []  # (ok, name, detail)
    print("# seed %d, %d writers, %d readers, %gs" % (args.seed, args.writers, args.readers, args.seconds),
          file=sys.stderr, flush=True)
    try:
        deadline = time.monotonic() + args.seconds
        # Readers run until a stop file outside the tree... simpler: a shared deadline a bit
        # past the writers' one, so they overlap the whole writing period.
        rstop = deadline + 0.5
        readers = [spawn(lambda i=i: reader(root, i, args, lambda: rstop)) for i in range(args.readers)]
        writers = [spawn(lambda i=i: Writer(root, i, args, deadline).run()) for i in range(args.writers)]
        models, werrs = [], []
        for i, (pid, r) in enumerate(writers):
            val, e = collect(pid, r, args.seconds + 120)
            if e:
                werrs.append("writer %d: %s" % (i, e))
            else:
                models.append(val)
        rres, rerrs = [], []
        for i, (pid, r) in enumerate(readers):
            val, e = collect(pid, r, args.seconds + 120)
            if e:
                rerrs.append("reader %d: %s" % (i, e))
            else:
                rres.append(val)
                rerrs.extend("reader %d: %s" % (i, x) for x in val["errors"])
        ops = {}
        for m in models:
            for k, v in m["ops"].items():
                ops[k] = ops.get(k, 0) + v
        print("# writer ops: %s" % json.dumps(ops, sort_keys=True), file=sys.stderr)
        counts = {}
        for rr in rres:
            for k, v in rr["counts"].items():
                counts[k] = counts.get(k, 0) + v
        print("# reader counts: %s" % json.dumps(counts, sort_keys=True), file=sys.stderr)
        results.append((not werrs, "stress.writers", "; ".join(werrs)))
        results.append((not rerrs, "stress.readers_valid", "; ".join(rerrs[:10])))
        busy = counts.get("validated", 0) > 0 and ops.get("replace", 0) > 0
        results.append((busy, "stress.did_work", "" if busy else "no reads validated or no writes done"))
        if not werrs:
            probs = compare(root, args, models)
            results.append((not probs, "stress.final_tree",
                            "%d problems: %s" % (len(probs), "; ".join(probs[:10])) if probs else ""))
            # Once more from a fresh process, after sync.
            os.sync()
            pid, r = spawn(lambda: compare(root, args, models))
            val, e = collect(pid, r, 120)
            probs = [e] if e else val
            results.append((not probs, "stress.final_tree_other_process",
                            "%d problems: %s" % (len(probs), "; ".join(probs[:10])) if probs else ""))
    finally:
        try:
            shutil.rmtree(root)
        except OSError as e:
            results.append((False, "stress.cleanup", str(e)))
    for ok, name, detail in results:
        print(result_line("PASS" if ok else "FAIL", name, "" if ok else detail))
    npass = sum(1 for ok, _, _ in results if ok)
    nfail = len(results) - npass
    print(summary_line(npass, nfail), flush=True)
    print("# %.1fs" % (time.monotonic() - t0), file=sys.stderr, flush=True)
    return 0 if nfail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
