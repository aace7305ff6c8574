#!/usr/bin/env python3
"""Open/close coherence gate: what must hold whether or not the filesystem is told about opens.

    python3 validation/noopen-coherence.py DIR [-k PATTERN]... [--list] [--timeout-scale F]

AgentFS answers OPEN/OPENDIR with ENOSYS by default ("no-open": the kernel opens without
asking, keeps the page cache across opens and sends no RELEASE); AGENTFS_FUSE_NOOPEN=0 and
AGENTFS_FUSE_NOOPENDIR=0 restore the classic OPEN/RELEASE and OPENDIR/RELEASEDIR exchanges. Every check here must pass in both modes, and on ext4:
open/close cycles, close-to-open coherence between processes (also after truncate+rewrite of the
same size, across rename-over and unlink+recreate of the same name: the page cache must never
serve stale bytes), unlink-while-open, many fds in several processes, mmap MAP_SHARED, O_TRUNC,
directory fds (fchdir, listing), fds inherited across fork.

Each check runs in a forked child (own process group) with a deadline, inside its own
subdirectory of a scratch directory in DIR that is removed at the end. "Another process" is a
forked peer talking to the check over a socketpair. Output: "PASS name" / "FAIL name: why" /
"SKIP name: why" per check, then a final line "N passed, M failed"; exit 0 iff nothing failed.

Standard library only (Python 3.11).
"""

import errno
import mmap
import os
import stat
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gatekit.py, from any cwd
from gatekit import (  # noqa: E402
    Gate, Peer, describe_bytes_diff, ename, expect, expect_eq, expect_errno, fail, other,
    peer_recv, pread_exact, random_pattern, read_all, read_file, write_all, write_file, xerrno)

GATE = Gate(default_timeout=60.0)
check = GATE.check
CHECKS = GATE.checks


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------


@check("cycle.file_open_close_1000")
def _(t):
    f = t.p("f")
    data = random_pattern(5000, 1)
    write_file(f, data)
    for i in range(1000):
        flags = (os.O_RDONLY, os.O_WRONLY, os.O_RDWR)[i % 3]
        fd = os.open(f, flags)
        try:
            if flags != os.O_WRONLY and i % 50 == 0:
                expect_eq(pread_exact(fd, 10000), data, "content at cycle %d" % i)
            if flags == os.O_RDWR and i % 99 == 0:
                os.pwrite(fd, data[:10], 0)  # same bytes: content unchanged
        finally:
            os.close(fd)
    expect_eq(read_file(f), data, "content after 1000 open/close cycles")
    # And the same from another process.
    expect_eq(other(read_file, f), data, "content read by another process")
    expect_eq(os.stat(f).st_size, len(data), "size")


@check("cycle.dir_scandir_1000")
def _(t):
    d = t.p("d")
    os.mkdir(d)
    names = set("e%02d" % i for i in range(12))
    for n in names:
        write_file(os.path.join(d, n), n.encode())
    os.mkdir(os.path.join(d, "sub"))
    want = names | {"sub"}
    for i in range(1000):
        with os.scandir(d) as it:
            got = set(e.name for e in it)
        if got != want:
            fail("scandir cycle %d: got %s, expected %s" % (i, sorted(got), sorted(want)))
        if i == 500:
            # The listing must change as soon as the directory does (no stale cached listing).
            write_file(os.path.join(d, "late"), b"x")
            want = want | {"late"}
        if i == 700:
            os.unlink(os.path.join(d, "e00"))
            want = want - {"e00"}
    got = set(other(os.listdir, d))
    expect_eq(sorted(got), sorted(want), "listing from another process")


def _writer(path, data, mode="trunc"):
    if mode == "trunc":
        write_file(path, data)
    elif mode == "ftruncate":
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, 0)
            write_all(fd, data)
        finally:
            os.close(fd)
    elif mode == "overwrite":  # same offsets, no truncation
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)
        finally:
            os.close(fd)
    return os.stat(path).st_size


def _reader(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        data = read_all(fd)
        st = os.fstat(fd)
        return data, st.st_size
    finally:
        os.close(fd)


@check("cto.write_close_then_other_reads")
def _(t):
    f = t.p("f")
    for i, size in enumerate((0, 1, 100, 4095, 4096, 4097, 65536, 300001, 2 << 20)):
        data = random_pattern(size, i)
        other(_writer, f, data, name="writer A")
        got, sz = other(_reader, f, name="reader B")
        expect_eq(sz, size, "size seen by B after A wrote %d bytes" % size)
        expect_eq(got, data, "bytes seen by B after A wrote %d bytes" % size)


@check("cto.truncate_rewrite_same_size")
def _(t):
    f = t.p("f")
    for mode in ("trunc", "ftruncate", "overwrite"):
        for size in (10, 4096, 12345, 1 << 20):
            write_file(f, random_pattern(size, 7777))
            expect_eq(other(_reader, f)[0], random_pattern(size, 7777), "%s size %d: initial read" % (mode, size))
            for rnd in range(3):
                # B has read (the page cache is full); A rewrites the same size with new bytes.
                data = random_pattern(size, 10 * rnd + len(mode))
                other(_writer, f, data, mode, name="writer A (%s)" % mode)
                got, sz = other(_reader, f, name="reader B")
                expect_eq(sz, size, "%s size %d round %d: B's fstat size" % (mode, size, rnd))
                expect_eq(got, data, "%s size %d round %d: B's read" % (mode, size, rnd))
                # The parent also reads: a third process.
                expect_eq(read_file(f), data, "%s size %d round %d: reader C" % (mode, size, rnd))


@check("cto.reader_keeps_fd_across_rewrite")
def _(t):
    # B holds an fd open while A truncates and rewrites the file with the same size: B's next
    # pread must see the new bytes (one inode, one page cache).
    f = t.p("f")
    size = 50000
    write_file(f, random_pattern(size, 0))

    def reader(ch):
        fd = os.open(f, os.O_RDONLY)
        try:
            ch.send(pread_exact(fd, size * 2))
            while True:
                cmd = peer_recv(ch)
                if cmd is None:
                    return True
                ch.send((pread_exact(fd, size * 2), os.fstat(fd).st_size))
        finally:
            os.close(fd)

    b = Peer(reader, name="reader B")
    expect_eq(b.recv(), random_pattern(size, 0), "B's first read")
    for rnd in range(1, 6):
        data = random_pattern(size, rnd)
        other(_writer, f, data, ("trunc", "ftruncate", "overwrite")[rnd % 3], name="writer A")
        b.send("read")
        got, sz = b.recv()
        expect_eq(sz, size, "round %d: B's fstat size" % rnd)
        expect_eq(got, data, "round %d: B's pread through its old fd" % rnd)
    b.send(None)
    b.join()


@check("cto.rename_over_target")
def _(t):
    f, tmp = t.p("target"), t.p("target.tmp")
    write_file(f, random_pattern(8192, 999))
    inos = set()
    for rnd in range(40):
        data = random_pattern(8192, rnd)  # same size every round

        def w():
            write_file(tmp, data)
            os.rename(tmp, f)
        other(w, name="writer A")
        got, sz = other(_reader, f, name="reader B")
        expect_eq(got, data, "round %d: B reads the renamed-over target" % rnd)
        st = os.stat(f)
        expect_eq(st.st_size, 8192, "round %d: size" % rnd)
        expect(not os.path.lexists(tmp), "round %d: tmp name still exists after rename" % rnd)
        inos.add(st.st_ino)
    expect(len(os.listdir(t.dir)) == 1, "directory holds %s" % os.listdir(t.dir))


@check("cto.rename_over_target_open_reader")
def _(t):
    # A reader that opened the old target keeps reading the OLD content after the rename-over;
    # a new open sees the new content.
    f, tmp = t.p("target"), t.p("target.tmp")
    old, new = random_pattern(20000, 1), random_pattern(20000, 2)
    write_file(f, old)
    fd = os.open(f, os.O_RDONLY)
    try:
        expect_eq(pread_exact(fd, 40000), old, "old content")

        def w():
            write_file(tmp, new)
            os.rename(tmp, f)
        other(w, name="writer A")
        expect_eq(pread_exact(fd, 40000), old, "old fd after rename-over")
        expect_eq(os.fstat(fd).st_nlink, 0, "nlink of the replaced inode")
        expect_eq(other(read_file, f), new, "new open after rename-over")
    finally:
        os.close(fd)
    expect_eq(read_file(f), new, "content after the old fd closed")


@check("cto.unlink_recreate_same_name")
def _(t):
    f = t.p("f")
    for rnd in range(40):
        data = random_pattern(10000, rnd)

        def w():
            if os.path.exists(f):
                os.unlink(f)
            fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                write_all(fd, data)
            finally:
                os.close(fd)
        other(w, name="writer A")
        got, sz = other(_reader, f, name="reader B")
        expect_eq(got, data, "round %d: B reads the recreated file" % rnd)
        expect_eq(read_file(f), data, "round %d: reader C" % rnd)


@check("unlink_open.fd_survives")
def _(t):
    f = t.p("f")
    data = random_pattern(30000, 5)
    write_file(f, data)
    fd = os.open(f, os.O_RDWR)
    try:
        os.unlink(f)
        expect(not os.path.lexists(f), "name still there after unlink")
        expect("f" not in os.listdir(t.dir), "name still listed after unlink")
        expect_errno(errno.ENOENT, os.open, f, os.O_RDONLY, what="open of the unlinked name")
        expect_eq(ename(other(xerrno, os.open, f, os.O_RDONLY)), "ENOENT",
                  "open of the unlinked name by another process")
        expect_errno(errno.ENOENT, os.stat, f)
        st = os.fstat(fd)
        expect_eq(st.st_nlink, 0, "fstat nlink after unlink")
        expect_eq(st.st_size, len(data), "fstat size after unlink")
        expect_eq(pread_exact(fd, 100000), data, "read through the fd after unlink")
        extra = random_pattern(5000, 6)
        os.pwrite(fd, extra, len(data))
        os.pwrite(fd, b"HEAD", 0)
        want = b"HEAD" + data[4:] + extra
        expect_eq(pread_exact(fd, 100000), want, "read after writes through the unlinked fd")
        expect_eq(os.fstat(fd).st_size, len(want), "size after writes through the unlinked fd")
        os.fsync(fd)
        os.ftruncate(fd, 1000)
        expect_eq(pread_exact(fd, 100000), want[:1000], "read after ftruncate of the unlinked fd")
        # Recreate the name while the old inode is still open: two distinct files.
        write_file(f, b"new file")
        expect(os.stat(f).st_ino != os.fstat(fd).st_ino, "recreated name has the old inode number")
        expect_eq(pread_exact(fd, 100000), want[:1000], "old fd after the name was recreated")
        os.unlink(f)
    finally:
        os.close(fd)
    # After close the name can be recreated, and the new file starts empty.
    fd = os.open(f, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        expect_eq(os.fstat(fd).st_size, 0, "size of the recreated file")
        expect_eq(os.fstat(fd).st_nlink, 1, "nlink of the recreated file")
        write_all(fd, b"again")
    finally:
        os.close(fd)
    expect_eq(other(read_file, f), b"again", "recreated file from another process")
    expect_eq(sorted(os.listdir(t.dir)), ["f"], "listing at the end")


@check("unlink_open.held_by_other_process")
def _(t):
    # B opens, A unlinks and exits; B keeps reading and writing; the parent recreates the name.
    f = t.p("f")
    data = random_pattern(70000, 7)
    write_file(f, data)

    def holder(ch):
        fd = os.open(f, os.O_RDWR)
        try:
            ch.send("open")
            peer_recv(ch)  # unlinked by now
            st = os.fstat(fd)
            if st.st_nlink != 0:
                fail("holder: fstat nlink %d after unlink, expected 0" % st.st_nlink)
            got = pread_exact(fd, 1 << 20)
            if got != data:
                fail("holder: read after unlink: " + describe_bytes_diff(got, data))
            os.pwrite(fd, b"Z" * 100, 100)
            got = pread_exact(fd, 1 << 20)
            want = data[:100] + b"Z" * 100 + data[200:]
            if got != want:
                fail("holder: read after write: " + describe_bytes_diff(got, want))
            ch.send("checked")
            peer_recv(ch)  # name recreated by now
            got = pread_exact(fd, 1 << 20)
            if got != want:
                fail("holder: read after the name was recreated: " + describe_bytes_diff(got, want))
            return True
        finally:
            os.close(fd)

    b = Peer(holder, name="holder B")
    expect_eq(b.recv(), "open", "holder")
    other(os.unlink, f, name="unlinker A")
    b.send("go")
    expect_eq(b.recv(), "checked", "holder")
    write_file(f, b"fresh")
    b.send("go")
    b.join()
    expect_eq(read_file(f), b"fresh", "the recreated file")
    expect_eq(os.stat(f).st_nlink, 1, "nlink of the recreated file")


@check("unlink_open.hardlink_keeps_inode")
def _(t):
    # Unlinking one of two names while open: nlink drops to 1, the other name shows writes.
    a, b = t.p("a"), t.p("b")
    write_file(a, b"0123456789")
    os.link(a, b)
    fd = os.open(a, os.O_RDWR)
    try:
        os.unlink(a)
        expect_eq(os.fstat(fd).st_nlink, 1, "nlink after unlinking one of two names")
        os.pwrite(fd, b"AB", 0)
    finally:
        os.close(fd)
    expect_eq(other(read_file, b), b"AB23456789", "other name after writes through the fd")
    expect_eq(os.stat(b).st_nlink, 1, "nlink via the remaining name")


@check("many_fds.several_processes")
def _(t):
    f = t.p("f")
    data = random_pattern(9000, 8)
    write_file(f, data)
    nproc, per = 4, 64

    def holder(ch, k):
        fds = [os.open(f, (os.O_RDONLY, os.O_RDWR)[j % 2]) for j in range(per)]
        ch.send(len(fds))
        peer_recv(ch)
        for j, fd in enumerate(fds):
            if j % 8 == 0:
                got = pread_exact(fd, 20000)
                if got != data:
                    fail("holder %d fd %d: %s" % (k, j, describe_bytes_diff(got, data)))
        for fd in fds:
            os.close(fd)
        return True

    peers = [Peer(holder, k, name="holder %d" % k) for k in range(nproc)]
    for p in peers:
        expect_eq(p.recv(), per, "fds opened")
    mine = [os.open(f, os.O_RDONLY) for _ in range(per)]
    for p in peers:
        p.send("go")
    for p in peers:
        p.join()
    for fd in mine:
        os.close(fd)
    # All closed: the file is still intact, writable, and removable.
    expect_eq(read_file(f), data, "content after all fds closed")
    with open(f, "ab") as fh:
        fh.write(b"tail")
    expect_eq(other(read_file, f), data + b"tail", "append after all fds closed")
    os.unlink(f)
    expect_eq(os.listdir(t.dir), [], "listing after unlink")


@check("mmap.shared_write_msync_visible")
def _(t):
    f = t.p("f")
    size = 3 * 4096 + 100
    write_file(f, b"\0" * size)
    data = random_pattern(size, 9)

    def mapper():
        fd = os.open(f, os.O_RDWR)
        try:
            m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            m[:] = data
            m.flush()  # msync(MS_SYNC)
            m.close()
        finally:
            os.close(fd)
        return True
    other(mapper, name="mapper A")
    got, sz = other(_reader, f, name="reader B")
    expect_eq(sz, size, "size after the mmap write")
    expect_eq(got, data, "read() by another process after msync")

    def mapread():
        fd = os.open(f, os.O_RDONLY)
        try:
            m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
            try:
                return bytes(m[:])
            finally:
                m.close()
        finally:
            os.close(fd)
    expect_eq(other(mapread, name="mapper C"), data, "new mmap in another process")

    # Live mapping: A keeps the mapping; writes through it after msync are seen by read().
    def live(ch):
        fd = os.open(f, os.O_RDWR)
        m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        os.close(fd)  # the mapping outlives the fd
        for rnd in range(5):
            m[0:4096] = random_pattern(4096, 100 + rnd)
            m.flush()
            ch.send(rnd)
            peer_recv(ch)
            got = bytes(m[4096:8192])
            if got != random_pattern(4096, 200 + rnd):
                fail("mapping does not show a pwrite by another process (round %d)" % rnd)
        m.close()
        return True
    a = Peer(live, name="live mapper A")
    for rnd in range(5):
        expect_eq(a.recv(), rnd, "round")
        expect_eq(other(_reader, f)[0][0:4096], random_pattern(4096, 100 + rnd), "round %d: read() of msynced page" % rnd)
        fd = os.open(f, os.O_WRONLY)
        os.pwrite(fd, random_pattern(4096, 200 + rnd), 4096)
        os.close(fd)
        a.send("go")
    a.join()


@check("open.o_trunc_truncates")
def _(t):
    f = t.p("f")
    write_file(f, random_pattern(100000, 10))
    expect_eq(other(read_file, f)[:10], random_pattern(100000, 10)[:10], "content before")
    fd = os.open(f, os.O_WRONLY | os.O_TRUNC)
    try:
        expect_eq(os.fstat(fd).st_size, 0, "fstat size right after open(O_TRUNC)")
        expect_eq(other(lambda: os.stat(f).st_size), 0, "size seen by another process")
        expect_eq(other(read_file, f), b"", "content seen by another process")
        os.write(fd, b"short")
    finally:
        os.close(fd)
    expect_eq(other(read_file, f), b"short", "content after rewrite")
    # O_TRUNC while another process holds the file open: its fd sees the truncation.

    def holder(ch):
        fd = os.open(f, os.O_RDONLY)
        try:
            ch.send(pread_exact(fd, 100))
            peer_recv(ch)
            return os.fstat(fd).st_size, pread_exact(fd, 100)
        finally:
            os.close(fd)
    b = Peer(holder, name="holder B")
    expect_eq(b.recv(), b"short", "holder's first read")
    os.close(os.open(f, os.O_RDWR | os.O_TRUNC))
    b.send("go")
    expect_eq(b.join(), (0, b""), "holder's fstat size and read after O_TRUNC by another process")
    # O_TRUNC|O_CREAT on an existing file keeps the inode.
    ino = os.stat(f).st_ino
    write_file(f, b"x")
    expect_eq(os.stat(f).st_ino, ino, "inode after O_CREAT|O_TRUNC of an existing file")


@check("dir.open_fchdir_list")
def _(t):
    d = t.p("d")
    os.mkdir(d)
    for n in ("a", "b", "c"):
        write_file(os.path.join(d, n), n.encode() * 3)
    os.mkdir(os.path.join(d, "sub"))
    for flags in (os.O_RDONLY, os.O_RDONLY | os.O_DIRECTORY):
        dfd = os.open(d, flags)
        try:
            expect(stat.S_ISDIR(os.fstat(dfd).st_mode), "fstat of the dir fd is not a directory")
            os.fchdir(dfd)
            expect_eq(sorted(os.listdir(".")), ["a", "b", "c", "sub"], "listing of . after fchdir")
            expect_eq(read_file("b"), b"bbb", "relative read after fchdir")
            expect_eq(sorted(os.listdir(dfd)), ["a", "b", "c", "sub"], "listing through the fd")
            expect_eq(sorted(os.listdir(dfd)), ["a", "b", "c", "sub"], "second listing through the fd")
            fd = os.open("new", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=dfd)
            os.write(fd, b"via dirfd")
            os.close(fd)
            expect_eq(read_file(os.path.join(d, "new")), b"via dirfd", "file created relative to the dir fd")
            os.unlink("new", dir_fd=dfd)
            expect_errno(errno.EISDIR, os.read, dfd, 10, what="read from a directory fd")
            os.chdir("/")
        finally:
            os.close(dfd)
    # Many opendir/closedir cycles with fchdir in between.
    for i in range(200):
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        os.fchdir(dfd)
        os.close(dfd)
        if i % 40 == 0:
            expect_eq(sorted(os.listdir(".")), ["a", "b", "c", "sub"], "listing in cycle %d" % i)
    os.chdir("/")


@check("fork.inherited_fd_after_parent_closed")
def _(t):
    f = t.p("f")
    write_file(f, b"start:")
    fd = os.open(f, os.O_RDWR | os.O_APPEND)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(w)
            os.read(r, 1)  # parent has closed its copy
            os.write(fd, b"child")
            os.fsync(fd)
            got = pread_exact(fd, 100)
            code = 0 if got == b"start:child" else 2
            os.close(fd)
        finally:
            os._exit(code)
    os.close(r)
    os.close(fd)
    os.write(w, b"x")
    os.close(w)
    _, status = os.waitpid(pid, 0)
    expect(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
           "child using the inherited fd failed (wait status %#x)" % status)
    expect_eq(read_file(f), b"start:child", "content written by the child through the inherited fd")
    # The other way round: the child closes its copy first, the parent keeps using it.
    fd = os.open(f, os.O_RDWR | os.O_APPEND)
    pid = os.fork()
    if pid == 0:
        os.close(fd)
        os._exit(0)
    os.waitpid(pid, 0)
    os.write(fd, b"+parent")
    os.close(fd)
    expect_eq(other(read_file, f), b"start:child+parent", "content after the child closed its copy")


@check("fork.inherited_fd_of_unlinked_file")
def _(t):
    f = t.p("f")
    write_file(f, b"orphan data")
    fd = os.open(f, os.O_RDWR)
    os.unlink(f)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            time.sleep(0.05)
            os.pwrite(fd, b"ORPHAN", 0)
            code = 0 if pread_exact(fd, 100) == b"ORPHAN data" else 2
        finally:
            os._exit(code)
    os.close(fd)  # parent's copy goes first
    _, status = os.waitpid(pid, 0)
    expect(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
           "child using an inherited fd of an unlinked file failed (wait status %#x)" % status)
    expect_eq(os.listdir(t.dir), [], "listing")
    write_file(f, b"new")
    expect_eq(read_file(f), b"new", "recreated name")


def main(argv=None, prefix=".noopen_coherence"):
    return GATE.main(argv, doc=__doc__, prefix=prefix, elapsed=True)


if __name__ == "__main__":
    sys.exit(main())
