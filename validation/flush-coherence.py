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

import hashlib
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gatekit.py, from any cwd
from gatekit import (  # noqa: E402
    Gate, Peer, Skip, expect, expect_eq, fail, other, pread_exact, random_pattern, read_all,
    read_file, write_all, write_file)

GATE = Gate(default_timeout=60.0)
check = GATE.check
CHECKS = GATE.checks


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
        data = random_pattern(size, i)
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
        data = random_pattern(size, 100 + i)
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
        data = random_pattern(size, 20 + i)

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
        piece = random_pattern(rnd * 37 % 5000 + 1, rnd)
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
        data = random_pattern(size, 30 + i)
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
        data = random_pattern(size, 40 + i)
        fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o640)
        write_chunks(fd, data)
        os.close(fd)
        st = os.stat(f)
        files.append((f, data, st))
    # A shrink after a big write, and a rewrite of the same size.
    g = t.p("shrunk")
    write_file(g, random_pattern(1 << 20, 1))
    write_file(g, b"small")
    files.append((g, b"small", os.stat(g)))
    h = t.p("same")
    write_file(h, random_pattern(65536, 2))
    write_file(h, random_pattern(65536, 3))
    files.append((h, random_pattern(65536, 3), os.stat(h)))
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
        write_chunks(fd, random_pattern(size, 50 + i))
        os.unlink(f)
        if i % 2:
            os.fsync(fd)
        expect_eq(pread_exact(fd, size + 10), random_pattern(size, 50 + i), "read of the unlinked %d-byte file" % size)
        os.close(fd)  # must not raise
    # The same with a second fd open and closed in another order, and from another process.
    f = t.p("g")

    def w():
        fd1 = os.open(f, os.O_WRONLY | os.O_CREAT, 0o644)
        fd2 = os.open(f, os.O_RDONLY)
        write_all(fd1, random_pattern(200000, 9))
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
    data = random_pattern(300000, 60)
    write_all(fd1, data)
    os.close(fd1)
    os.fsync(fd2)
    os.fdatasync(fd2)
    expect_eq(pread_exact(fd2, 1 << 20), data, "read through the surviving fd")
    os.pwrite(fd2, b"MORE", len(data))
    os.fsync(fd2)
    expect_eq(other(read_file, f), data + b"MORE", "another process after fsync of the surviving fd")
    os.close(fd2)
    # fsync of a read-only fd after a writer in another process closed.
    fd3 = os.open(f, os.O_RDONLY)
    other(write_file, f, b"replaced", name="writer A")
    os.fsync(fd3)
    expect_eq(pread_exact(fd3, 100), b"replaced", "read-only fd after another process rewrote the file")
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
    write_all(w, random_pattern(100000, 61))
    os.close(r)
    write_all(w, b"end")
    os.close(w)
    expect_eq(other(read_file, f), b"first;second;third;" + random_pattern(100000, 61) + b"end",
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
        piece = random_pattern(rnd % 7 * 600 + 1, rnd)
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
    write_all(fd, random_pattern(500000, 70))
    os.rename(a, b)
    write_all(fd, b"after-rename")
    os.close(fd)
    expect_eq(other(read_file, b), random_pattern(500000, 70) + b"after-rename", "content under the new name")
    expect_eq(os.listdir(t.dir), ["b"], "listing")


def main(argv=None, prefix=".flush_coherence"):
    return GATE.main(argv, doc=__doc__, prefix=prefix, elapsed=True)


if __name__ == "__main__":
    sys.exit(main())
