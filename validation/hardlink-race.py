#!/usr/bin/env python3
"""Hard-link race gate: a live name must never show a kernel-cached nlink of 0.

    python3 validation/hardlink-race.py DIR [--seconds 10] [--pairs 4] [--statters 3] [--mode unlink|rename]

Each writer owns a file x/a<k>; it loops: link x/a -> y/b (nlink 2), then removes y/b again
(unlink b, or rename a fresh temp file over b), then checks a: lstat(a).st_nlink must be 1
and link(a, c) must succeed (c is unlinked again right away). Statters lstat a<k>/b<k>
and list the directory (READDIRPLUS) as fast as they can, so that replies carrying the
post-removal nlink race with the removal's own reply.

Prints the first failures and counts; exit 1 iff a failure was seen.
"""
import argparse, errno, os, sys, time


def writer(d, k, deadline, mode, ydir=True):
    # a (and c) in d/x; b and the temp in d/y: the removal of b locks only d/y, so a
    # statter listing d/x (READDIRPLUS) is not held off by the rename/unlink.
    a, c = (os.path.join(d, "x", "%s%d" % (p, k)) for p in "ac")
    b = os.path.join(d, "y" if ydir else "x", "b%d" % k)
    t = os.path.join(d, "y" if ydir else "x", ".t%d" % k)
    fd = os.open(a, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.write(fd, b"x" * 100)
    os.close(fd)
    n = bad_stat = bad_link = 0
    first = []
    while time.monotonic() < deadline:
        try:
            os.link(a, b)
        except FileNotFoundError:
            bad_link += 1
            if len(first) < 6:
                first.append("iter %d: link(%s) failed: ENOENT (lstat nlink now %d)" % (
                    n, a, os.lstat(a).st_nlink))
            time.sleep(0.01)
            continue
        if mode == "unlink":
            os.unlink(b)
        else:
            fd = os.open(t, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            os.close(fd)
            os.rename(t, b)
            os.unlink(b)
        n += 1
        st = os.lstat(a)
        if st.st_nlink != 1:
            if os.environ.get("TRACE_STOP") and not bad_stat:
                with open("/sys/kernel/tracing/trace_marker", "w") as f:
                    f.write("REPRO pid %d: lstat(%s) nlink %d ino %d" % (os.getpid(), a, st.st_nlink, st.st_ino))
                with open("/sys/kernel/tracing/tracing_on", "w") as f:
                    f.write("0")
            bad_stat += 1
            if len(first) < 3:
                first.append("iter %d: lstat(%s).st_nlink = %d" % (n, a, st.st_nlink))
        try:
            os.link(a, c)
            os.unlink(c)
        except OSError as e:
            bad_link += 1
            if len(first) < 6:
                first.append("iter %d: link(%s) failed: %s (lstat nlink now %d, listed %s)" % (
                    n, a, errno.errorcode.get(e.errno), os.lstat(a).st_nlink,
                    os.path.basename(a) in os.listdir(os.path.dirname(a))))
            if e.errno != errno.ENOENT:
                raise
    return n, bad_stat, bad_link, first


def statter(d, pairs, deadline, args_every=1):
    names = ["x/a%d" % k for k in range(pairs)] + ["y/b%d" % k for k in range(pairs)]
    i = 0
    while time.monotonic() < deadline:
        i += 1
        if i % args_every == 0:
            os.listdir(os.path.join(d, "x"))
        for nm in names:
            try:
                os.lstat(os.path.join(d, nm))
            except FileNotFoundError:
                pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--statters", type=int, default=3)
    ap.add_argument("--mode", choices=("unlink", "rename"), default="unlink")
    ap.add_argument("--one-dir", action="store_true", help="a and b in the same directory")
    ap.add_argument("--writer-cpu", type=int, default=-1)
    ap.add_argument("--statter-cpu", type=int, default=-1)
    args = ap.parse_args()
    d = os.path.join(args.dir, "repro.%d" % os.getpid())
    os.mkdir(d)
    os.mkdir(os.path.join(d, "x"))
    os.mkdir(os.path.join(d, "y"))
    deadline = time.monotonic() + args.seconds
    kids = []
    for k in range(args.statters):
        pid = os.fork()
        if pid == 0:
            if args.statter_cpu >= 0:
                os.sched_setaffinity(0, {args.statter_cpu})
            statter(d, args.pairs, deadline)
            os._exit(0)
        kids.append(pid)
    pipes = []
    for k in range(args.pairs):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            if args.writer_cpu >= 0:
                os.sched_setaffinity(0, {args.writer_cpu})
            res = writer(d, k, deadline, args.mode, not args.one_dir)
            os.write(w, repr(res).encode())
            os._exit(0)
        os.close(w)
        pipes.append((pid, r))
    tot = [0, 0, 0]
    msgs = []
    for pid, r in pipes:
        data = b""
        while True:
            x = os.read(r, 65536)
            if not x:
                break
            data += x
        os.waitpid(pid, 0)
        n, bs, bl, first = eval(data.decode())
        tot[0] += n; tot[1] += bs; tot[2] += bl
        msgs += first
    for pid in kids:
        os.waitpid(pid, 0)
    for m in msgs[:10]:
        print("  " + m)
    print("iterations %d, lstat nlink != 1: %d, link ENOENT: %d" % tuple(tot))
    for sub in ("x", "y"):
        for nm in os.listdir(os.path.join(d, sub)):
            os.unlink(os.path.join(d, sub, nm))
        os.rmdir(os.path.join(d, sub))
    os.rmdir(d)
    return 1 if tot[1] or tot[2] else 0


if __name__ == "__main__":
    sys.exit(main())
