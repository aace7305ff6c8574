#!/usr/bin/env python3
"""POSIX behaviour gate: run filesystem semantics checks inside a directory.

    python3 validation/posix_gate.py DIR [--quick] [-k PATTERN] [--json]
                                         [--timeout-scale F] [--list]

The gate works against ANY mounted directory (ext4, tmpfs, an AgentFS FUSE
mount...). It creates one scratch subdirectory inside DIR, gives every check
its own subdirectory there, and removes everything again at the end.

Every check runs in its own forked child process (its own process group) with
a deadline: a check that hangs is killed and reported as FAIL, it never hangs
the gate. One failing check never affects another.

Output: one line per check, "PASS name" / "FAIL name: why" / "SKIP name: why",
then a final line "N passed, M failed" (", K skipped" appended if any).
Exit status is 0 iff nothing failed. With --json the per-check lines go to
stderr and stdout receives a single JSON document instead.

Expected errnos are the ones Linux/ext4 gives; where that differs from (or is
stricter than) POSIX, the check says so in a comment ("Linux:").

When run as root, behaviour of ordinary users is tested by forking a child
that chdirs into the check directory (so the ancestors of DIR need not be
searchable) and then drops to uid/gid 12345/12346 etc. Without root those
checks are SKIPped.

Standard library only (Python >= 3.8; developed on 3.11).
"""

import ctypes
import ctypes.util
import errno
import mmap
import os
import random
import socket
import stat
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gatekit.py, from any cwd
from gatekit import (  # noqa: E402
    GID_A, GID_B, GID_SHARED, UID_A, UID_B, Gate, Skip, as_user, expect, expect_eq, expect_errno,
    fail, need_root, pattern, pread_exact, pwrite_all, read_file, tick, touch, user_errno,
    user_ok, write_all, write_file)

GATE = Gate(default_timeout=30.0)
check = GATE.check
CHECKS = GATE.checks  # list of (name, function, timeout_seconds)


# --------------------------------------------------------------------------
# libc via ctypes (renameat2, utimensat, fallocate)
# --------------------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
SYS_renameat2 = {"x86_64": 316, "aarch64": 276}.get(os.uname().machine)


def _raise_errno(what, path=None):
    e = ctypes.get_errno()
    raise OSError(e, "%s: %s" % (what, os.strerror(e)), path)


def renameat2(old, new, flags):
    o, n = os.fsencode(old), os.fsencode(new)
    fn = getattr(_libc, "renameat2", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        rc = fn(AT_FDCWD, o, AT_FDCWD, n, flags)
    elif SYS_renameat2 is not None:
        _libc.syscall.restype = ctypes.c_long
        rc = _libc.syscall(ctypes.c_long(SYS_renameat2), ctypes.c_int(AT_FDCWD), o,
                           ctypes.c_int(AT_FDCWD), n, ctypes.c_uint(flags))
    else:
        raise Skip("no renameat2 on this platform")
    if rc != 0:
        _raise_errno("renameat2", old)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def utimensat(path, atime, mtime, flags=0):
    """atime/mtime are (sec, nsec) tuples; nsec may be UTIME_NOW/UTIME_OMIT."""
    ts = (_Timespec * 2)(_Timespec(*atime), _Timespec(*mtime))
    _libc.utimensat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_Timespec), ctypes.c_int]
    if _libc.utimensat(AT_FDCWD, os.fsencode(path), ts, flags) != 0:
        _raise_errno("utimensat", path)


def link_fd(fd, new):
    """linkat(/proc/self/fd/FD, new, AT_SYMLINK_FOLLOW): name an open file."""
    src = ("/proc/self/fd/%d" % fd).encode()
    if _libc.linkat(AT_FDCWD, src, AT_FDCWD, os.fsencode(new), 0x400) != 0:
        _raise_errno("linkat", new)


def fallocate(fd, mode, offset, length):
    _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if _libc.fallocate(fd, mode, offset, length) != 0:
        _raise_errno("fallocate")


# ==========================================================================
# Checks: open / create
# ==========================================================================


@check("open.excl_existing_eexist")
def _(t):
    touch(t.p("f"))
    expect_errno(errno.EEXIST, os.open, t.p("f"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644,
                 what="O_CREAT|O_EXCL on existing file")
    os.mkdir(t.p("d"))
    expect_errno(errno.EEXIST, os.open, t.p("d"), os.O_CREAT | os.O_EXCL | os.O_RDONLY, 0o644,
                 what="O_CREAT|O_EXCL on existing dir")
    # The exclusive create of a fresh name works and yields an empty file.
    fd = os.open(t.p("g"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.close(fd)
    expect_eq(os.stat(t.p("g")).st_size, 0, "size of new file")


@check("open.missing_enoent")
def _(t):
    expect_errno(errno.ENOENT, os.open, t.p("nope"), os.O_RDONLY, what="open missing file")
    expect_errno(errno.ENOENT, os.open, t.p("nodir", "f"), os.O_CREAT | os.O_WRONLY, 0o644,
                 what="O_CREAT with missing parent")
    expect_errno(errno.ENOENT, os.stat, t.p("nope"), what="stat missing")


@check("open.dir_for_write_eisdir")
def _(t):
    os.mkdir(t.p("d"))
    expect_errno(errno.EISDIR, os.open, t.p("d"), os.O_WRONLY, what="open dir O_WRONLY")
    expect_errno(errno.EISDIR, os.open, t.p("d"), os.O_RDWR, what="open dir O_RDWR")
    # Linux: O_CREAT on an existing directory (no O_EXCL) is EISDIR too.
    expect_errno(errno.EISDIR, os.open, t.p("d"), os.O_CREAT | os.O_WRONLY, 0o644,
                 what="O_CREAT|O_WRONLY on dir")
    os.close(os.open(t.p("d"), os.O_RDONLY))


@check("open.component_not_dir_enotdir")
def _(t):
    touch(t.p("f"))
    expect_errno(errno.ENOTDIR, os.open, t.p("f", "x"), os.O_RDONLY, what="open file/x")
    expect_errno(errno.ENOTDIR, os.open, t.p("f", "x"), os.O_CREAT | os.O_WRONLY, 0o644,
                 what="create file/x")
    expect_errno(errno.ENOTDIR, os.stat, t.p("f", "x"), what="stat file/x")
    # Linux: a trailing slash on a non-directory is ENOTDIR.
    expect_errno(errno.ENOTDIR, os.open, t.p("f") + "/", os.O_RDONLY, what="open 'file/'")
    expect_errno(errno.ENOTDIR, os.open, t.p("f"), os.O_RDONLY | os.O_DIRECTORY,
                 what="O_DIRECTORY on file")


@check("open.name_max")
def _(t):
    n255 = "n" * 255
    n256 = "n" * 256
    fd = os.open(t.p(n255), os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"x")
    os.close(fd)
    expect(n255 in os.listdir(t.dir), "255-byte name not in listing")
    expect_eq(read_file(t.p(n255)), b"x", "content of 255-byte-named file")
    os.mkdir(t.p("d" * 255))
    expect_errno(errno.ENAMETOOLONG, os.open, t.p(n256), os.O_CREAT | os.O_WRONLY, 0o644,
                 what="create 256-byte name")
    expect_errno(errno.ENAMETOOLONG, os.mkdir, t.p(n256), what="mkdir 256-byte name")
    expect_errno(errno.ENAMETOOLONG, os.stat, t.p(n256), what="stat 256-byte name")
    expect_errno(errno.ENAMETOOLONG, os.rename, t.p(n255), t.p(n256), what="rename to 256-byte name")
    # Multi-byte UTF-8: 85 x 3-byte chars = 255 bytes is fine.
    u = "\u20ac" * 85
    touch(t.p(u))
    expect(u in os.listdir(t.dir), "255-byte UTF-8 name not in listing")
    os.unlink(t.p(n255))


@check("open.o_trunc")
def _(t):
    write_file(t.p("f"), pattern(5000))
    fd = os.open(t.p("f"), os.O_WRONLY | os.O_TRUNC)
    expect_eq(os.fstat(fd).st_size, 0, "size right after O_TRUNC open")
    os.write(fd, b"ab")
    os.close(fd)
    expect_eq(read_file(t.p("f")), b"ab", "content after O_TRUNC + write")


@check("open.o_append")
def _(t):
    write_file(t.p("f"), b"abc")
    fd = os.open(t.p("f"), os.O_WRONLY | os.O_APPEND)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, b"def")
    expect_eq(os.lseek(fd, 0, os.SEEK_CUR), 6, "offset after appending write")
    os.close(fd)
    # A second appender with its own (stale) view of the size still appends.
    fd1 = os.open(t.p("f"), os.O_WRONLY | os.O_APPEND)
    fd2 = os.open(t.p("f"), os.O_WRONLY | os.O_APPEND)
    os.write(fd1, b"1")
    os.write(fd2, b"2")
    os.close(fd1)
    os.close(fd2)
    expect_eq(read_file(t.p("f")), b"abcdef12", "content after appends")


@check("open.unlink_while_open")
def _(t):
    f = t.p("f")
    write_file(f, b"hello")
    fd = os.open(f, os.O_RDWR)
    try:
        os.unlink(f)
        expect("f" not in os.listdir(t.dir), "unlinked file still listed")
        expect_errno(errno.ENOENT, os.stat, f, what="stat after unlink")
        pwrite_all(fd, b" world", 5)
        expect_eq(pread_exact(fd, 100, 0), b"hello world", "read via fd after unlink")
        st = os.fstat(fd)
        expect_eq(st.st_nlink, 0, "fstat nlink after unlink")
        expect_eq(st.st_size, 11, "fstat size after unlink")
        os.ftruncate(fd, 3)
        expect_eq(pread_exact(fd, 100, 0), b"hel", "read after ftruncate of unlinked file")
        # The name is free again and a new file there is a different file.
        write_file(f, b"new")
        expect_eq(pread_exact(fd, 100, 0), b"hel", "old fd after name reuse")
        expect_eq(read_file(f), b"new", "new file content")
    finally:
        os.close(fd)


@check("open.read_past_eof")
def _(t):
    write_file(t.p("f"), b"0123456789")
    fd = os.open(t.p("f"), os.O_RDONLY)
    try:
        expect_eq(os.pread(fd, 10, 100), b"", "pread far past EOF")
        expect_eq(os.pread(fd, 10, 10), b"", "pread at EOF")
        expect_eq(os.pread(fd, 10, 5), b"56789", "pread spanning EOF")
        os.lseek(fd, 0, os.SEEK_END)
        expect_eq(os.read(fd, 10), b"", "read at EOF")
        os.lseek(fd, 1 << 30, os.SEEK_SET)  # seeking past EOF is allowed
        expect_eq(os.read(fd, 10), b"", "read after seek past EOF")
    finally:
        os.close(fd)


@check("open.create_mode_umask")
def _(t):
    os.umask(0o022)
    fd = os.open(t.p("f"), os.O_CREAT | os.O_WRONLY, 0o666)
    os.close(fd)
    expect_eq(stat.S_IMODE(os.stat(t.p("f")).st_mode), 0o644, "new file mode")
    os.mkdir(t.p("d"), 0o777)
    expect_eq(stat.S_IMODE(os.stat(t.p("d")).st_mode), 0o755, "new dir mode")
    os.umask(0o077)
    touch(t.p("g"), 0o666)
    expect_eq(stat.S_IMODE(os.stat(t.p("g")).st_mode), 0o600, "new file mode (umask 077)")
    os.umask(0o022)
    # The mode given to open applies to the new file even if it lacks write
    # permission; the opening fd can still write.
    fd = os.open(t.p("ro"), os.O_CREAT | os.O_WRONLY, 0o444)
    os.write(fd, b"x")
    os.close(fd)
    expect_eq(stat.S_IMODE(os.stat(t.p("ro")).st_mode), 0o444, "new read-only file mode")
    expect_eq(read_file(t.p("ro")), b"x", "content written via creating fd")


# ==========================================================================
# mkdir / rmdir / unlink
# ==========================================================================


@check("mkdir.eexist")
def _(t):
    os.mkdir(t.p("d"))
    expect_errno(errno.EEXIST, os.mkdir, t.p("d"), what="mkdir existing dir")
    touch(t.p("f"))
    expect_errno(errno.EEXIST, os.mkdir, t.p("f"), what="mkdir over file")
    os.symlink("dangling-target", t.p("l"))
    expect_errno(errno.EEXIST, os.mkdir, t.p("l"), what="mkdir over dangling symlink")


@check("mkdir.enoent_enotdir")
def _(t):
    expect_errno(errno.ENOENT, os.mkdir, t.p("a", "b"), what="mkdir with missing parent")
    touch(t.p("f"))
    expect_errno(errno.ENOTDIR, os.mkdir, t.p("f", "x"), what="mkdir under a file")


@check("mkdir.nlink")
def _(t):
    base = os.stat(t.dir).st_nlink
    os.mkdir(t.p("d"))
    expect_eq(os.stat(t.p("d")).st_nlink, 2, "nlink of new empty dir")
    expect_eq(os.stat(t.dir).st_nlink, base + 1, "parent nlink after mkdir")
    os.mkdir(t.p("d", "sub"))
    expect_eq(os.stat(t.p("d")).st_nlink, 3, "dir nlink with one subdir")
    touch(t.p("d", "file"))
    expect_eq(os.stat(t.p("d")).st_nlink, 3, "dir nlink is not changed by files")
    os.rmdir(t.p("d", "sub"))
    expect_eq(os.stat(t.p("d")).st_nlink, 2, "dir nlink after rmdir of subdir")
    os.unlink(t.p("d", "file"))
    os.rmdir(t.p("d"))
    expect_eq(os.stat(t.dir).st_nlink, base, "parent nlink after rmdir")


@check("rmdir.errors")
def _(t):
    os.makedirs(t.p("d", "sub"))
    expect_errno(errno.ENOTEMPTY, os.rmdir, t.p("d"), what="rmdir dir with subdir")
    os.rmdir(t.p("d", "sub"))
    touch(t.p("d", "f"))
    expect_errno(errno.ENOTEMPTY, os.rmdir, t.p("d"), what="rmdir dir with file")
    expect_errno(errno.ENOENT, os.rmdir, t.p("missing"), what="rmdir missing")
    expect_errno(errno.ENOTDIR, os.rmdir, t.p("d", "f"), what="rmdir of a file")
    expect_errno(errno.ENOTDIR, os.rmdir, t.p("d", "f", "x"), what="rmdir file/x")
    # Linux: rmdir("dir/.") is EINVAL; rmdir("dir/..") is ENOTEMPTY.
    os.mkdir(t.p("e"))
    expect_errno(errno.EINVAL, os.rmdir, t.p("e") + "/.", what="rmdir dir/.")
    expect_errno(errno.ENOTEMPTY, os.rmdir, t.p("e") + "/..", what="rmdir dir/..")
    os.symlink("e", t.p("le"))
    expect_errno(errno.ENOTDIR, os.rmdir, t.p("le"), what="rmdir of symlink to dir")
    os.rmdir(t.p("e"))
    expect(not os.path.lexists(t.p("e")), "dir still there after rmdir")


@check("unlink.errors")
def _(t):
    os.mkdir(t.p("d"))
    # Linux: unlink of a directory is EISDIR (POSIX says EPERM).
    expect_errno(errno.EISDIR, os.unlink, t.p("d"), what="unlink dir")
    expect_errno(errno.ENOENT, os.unlink, t.p("missing"), what="unlink missing")
    touch(t.p("f"))
    expect_errno(errno.ENOTDIR, os.unlink, t.p("f") + "/", what="unlink 'file/'")
    expect_errno(errno.ENOTDIR, os.unlink, t.p("f", "x"), what="unlink file/x")
    # Unlinking a symlink removes the link, not the target.
    os.symlink("f", t.p("l"))
    os.unlink(t.p("l"))
    expect(os.path.exists(t.p("f")), "unlink of symlink removed its target")


# ==========================================================================
# rename / renameat2
# ==========================================================================


@check("rename.file_replaces_file")
def _(t):
    write_file(t.p("a"), b"AAA")
    write_file(t.p("b"), b"BBBBBB")
    ino = os.stat(t.p("a")).st_ino
    os.rename(t.p("a"), t.p("b"))
    expect(not os.path.lexists(t.p("a")), "source still exists")
    expect_eq(read_file(t.p("b")), b"AAA", "target content")
    expect_eq(os.stat(t.p("b")).st_ino, ino, "target inode")
    expect_eq(sorted(os.listdir(t.dir)), ["b"], "listing")


@check("rename.dir_over_empty_dir")
def _(t):
    os.makedirs(t.p("a", "inner"))
    os.mkdir(t.p("b"))
    base = os.stat(t.dir).st_nlink
    os.rename(t.p("a"), t.p("b"))
    expect(not os.path.lexists(t.p("a")), "source dir still exists")
    expect(os.path.isdir(t.p("b", "inner")), "contents not moved")
    expect_eq(os.stat(t.dir).st_nlink, base - 1, "parent nlink (one dir fewer)")


@check("rename.dir_errors")
def _(t):
    os.mkdir(t.p("a"))
    os.makedirs(t.p("full", "x"))
    touch(t.p("f"))
    # Linux/ext4 say ENOTEMPTY (POSIX also allows EEXIST).
    expect_errno(errno.ENOTEMPTY, os.rename, t.p("a"), t.p("full"), what="dir over non-empty dir")
    expect_errno(errno.ENOTDIR, os.rename, t.p("a"), t.p("f"), what="dir over file")
    expect_errno(errno.EISDIR, os.rename, t.p("f"), t.p("a"), what="file over dir")
    os.makedirs(t.p("a", "b", "c"))
    expect_errno(errno.EINVAL, os.rename, t.p("a"), t.p("a", "b", "c", "d"), what="dir into own subdir")
    expect_errno(errno.EINVAL, os.rename, t.p("a"), t.p("a", "x"), what="dir into itself")
    expect_errno(errno.ENOENT, os.rename, t.p("missing"), t.p("z"), what="rename missing source")
    expect_errno(errno.ENOENT, os.rename, t.p("f"), t.p("nodir", "z"), what="rename into missing dir")
    expect_errno(errno.ENOTDIR, os.rename, t.p("f"), t.p("f", "z"), what="rename under a file")
    # Everything is still where it was.
    expect(os.path.isdir(t.p("a", "b", "c")) and os.path.isdir(t.p("full", "x"))
           and os.path.isfile(t.p("f")), "tree changed by failed renames")


@check("rename.same_name_and_hardlinks_noop")
def _(t):
    write_file(t.p("a"), b"data")
    os.rename(t.p("a"), t.p("a"))
    expect_eq(read_file(t.p("a")), b"data", "content after rename to itself")
    os.link(t.p("a"), t.p("b"))
    # POSIX: if old and new are links to the same file, rename does nothing.
    os.rename(t.p("a"), t.p("b"))
    expect(os.path.exists(t.p("a")) and os.path.exists(t.p("b")), "a hard link vanished")
    expect_eq(os.stat(t.p("a")).st_nlink, 2, "nlink")


@check("rename.dir_nlink_and_dotdot")
def _(t):
    os.makedirs(t.p("p1", "child"))
    os.mkdir(t.p("p2"))
    n1, n2 = os.stat(t.p("p1")).st_nlink, os.stat(t.p("p2")).st_nlink
    os.rename(t.p("p1", "child"), t.p("p2", "child"))
    expect_eq(os.stat(t.p("p1")).st_nlink, n1 - 1, "old parent nlink")
    expect_eq(os.stat(t.p("p2")).st_nlink, n2 + 1, "new parent nlink")
    expect_eq(os.stat(t.p("p2", "child", "..")).st_ino, os.stat(t.p("p2")).st_ino,
              "'..' of moved dir")


@check("rename.across_dirs_keeps_inode")
def _(t):
    os.mkdir(t.p("x"))
    os.mkdir(t.p("y"))
    write_file(t.p("x", "f"), pattern(10000))
    ino = os.stat(t.p("x", "f")).st_ino
    os.rename(t.p("x", "f"), t.p("y", "g"))
    expect_eq(os.listdir(t.p("x")), [], "old dir listing")
    expect_eq(os.listdir(t.p("y")), ["g"], "new dir listing")
    expect_eq(os.stat(t.p("y", "g")).st_ino, ino, "inode after rename")
    expect_eq(read_file(t.p("y", "g")), pattern(10000), "content after rename")


@check("renameat2.noreplace")
def _(t):
    write_file(t.p("a"), b"A")
    write_file(t.p("b"), b"B")
    # Note: the VFS itself refuses an existing target with EEXIST before the
    # filesystem is asked, so the rename to a fresh name below is the part
    # that shows whether the filesystem supports the flag (else EINVAL).
    expect_errno(errno.EEXIST, renameat2, t.p("a"), t.p("b"), RENAME_NOREPLACE,
                 what="RENAME_NOREPLACE onto existing")
    expect_eq((read_file(t.p("a")), read_file(t.p("b"))), (b"A", b"B"), "contents after refused rename")
    renameat2(t.p("a"), t.p("c"), RENAME_NOREPLACE)
    expect(not os.path.lexists(t.p("a")), "source still there")
    expect_eq(read_file(t.p("c")), b"A", "renamed content")


@check("renameat2.exchange")
def _(t):
    write_file(t.p("f"), b"file")
    os.mkdir(t.p("d"))
    touch(t.p("d", "inside"))
    fi, di = os.stat(t.p("f")).st_ino, os.stat(t.p("d")).st_ino
    renameat2(t.p("f"), t.p("d"), RENAME_EXCHANGE)  # EINVAL here = flag unsupported: FAIL
    expect(os.path.isdir(t.p("f")) and os.path.isfile(t.p("d")), "types not swapped")
    expect_eq(os.stat(t.p("f")).st_ino, di, "inode now at 'f'")
    expect_eq(os.stat(t.p("d")).st_ino, fi, "inode now at 'd'")
    expect_eq(read_file(t.p("d")), b"file", "file content after exchange")
    expect_eq(os.listdir(t.p("f")), ["inside"], "dir content after exchange")
    expect_errno(errno.ENOENT, renameat2, t.p("d"), t.p("missing"), RENAME_EXCHANGE,
                 what="RENAME_EXCHANGE with missing target")
    expect_errno(errno.ENOENT, renameat2, t.p("missing"), t.p("d"), RENAME_EXCHANGE,
                 what="RENAME_EXCHANGE with missing source")
    # Exchange across directories moves '..' too.
    os.mkdir(t.p("p"))
    os.mkdir(t.p("p", "sub"))
    renameat2(t.p("f"), t.p("p", "sub"), RENAME_EXCHANGE)
    expect_eq(os.listdir(t.p("p", "sub")), ["inside"], "dir moved by exchange")
    expect_eq(os.stat(t.p("p", "sub", "..")).st_ino, os.stat(t.p("p")).st_ino, "'..' after exchange")


@check("renameat2.both_flags_einval")
def _(t):
    touch(t.p("a"))
    touch(t.p("b"))
    expect_errno(errno.EINVAL, renameat2, t.p("a"), t.p("b"), RENAME_NOREPLACE | RENAME_EXCHANGE,
                 what="NOREPLACE|EXCHANGE")
    expect(os.path.exists(t.p("a")) and os.path.exists(t.p("b")), "files changed")


# ==========================================================================
# link
# ==========================================================================


@check("link.nlink_counts")
def _(t):
    write_file(t.p("a"), b"x")
    os.link(t.p("a"), t.p("b"))
    expect_eq(os.stat(t.p("a")).st_nlink, 2, "nlink after 1 link")
    expect_eq(os.stat(t.p("a")).st_ino, os.stat(t.p("b")).st_ino, "same inode")
    os.mkdir(t.p("sub"))
    os.link(t.p("a"), t.p("sub", "c"))
    expect_eq(os.stat(t.p("b")).st_nlink, 3, "nlink after 2 links")
    os.unlink(t.p("a"))
    expect_eq(os.stat(t.p("b")).st_nlink, 2, "nlink after unlink")
    os.unlink(t.p("sub", "c"))
    expect_eq(os.stat(t.p("b")).st_nlink, 1, "nlink after 2 unlinks")
    expect_eq(read_file(t.p("b")), b"x", "content of surviving link")


@check("link.errors")
def _(t):
    os.mkdir(t.p("d"))
    # Hard links to directories are not allowed: EPERM on Linux.
    expect_errno(errno.EPERM, os.link, t.p("d"), t.p("d2"), what="link to dir")
    touch(t.p("a"))
    touch(t.p("b"))
    expect_errno(errno.EEXIST, os.link, t.p("a"), t.p("b"), what="link to existing name")
    expect_errno(errno.ENOENT, os.link, t.p("missing"), t.p("c"), what="link missing source")
    expect_errno(errno.ENOENT, os.link, t.p("a"), t.p("nodir", "c"), what="link into missing dir")


@check("link.data_shared_and_ctime")
def _(t):
    write_file(t.p("a"), b"one")
    c0 = os.stat(t.p("a")).st_ctime_ns
    tick()
    os.link(t.p("a"), t.p("b"))
    expect(os.stat(t.p("a")).st_ctime_ns > c0, "ctime did not change on link")
    fd = os.open(t.p("b"), os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"two")
    os.close(fd)
    expect_eq(read_file(t.p("a")), b"onetwo", "data via the other name")
    c1 = os.stat(t.p("a")).st_ctime_ns
    tick()
    os.unlink(t.p("b"))
    expect(os.stat(t.p("a")).st_ctime_ns > c1, "ctime did not change on unlink of a link")


# ==========================================================================
# symlink
# ==========================================================================


@check("symlink.readlink_lstat_stat")
def _(t):
    write_file(t.p("target"), b"12345")
    os.symlink("target", t.p("l"))
    os.symlink("../" + os.path.basename(t.dir) + "/target", t.p("l2"))
    expect_eq(os.readlink(t.p("l")), "target", "readlink")
    lst = os.lstat(t.p("l"))
    expect(stat.S_ISLNK(lst.st_mode), "lstat is not a symlink")
    # Linux: a symlink's st_size is the length of its target.
    expect_eq(lst.st_size, len("target"), "symlink st_size")
    st = os.stat(t.p("l"))
    expect(stat.S_ISREG(st.st_mode), "stat through symlink is not a regular file")
    expect_eq(st.st_ino, os.stat(t.p("target")).st_ino, "stat through symlink inode")
    expect_eq(read_file(t.p("l2")), b"12345", "read through relative symlink")
    os.mkdir(t.p("d"))
    touch(t.p("d", "inner"))
    os.symlink("d", t.p("ld"))
    expect_eq(os.listdir(t.p("ld")), ["inner"], "listing through dir symlink")
    expect(os.path.isfile(t.p("ld", "inner")), "path through dir symlink")
    expect_errno(errno.EEXIST, os.symlink, "x", t.p("l"), what="symlink over existing name")


@check("symlink.dangling")
def _(t):
    os.symlink("does-not-exist", t.p("l"))
    expect(stat.S_ISLNK(os.lstat(t.p("l")).st_mode), "lstat of dangling symlink")
    expect_errno(errno.ENOENT, os.stat, t.p("l"), what="stat dangling symlink")
    expect_errno(errno.ENOENT, os.open, t.p("l"), os.O_RDONLY, what="open dangling symlink")
    expect("l" in os.listdir(t.dir), "dangling symlink not listed")
    # Linux: O_CREAT|O_EXCL never follows a symlink, even a dangling one.
    expect_errno(errno.EEXIST, os.open, t.p("l"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644,
                 what="O_CREAT|O_EXCL on dangling symlink")
    # Linux: plain O_CREAT through a dangling symlink creates its target
    # (fs.protected_symlinks only matters in sticky world-writable dirs).
    fd = os.open(t.p("l"), os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"hi")
    os.close(fd)
    expect_eq(read_file(t.p("does-not-exist")), b"hi", "target created through symlink")


@check("symlink.loop_eloop")
def _(t):
    os.symlink("b", t.p("a"))
    os.symlink("a", t.p("b"))
    os.symlink("self", t.p("self"))
    expect_errno(errno.ELOOP, os.open, t.p("a"), os.O_RDONLY, what="open symlink loop")
    expect_errno(errno.ELOOP, os.stat, t.p("self"), what="stat self-loop")
    expect_errno(errno.ELOOP, os.open, t.p("self", "x"), os.O_RDONLY, what="path through a loop")
    touch(t.p("f"))
    os.symlink("f", t.p("lf"))
    expect_errno(errno.ELOOP, os.open, t.p("lf"), os.O_RDONLY | os.O_NOFOLLOW, what="O_NOFOLLOW on symlink")


@check("symlink.long_target")
def _(t):
    target = ("x" * 199 + "/") * 21
    target = target[:4095]
    expect_eq(len(target), 4095, "target length")
    os.symlink(target, t.p("long"))
    expect_eq(os.readlink(t.p("long")), target, "readlink of 4095-byte target")
    expect_eq(os.lstat(t.p("long")).st_size, 4095, "st_size of 4095-byte symlink")
    # Linux: a target of PATH_MAX (4096) bytes or more is ENAMETOOLONG.
    expect_errno(errno.ENAMETOOLONG, os.symlink, target + "y", t.p("toolong"),
                 what="symlink with 4096-byte target")
    # Short targets of every small length round-trip (inline vs block storage).
    for n in (1, 59, 60, 61, 255, 256, 1000):
        os.symlink("t" * n, t.p("s%d" % n))
        expect_eq(os.readlink(t.p("s%d" % n)), "t" * n, "readlink of %d-byte target" % n)


@check("symlink.readlink_non_symlink_einval")
def _(t):
    touch(t.p("f"))
    os.mkdir(t.p("d"))
    expect_errno(errno.EINVAL, os.readlink, t.p("f"), what="readlink on file")
    expect_errno(errno.EINVAL, os.readlink, t.p("d"), what="readlink on dir")
    expect_errno(errno.ENOENT, os.readlink, t.p("missing"), what="readlink on missing")


# ==========================================================================
# mknod: fifo, device, socket
# ==========================================================================


@check("mknod.fifo")
def _(t):
    os.mkfifo(t.p("fifo"), 0o600)
    st = os.lstat(t.p("fifo"))
    expect(stat.S_ISFIFO(st.st_mode), "not a FIFO: mode %o" % st.st_mode)
    expect_eq(stat.S_IMODE(st.st_mode), 0o600, "fifo mode")
    # The FIFO works as a pipe (this is kernel pipe code, the FS only stores it).
    r = os.open(t.p("fifo"), os.O_RDONLY | os.O_NONBLOCK)
    w = os.open(t.p("fifo"), os.O_WRONLY | os.O_NONBLOCK)
    os.write(w, b"through the fifo")
    expect_eq(os.read(r, 100), b"through the fifo", "data through fifo")
    os.close(w)
    os.close(r)
    expect_errno(errno.EEXIST, os.mkfifo, t.p("fifo"), what="mkfifo over existing")
    expect_eq(os.lstat(t.p("fifo")).st_size, 0, "fifo size")


@check("mknod.devices")
def _(t):
    need_root()
    os.mknod(t.p("null"), stat.S_IFCHR | 0o666, os.makedev(1, 3))
    st = os.lstat(t.p("null"))
    expect(stat.S_ISCHR(st.st_mode), "not a char device: mode %o" % st.st_mode)
    expect_eq(st.st_rdev, os.makedev(1, 3), "char device rdev")
    expect_eq(stat.S_IMODE(st.st_mode), 0o644, "char device mode (umask 022)")
    os.mknod(t.p("blk"), stat.S_IFBLK | 0o600, os.makedev(7, 200))
    st = os.lstat(t.p("blk"))
    expect(stat.S_ISBLK(st.st_mode), "not a block device")
    expect_eq((os.major(st.st_rdev), os.minor(st.st_rdev)), (7, 200), "block device major/minor")
    # Large major/minor numbers survive (new-style dev_t encoding).
    os.mknod(t.p("big"), stat.S_IFCHR | 0o600, os.makedev(300, 70000))
    st = os.lstat(t.p("big"))
    expect_eq((os.major(st.st_rdev), os.minor(st.st_rdev)), (300, 70000), "large major/minor")
    # A plain regular file via mknod.
    os.mknod(t.p("reg"), stat.S_IFREG | 0o600)
    expect(stat.S_ISREG(os.lstat(t.p("reg")).st_mode), "mknod S_IFREG is not regular")


@check("mknod.unix_socket")
def _(t):
    # sun_path is limited to 108 bytes, so bind a name relative to the cwd.
    os.chdir(t.dir)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind("sock")
        srv.listen(1)
        st = os.lstat(t.p("sock"))
        expect(stat.S_ISSOCK(st.st_mode), "bound name is not a socket: mode %o" % st.st_mode)
        cli.settimeout(5)
        cli.connect("sock")
        conn, _ = srv.accept()
        cli.sendall(b"ping")
        conn.settimeout(5)
        expect_eq(conn.recv(10), b"ping", "data through unix socket")
        conn.close()
        # Binding an existing name fails with EADDRINUSE.
        s3 = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            expect_errno(errno.EADDRINUSE, s3.bind, "sock", what="bind existing socket name")
        finally:
            s3.close()
    finally:
        cli.close()
        srv.close()
        os.chdir("/")


# ==========================================================================
# chmod / chown / utime
# ==========================================================================


@check("chmod.mode_bits")
def _(t):
    touch(t.p("f"))
    for mode in (0o000, 0o644, 0o4755, 0o2755, 0o1755, 0o7777, 0o0777, 0o4000):
        os.chmod(t.p("f"), mode)
        expect_eq(stat.S_IMODE(os.stat(t.p("f")).st_mode), mode, "file mode")
    os.mkdir(t.p("d"))
    for mode in (0o1777, 0o3775, 0o2700, 0o0000, 0o755):
        os.chmod(t.p("d"), mode)
        st = os.stat(t.p("d"))
        expect_eq(stat.S_IMODE(st.st_mode), mode, "dir mode")
        expect(stat.S_ISDIR(st.st_mode), "dir type lost after chmod")
    # chmod follows symlinks.
    os.symlink("f", t.p("l"))
    os.chmod(t.p("l"), 0o600)
    expect_eq(stat.S_IMODE(os.stat(t.p("f")).st_mode), 0o600, "mode of symlink target")


@check("chmod.ctime_advances")
def _(t):
    touch(t.p("f"))
    st0 = os.stat(t.p("f"))
    tick()
    os.chmod(t.p("f"), 0o600)
    st1 = os.stat(t.p("f"))
    expect(st1.st_ctime_ns > st0.st_ctime_ns, "ctime did not advance on chmod")
    expect_eq(st1.st_mtime_ns, st0.st_mtime_ns, "mtime changed by chmod")


@check("chown.root")
def _(t):
    need_root()
    touch(t.p("f"))
    os.chown(t.p("f"), UID_A, GID_SHARED)
    st = os.stat(t.p("f"))
    expect_eq((st.st_uid, st.st_gid), (UID_A, GID_SHARED), "owner after chown")
    os.chown(t.p("f"), -1, GID_A)
    st = os.stat(t.p("f"))
    expect_eq((st.st_uid, st.st_gid), (UID_A, GID_A), "owner after chgrp only")
    os.chown(t.p("f"), UID_B, -1)
    st = os.stat(t.p("f"))
    expect_eq((st.st_uid, st.st_gid), (UID_B, GID_A), "owner after chown uid only")
    # lchown changes the link, not the target.
    os.symlink("f", t.p("l"))
    os.lchown(t.p("l"), UID_A, GID_A)
    expect_eq(os.lstat(t.p("l")).st_uid, UID_A, "symlink owner after lchown")
    expect_eq(os.stat(t.p("f")).st_uid, UID_B, "target owner after lchown")
    c0 = os.stat(t.p("f")).st_ctime_ns
    tick()
    os.chown(t.p("f"), 0, 0)
    expect(os.stat(t.p("f")).st_ctime_ns > c0, "ctime did not advance on chown")


@check("chown.clears_setid_bits")
def _(t):
    need_root()
    touch(t.p("f"))
    # Linux: chown of a regular file clears S_ISUID, and S_ISGID when group
    # execute is set, even when done by root.
    os.chmod(t.p("f"), 0o6755)
    os.chown(t.p("f"), UID_A, GID_A)
    expect_eq(stat.S_IMODE(os.stat(t.p("f")).st_mode), 0o755, "mode after chown of 06755 file")
    # S_ISGID without group-exec means mandatory locking: it is kept.
    os.chmod(t.p("f"), 0o2644)
    os.chown(t.p("f"), UID_B, GID_B)
    expect_eq(stat.S_IMODE(os.stat(t.p("f")).st_mode), 0o2644, "mode after chown of 02644 file")


@check("chmod.user_permissions")
def _(t):
    need_root()  # switches to ordinary uids
    touch(t.p("mine"))
    os.chown(t.p("mine"), UID_A, GID_A)
    touch(t.p("other"))  # owned by root
    user_ok(lambda: os.chmod("mine", 0o600), "chmod own file", cwd=t.dir)
    expect_eq(stat.S_IMODE(os.stat(t.p("mine")).st_mode), 0o600, "mode after user chmod")
    user_errno(errno.EPERM, lambda: os.chmod("other", 0o777), "chmod of root's file", cwd=t.dir)
    expect_eq(stat.S_IMODE(os.stat(t.p("other")).st_mode), 0o644, "mode of root's file")
    # Linux: a non-member owner setting S_ISGID has the bit silently cleared.
    os.chown(t.p("mine"), UID_A, GID_SHARED)
    user_ok(lambda: os.chmod("mine", 0o2755), "chmod g+s of own file (not in group)", cwd=t.dir)
    expect_eq(stat.S_IMODE(os.stat(t.p("mine")).st_mode), 0o755, "mode after non-member chmod g+s")


@check("chown.user_permissions")
def _(t):
    need_root()  # switches to ordinary uids
    touch(t.p("mine"))
    os.chown(t.p("mine"), UID_A, GID_A)
    touch(t.p("other"))
    user_errno(errno.EPERM, lambda: os.chown("mine", UID_B, -1), "give own file away", cwd=t.dir)
    user_errno(errno.EPERM, lambda: os.chown("other", UID_A, GID_A), "chown root's file", cwd=t.dir)
    user_errno(errno.EPERM, lambda: os.chown("mine", -1, GID_SHARED), "chgrp to non-member group",
               cwd=t.dir)
    # The owner may change the group to any group they are a member of.
    user_ok(lambda: os.chown("mine", -1, GID_SHARED), "chgrp to member group", cwd=t.dir,
            groups=(GID_SHARED,))
    st = os.stat(t.p("mine"))
    expect_eq((st.st_uid, st.st_gid), (UID_A, GID_SHARED), "owner after member chgrp")
    # chown to the current owner/group is a permitted no-op.
    user_ok(lambda: os.chown("mine", UID_A, -1), "chown to self", cwd=t.dir)


@check("utime.ns_exact")
def _(t):
    touch(t.p("f"))
    for at, mt in ((1_600_000_000_123_456_789, 1_500_000_000_987_654_321),
                   (1, 999_999_999),
                   (4_000_000_000_000_000_001, 2_000_000_000_000_000_000)):
        os.utime(t.p("f"), ns=(at, mt))
        st = os.stat(t.p("f"))
        expect_eq((st.st_atime_ns, st.st_mtime_ns), (at, mt), "atime/mtime ns")
    os.mkdir(t.p("d"))
    os.utime(t.p("d"), ns=(123_000_000_456, 789_000_000_012))
    st = os.stat(t.p("d"))
    expect_eq((st.st_atime_ns, st.st_mtime_ns), (123_000_000_456, 789_000_000_012), "dir atime/mtime ns")
    # Symlink's own times (lutimes) leave the target alone.
    os.symlink("f", t.p("l"))
    os.utime(t.p("l"), ns=(5_000_000_005, 6_000_000_006), follow_symlinks=False)
    expect_eq(os.lstat(t.p("l")).st_mtime_ns, 6_000_000_006, "symlink mtime")
    expect_eq(os.stat(t.p("f")).st_mtime_ns, 2_000_000_000_000_000_000, "target mtime untouched")


@check("utime.pre_epoch")
def _(t):
    touch(t.p("f"))
    at, mt = -1_000_000_000_500_000_000, -86_400_000_000_001
    os.utime(t.p("f"), ns=(at, mt))
    st = os.stat(t.p("f"))
    expect_eq((st.st_atime_ns, st.st_mtime_ns), (at, mt), "pre-1970 atime/mtime ns")


@check("utime.now")
def _(t):
    touch(t.p("f"))
    os.utime(t.p("f"), ns=(1_000_000_000, 1_000_000_000))
    before = time.time_ns()
    os.utime(t.p("f"), None)
    after = time.time_ns()
    st = os.stat(t.p("f"))
    # File timestamps use a coarse clock that may lag time.time() by a tick.
    slack = 1_000_000_000
    for what, v in (("atime", st.st_atime_ns), ("mtime", st.st_mtime_ns)):
        expect(before - slack <= v <= after + slack, "utime(None) %s %d not near now %d" % (what, v, before))


@check("utime.omit_and_now")
def _(t):
    touch(t.p("f"))
    os.utime(t.p("f"), ns=(111_000_000_111, 222_000_000_222))
    utimensat(t.p("f"), (0, UTIME_OMIT), (333, 444))
    st = os.stat(t.p("f"))
    expect_eq((st.st_atime_ns, st.st_mtime_ns), (111_000_000_111, 333_000_000_444), "after UTIME_OMIT atime")
    utimensat(t.p("f"), (555, 666), (0, UTIME_OMIT))
    st = os.stat(t.p("f"))
    expect_eq((st.st_atime_ns, st.st_mtime_ns), (555_000_000_666, 333_000_000_444), "after UTIME_OMIT mtime")
    c0 = st.st_ctime_ns
    tick()
    before = time.time_ns()
    utimensat(t.p("f"), (0, UTIME_NOW), (0, UTIME_OMIT))
    st = os.stat(t.p("f"))
    expect(abs(st.st_atime_ns - before) < 1_000_000_000, "UTIME_NOW atime not near now")
    expect_eq(st.st_mtime_ns, 333_000_000_444, "mtime after UTIME_NOW atime/UTIME_OMIT mtime")
    expect(st.st_ctime_ns > c0, "ctime did not advance on utimensat")


@check("utime.user_permissions")
def _(t):
    need_root()  # switches to ordinary uids
    touch(t.p("rw"), 0o666)
    os.chmod(t.p("rw"), 0o666)
    touch(t.p("ro"), 0o644)
    # Non-owner with write access may set "now" but not explicit times.
    user_ok(lambda: os.utime("rw", None), "utime(None) with write access", cwd=t.dir)
    user_errno(errno.EPERM, lambda: os.utime("rw", ns=(1, 1)), "explicit utime as non-owner", cwd=t.dir)
    user_errno(errno.EACCES, lambda: os.utime("ro", None), "utime(None) without write access", cwd=t.dir)
    os.chown(t.p("ro"), UID_A, GID_A)
    user_ok(lambda: os.utime("ro", ns=(7, 8)), "explicit utime as owner", cwd=t.dir)
    expect_eq(os.stat(t.p("ro")).st_mtime_ns, 8, "mtime set by owner")


# ==========================================================================
# Permissions for an ordinary user
# ==========================================================================


@check("perm.user_can_use_mount")
def _(t):
    need_root()  # switches to ordinary uids
    os.chmod(t.dir, 0o755)
    touch(t.p("f"))
    res = as_user(lambda: (os.stat("f").st_size, os.listdir(".")), cwd=t.dir)
    if res[0] != "ok":
        fail("uid %d cannot even stat/list a 0755 directory: %s (FUSE mount without allow_other?)"
             % (UID_A, res[1:]))


@check("perm.no_read_no_write_eacces")
def _(t):
    need_root()  # switches to ordinary uids
    write_file(t.p("secret"), b"s", mode=0o600)
    os.chmod(t.p("secret"), 0o600)
    user_errno(errno.EACCES, lambda: os.open("secret", os.O_RDONLY), "open 0600 root file", cwd=t.dir)
    user_errno(errno.EACCES, lambda: os.open("secret", os.O_WRONLY), "open 0600 root file O_WRONLY",
               cwd=t.dir)
    write_file(t.p("ro"), b"r", mode=0o644)
    os.chown(t.p("ro"), UID_A, GID_A)
    os.chmod(t.p("ro"), 0o444)
    user_errno(errno.EACCES, lambda: os.open("ro", os.O_WRONLY), "write own 0444 file", cwd=t.dir)
    user_errno(errno.EACCES, lambda: os.truncate("ro", 0), "truncate own 0444 file", cwd=t.dir)
    expect_eq(user_ok(lambda: read_file("ro"), "read own 0444 file", cwd=t.dir), b"r", "content")
    # Group and other bits are honoured separately.
    os.chown(t.p("secret"), 0, GID_SHARED)
    os.chmod(t.p("secret"), 0o640)
    expect_eq(user_ok(lambda: read_file("secret"), "read 0640 file as group member", cwd=t.dir,
                      groups=(GID_SHARED,)), b"s", "content read via group")
    user_errno(errno.EACCES, lambda: read_file("secret"), "read 0640 file as non-member", cwd=t.dir)
    # Owner bits win over more generous group/other bits.
    os.chown(t.p("secret"), UID_A, GID_A)
    os.chmod(t.p("secret"), 0o066)
    user_errno(errno.EACCES, lambda: read_file("secret"), "owner read of 0066 file", cwd=t.dir)


@check("perm.no_write_on_dir_eacces")
def _(t):
    need_root()  # switches to ordinary uids
    os.mkdir(t.p("d"), 0o755)
    os.chmod(t.p("d"), 0o755)
    touch(t.p("d", "f"), 0o666)
    os.chmod(t.p("d", "f"), 0o666)
    user_errno(errno.EACCES, lambda: os.open("d/new", os.O_CREAT | os.O_WRONLY, 0o644),
               "create in 0755 root dir", cwd=t.dir)
    user_errno(errno.EACCES, lambda: os.mkdir("d/sub"), "mkdir in 0755 root dir", cwd=t.dir)
    user_errno(errno.EACCES, lambda: os.unlink("d/f"), "unlink in 0755 root dir", cwd=t.dir)
    user_errno(errno.EACCES, lambda: os.rename("d/f", "d/g"), "rename in 0755 root dir", cwd=t.dir)
    user_errno(errno.EACCES, lambda: os.symlink("x", "d/l"), "symlink in 0755 root dir", cwd=t.dir)
    # ...but writing an existing world-writable file in it is fine.
    user_ok(lambda: write_file("d/f", b"ok"), "write 0666 file in 0755 dir", cwd=t.dir)
    expect_eq(read_file(t.p("d", "f")), b"ok", "content written by user")


@check("perm.no_search_on_dir_eacces")
def _(t):
    need_root()  # switches to ordinary uids
    os.mkdir(t.p("d"))
    touch(t.p("d", "f"), 0o644)
    os.chmod(t.p("d"), 0o744)  # r but no x for others
    user_errno(errno.EACCES, lambda: os.stat("d/f"), "stat through dir without x", cwd=t.dir)
    user_errno(errno.EACCES, lambda: os.open("d/f", os.O_RDONLY), "open through dir without x", cwd=t.dir)
    user_errno(errno.EACCES, lambda: os.chdir("d"), "chdir into dir without x", cwd=t.dir)
    # Reading the names needs only r.
    expect_eq(user_ok(lambda: os.listdir("d"), "list dir with r only", cwd=t.dir), ["f"], "listing")
    os.chmod(t.p("d"), 0o711)  # x but no r for others
    user_errno(errno.EACCES, lambda: os.listdir("d"), "list dir with x only", cwd=t.dir)
    user_ok(lambda: os.stat("d/f"), "stat known name in x-only dir", cwd=t.dir)


@check("perm.sticky_dir")
def _(t):
    need_root()  # switches to ordinary uids
    os.mkdir(t.p("tmp"))
    os.chmod(t.p("tmp"), 0o1777)

    def create_as_a():
        write_file("tmp/a_file", b"A", mode=0o666)
        os.mkdir("tmp/a_dir")

    user_ok(create_as_a, "user A create in sticky dir", cwd=t.dir)
    os.chmod(t.p("tmp", "a_file"), 0o666)
    # Sticky bit: B may write A's world-writable file but not remove/rename it.
    user_errno(errno.EPERM, lambda: os.unlink("tmp/a_file"), "user B unlink A's file",
               uid=UID_B, gid=GID_B, cwd=t.dir)
    user_errno(errno.EPERM, lambda: os.rename("tmp/a_file", "tmp/b_name"), "user B rename A's file",
               uid=UID_B, gid=GID_B, cwd=t.dir)
    user_errno(errno.EPERM, lambda: os.rmdir("tmp/a_dir"), "user B rmdir A's dir",
               uid=UID_B, gid=GID_B, cwd=t.dir)

    def b_replaces():
        write_file("tmp/b_file", b"B")
        os.rename("tmp/b_file", "tmp/a_file")

    user_errno(errno.EPERM, b_replaces, "user B rename over A's file", uid=UID_B, gid=GID_B, cwd=t.dir)
    expect_eq(read_file(t.p("tmp", "a_file")), b"A", "A's file after B's attempts")
    user_ok(lambda: os.unlink("tmp/a_file"), "owner unlink in sticky dir", cwd=t.dir)
    user_ok(lambda: os.rmdir("tmp/a_dir"), "owner rmdir in sticky dir", cwd=t.dir)
    # Root (CAP_FOWNER) may remove anything.
    user_ok(lambda: touch("tmp/b_file"), "user B create in sticky dir", uid=UID_B, gid=GID_B, cwd=t.dir)
    os.unlink(t.p("tmp", "b_file"))


@check("perm.setgid_dir_inheritance")
def _(t):
    need_root()
    os.mkdir(t.p("sg"))
    os.chown(t.p("sg"), 0, GID_SHARED)
    os.chmod(t.p("sg"), 0o2777)
    touch(t.p("sg", "root_file"))
    os.mkdir(t.p("sg", "root_sub"))
    expect_eq(os.stat(t.p("sg", "root_file")).st_gid, GID_SHARED, "gid of root's file in setgid dir")
    st = os.stat(t.p("sg", "root_sub"))
    expect_eq(st.st_gid, GID_SHARED, "gid of subdir in setgid dir")
    expect(st.st_mode & stat.S_ISGID, "subdir did not inherit the setgid bit")

    def user_creates():
        touch("sg/user_file")
        os.mkdir("sg/user_sub")
        os.mkdir("sg/user_sub/deeper")

    user_ok(user_creates, "user create in setgid dir", cwd=t.dir)
    st = os.stat(t.p("sg", "user_file"))
    expect_eq((st.st_uid, st.st_gid), (UID_A, GID_SHARED), "owner of user's file in setgid dir")
    for sub in ("user_sub", "user_sub/deeper"):
        st = os.stat(t.p("sg", sub))
        expect_eq((st.st_uid, st.st_gid), (UID_A, GID_SHARED), "owner of %s" % sub)
        expect(st.st_mode & stat.S_ISGID, "%s did not inherit the setgid bit" % sub)


@check("perm.new_file_owner")
def _(t):
    need_root()  # switches to ordinary uids
    os.chmod(t.dir, 0o777)

    def create():
        touch("u_file")
        os.mkdir("u_dir")
        os.symlink("u_file", "u_link")
        os.mkfifo("u_fifo")

    user_ok(create, "create as user", cwd=t.dir)
    for n in ("u_file", "u_dir", "u_link", "u_fifo"):
        st = os.lstat(t.p(n))
        expect_eq((st.st_uid, st.st_gid), (UID_A, GID_A), "uid/gid of %s" % n)
    os.chmod(t.dir, 0o755)


@check("perm.write_clears_setid")
def _(t):
    need_root()
    write_file(t.p("f"), b"x")
    os.chown(t.p("f"), UID_A, GID_A)
    os.chmod(t.p("f"), 0o6777)
    # Linux: a write by a process without CAP_FSETID clears S_ISUID and, if
    # group-exec is set, S_ISGID.
    user_ok(lambda: write_file("f", b"yy"), "user write to own 06777 file", uid=UID_B, gid=GID_B,
            cwd=t.dir)
    expect_eq(stat.S_IMODE(os.stat(t.p("f")).st_mode), 0o777, "mode after unprivileged write")
    # Truncate by the unprivileged owner clears them as well.
    os.chmod(t.p("f"), 0o6777)
    user_ok(lambda: os.truncate("f", 0), "user truncate of 06777 file", cwd=t.dir)
    expect_eq(stat.S_IMODE(os.stat(t.p("f")).st_mode), 0o777, "mode after unprivileged truncate")


@check("perm.root_write_keeps_setid")
def _(t):
    need_root()
    write_file(t.p("f"), b"x")
    os.chmod(t.p("f"), 0o6755)
    # A writer with CAP_FSETID (root) keeps S_ISUID and S_ISGID, on write and on truncate.
    fd = os.open(t.p("f"), os.O_RDWR)
    try:
        os.pwrite(fd, b"root", 0)
        os.fsync(fd)
        expect_eq(stat.S_IMODE(os.stat(t.p("f")).st_mode), 0o6755, "mode after root write")
        os.ftruncate(fd, 2)
        expect_eq(stat.S_IMODE(os.stat(t.p("f")).st_mode), 0o6755, "mode after root truncate")
    finally:
        os.close(fd)


@check("perm.root_bypasses_dac")
def _(t):
    need_root()
    write_file(t.p("f"), b"root reads this")
    os.chown(t.p("f"), UID_A, GID_A)
    os.chmod(t.p("f"), 0o000)
    expect_eq(read_file(t.p("f")), b"root reads this", "root read of 0000 file")
    os.mkdir(t.p("d"))
    os.chmod(t.p("d"), 0o000)
    touch(t.p("d", "x"))
    expect_eq(os.listdir(t.p("d")), ["x"], "root list of 0000 dir")


# ==========================================================================
# truncate
# ==========================================================================


@check("truncate.shrink_extend_zero_fills")
def _(t):
    data = pattern(10000, 3)
    write_file(t.p("f"), data)
    fd = os.open(t.p("f"), os.O_RDWR)
    try:
        os.ftruncate(fd, 3000)
        expect_eq(os.fstat(fd).st_size, 3000, "size after shrink")
        os.ftruncate(fd, 10000)
        expect_eq(os.fstat(fd).st_size, 10000, "size after extend")
        expect_eq(pread_exact(fd, 20000, 0), data[:3000] + bytes(7000), "content after shrink+extend")
        # Shrink to an odd offset inside a block, then extend by writing past EOF.
        os.ftruncate(fd, 1)
        os.pwrite(fd, b"Z", 5000)
        expect_eq(pread_exact(fd, 20000, 0), data[:1] + bytes(4999) + b"Z", "content after write past EOF")
    finally:
        os.close(fd)
    os.truncate(t.p("f"), 0)
    expect_eq(read_file(t.p("f")), b"", "content after path truncate to 0")


@check("truncate.errors")
def _(t):
    os.mkdir(t.p("d"))
    expect_errno(errno.EISDIR, os.truncate, t.p("d"), 0, what="truncate dir")
    touch(t.p("f"))
    fd = os.open(t.p("f"), os.O_RDWR)
    try:
        expect_errno(errno.EINVAL, os.ftruncate, fd, -1, what="ftruncate negative")
    finally:
        os.close(fd)
    fd = os.open(t.p("f"), os.O_RDONLY)
    try:
        # Linux: ftruncate on an fd not open for writing is EINVAL (not EBADF).
        expect_errno((errno.EINVAL, errno.EBADF), os.ftruncate, fd, 0, what="ftruncate read-only fd")
    finally:
        os.close(fd)
    expect_errno(errno.ENOENT, os.truncate, t.p("missing"), 0, what="truncate missing")


# ==========================================================================
# Sparse files, SEEK_DATA/SEEK_HOLE, fallocate
# ==========================================================================

MiB = 1 << 20


@check("sparse.hole_reads_zero")
def _(t):
    fd = os.open(t.p("f"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        chunk = pattern(4096, 9)
        pwrite_all(fd, chunk, MiB)
        expect_eq(os.fstat(fd).st_size, MiB + 4096, "size of sparse file")
        expect_eq(pread_exact(fd, MiB, 0), bytes(MiB), "hole content")
        expect_eq(pread_exact(fd, 4096, MiB), chunk, "data after hole")
        expect_eq(pread_exact(fd, 8192, MiB - 4096), bytes(4096) + chunk, "read across hole/data boundary")
    finally:
        os.close(fd)


def _seek_data(fd, off, size):
    """SEEK_DATA, with ENXIO (nothing but hole up to EOF) mapped to size."""
    try:
        return os.lseek(fd, off, os.SEEK_DATA)
    except OSError as e:
        if e.errno != errno.ENXIO:
            raise
        return size


def _check_seek_consistency(fd, size):
    """Every SEEK_DATA/SEEK_HOLE answer must be consistent with the content.

    Exact answers and conservative ones (SEEK_HOLE -> EOF, SEEK_DATA -> the
    offset itself) are both fine; what is never fine is claiming a hole where
    there is non-zero data, or skipping non-zero data.
    """
    content = pread_exact(fd, size, 0)
    offsets = sorted({0, 1, 4095, 4096, 65536, MiB - 1, MiB, MiB + 1, size - 1})
    for off in offsets:
        if off >= size:
            continue
        d = _seek_data(fd, off, size)
        expect(off <= d <= size, "SEEK_DATA(%d) = %d out of range" % (off, d))
        expect(not any(content[off:d]), "SEEK_DATA(%d) = %d skipped non-zero data" % (off, d))
        h = os.lseek(fd, off, os.SEEK_HOLE)
        expect(off <= h <= size, "SEEK_HOLE(%d) = %d out of range" % (off, h))
        if h < size:
            # A reported hole must read as zeros up to the next data.
            nd = _seek_data(fd, h, size)
            expect(nd > h, "SEEK_DATA(hole %d) = %d does not move forward" % (h, nd))
            expect(not any(content[h:nd]), "reported hole [%d,%d) contains data" % (h, nd))
    # At or past EOF both are ENXIO.
    expect_errno(errno.ENXIO, os.lseek, fd, size, os.SEEK_DATA, what="SEEK_DATA at EOF")
    expect_errno(errno.ENXIO, os.lseek, fd, size + 10, os.SEEK_HOLE, what="SEEK_HOLE past EOF")


@check("sparse.seek_data_hole")
def _(t):
    fd = os.open(t.p("f"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        pwrite_all(fd, pattern(4096, 1), MiB)
        size = MiB + 4096
        try:
            d = os.lseek(fd, 0, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.EINVAL:
                raise Skip("SEEK_DATA not supported (EINVAL)")
            raise
        expect(d <= MiB, "first data at %d, but data was written at %d" % (d, MiB))
        expect_eq(os.lseek(fd, MiB, os.SEEK_DATA), MiB, "SEEK_DATA at a data offset")
        expect_eq(os.lseek(fd, MiB, os.SEEK_HOLE), size, "SEEK_HOLE from the last data block")
        _check_seek_consistency(fd, size)
        # Data, hole, data.
        pwrite_all(fd, pattern(5000, 2), 0)
        _check_seek_consistency(fd, size)
        # Implicit hole at the end after extending with ftruncate.
        os.ftruncate(fd, 3 * MiB)
        _check_seek_consistency(fd, 3 * MiB)
        # Informational: ext4/tmpfs report the real hole; not required.
        h = os.lseek(fd, 0, os.SEEK_HOLE)
        expect(h >= 5000, "SEEK_HOLE(0) = %d inside the first 5000 data bytes" % h)
    finally:
        os.close(fd)


@check("fallocate.posix_fallocate_grows")
def _(t):
    write_file(t.p("f"), b"abc")
    fd = os.open(t.p("f"), os.O_RDWR)
    try:
        try:
            os.posix_fallocate(fd, 0, 100000)
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
                raise Skip("posix_fallocate not supported")
            raise
        expect_eq(os.fstat(fd).st_size, 100000, "size after posix_fallocate")
        expect_eq(pread_exact(fd, 100000, 0), b"abc" + bytes(99997), "content after posix_fallocate")
        # Allocating inside the file does not change size or data.
        os.posix_fallocate(fd, 10, 20)
        expect_eq(os.fstat(fd).st_size, 100000, "size after inner posix_fallocate")
        expect_eq(pread_exact(fd, 3, 0), b"abc", "data after inner posix_fallocate")
    finally:
        os.close(fd)


def _fallocate_or_skip(fd, mode, off, length, what):
    try:
        fallocate(fd, mode, off, length)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
            raise Skip("%s not supported (EOPNOTSUPP)" % what)
        raise


@check("fallocate.punch_hole")
def _(t):
    size = 3 * 65536 + 7
    data = bytearray(pattern(size, 4))
    write_file(t.p("f"), data)
    fd = os.open(t.p("f"), os.O_RDWR)
    try:
        mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        # Aligned range.
        _fallocate_or_skip(fd, mode, 4096, 8192, "FALLOC_FL_PUNCH_HOLE")
        data[4096:4096 + 8192] = bytes(8192)
        expect_eq(os.fstat(fd).st_size, size, "size after aligned punch")
        expect_eq(pread_exact(fd, size, 0), bytes(data), "content after aligned punch")
        # Unaligned range spanning a 64 KiB boundary.
        fallocate(fd, mode, 65536 - 1000, 3333)
        data[65536 - 1000:65536 - 1000 + 3333] = bytes(3333)
        expect_eq(pread_exact(fd, size, 0), bytes(data), "content after unaligned punch")
        # Punch past EOF: size stays.
        fallocate(fd, mode, size - 3, 100000)
        data[size - 3:] = bytes(3)
        expect_eq(os.fstat(fd).st_size, size, "size after punch past EOF")
        expect_eq(pread_exact(fd, size + 10, 0), bytes(data), "content after punch past EOF")
        # Linux: PUNCH_HOLE without KEEP_SIZE is EOPNOTSUPP.
        expect_errno(errno.EOPNOTSUPP, fallocate, fd, FALLOC_FL_PUNCH_HOLE, 0, 10,
                     what="PUNCH_HOLE without KEEP_SIZE")
    finally:
        os.close(fd)


@check("fallocate.keep_size")
def _(t):
    write_file(t.p("f"), b"12345")
    fd = os.open(t.p("f"), os.O_RDWR)
    try:
        _fallocate_or_skip(fd, FALLOC_FL_KEEP_SIZE, 0, MiB, "FALLOC_FL_KEEP_SIZE")
        expect_eq(os.fstat(fd).st_size, 5, "size after KEEP_SIZE fallocate")
        expect_eq(pread_exact(fd, 100, 0), b"12345", "content after KEEP_SIZE fallocate")
        # Mode 0 beyond EOF grows the file.
        fallocate(fd, 0, 0, 8192)
        expect_eq(os.fstat(fd).st_size, 8192, "size after mode-0 fallocate")
        expect_eq(pread_exact(fd, 9000, 0), b"12345" + bytes(8187), "content after mode-0 fallocate")
    finally:
        os.close(fd)


@check("fallocate.reserves_blocks")
def _(t):
    write_file(t.p("f"), b"")
    fd = os.open(t.p("f"), os.O_RDWR)
    try:
        fallocate(fd, 0, 0, MiB)
        st = os.fstat(fd)
        expect_eq(st.st_size, MiB, "size after a 1 MiB fallocate")
        expect(st.st_blocks >= MiB // 512, "st_blocks %d after a 1 MiB fallocate" % st.st_blocks)
    finally:
        os.close(fd)


@check("tmpfile.link_and_reap")
def _(t):
    try:
        fd = os.open(t.dir, os.O_TMPFILE | os.O_RDWR, 0o600)
    except OSError as e:
        fail("open(dir, O_TMPFILE): %s" % e)
    try:
        os.write(fd, b"tmp")
        expect_eq(os.fstat(fd).st_nlink, 0, "nlink of an O_TMPFILE file")
        expect_eq(sorted(os.listdir(t.dir)), [], "an O_TMPFILE file has no name")
        link_fd(fd, t.p("named"))
        expect_eq(os.fstat(fd).st_nlink, 1, "nlink after linkat")
    finally:
        os.close(fd)
    expect_eq(read_file(t.p("named")), b"tmp", "content of the linked O_TMPFILE file")
    # O_EXCL: never linkable.
    fd = os.open(t.dir, os.O_TMPFILE | os.O_RDWR | os.O_EXCL, 0o600)
    try:
        expect_errno(errno.ENOENT, link_fd, fd, t.p("never"),
                     what="linkat of an O_EXCL O_TMPFILE file")
    finally:
        os.close(fd)


# ==========================================================================
# Size boundaries
# ==========================================================================

SIZES = (0, 1, 4095, 4096, 4097, 65535, 65536, 65537, 3 * 65536 + 7)
PIECES = (1, 3, 1021, 4099, 65543, 7)  # odd write sizes, cycled


def _write_in_pieces(fd, data):
    off, i = 0, 0
    while off < len(data):
        n = PIECES[i % len(PIECES)]
        i += 1
        write_all(fd, data[off:off + n])
        off += n


@check("size.boundaries_one_write")
def _(t):
    for n in SIZES:
        data = pattern(n, n)
        write_file(t.p("f%d" % n), data)
    for n in SIZES:
        expect_eq(os.stat(t.p("f%d" % n)).st_size, n, "size of %d-byte file" % n)
        expect_eq(read_file(t.p("f%d" % n)), pattern(n, n), "content of %d-byte file" % n)


@check("size.boundaries_odd_pieces")
def _(t):
    for n in SIZES:
        fd = os.open(t.p("f%d" % n), os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            _write_in_pieces(fd, pattern(n, n + 1))
        finally:
            os.close(fd)
    for n in SIZES:
        expect_eq(read_file(t.p("f%d" % n)), pattern(n, n + 1), "content of %d-byte file" % n)
        # Read back in odd pieces too.
        fd = os.open(t.p("f%d" % n), os.O_RDONLY)
        got = []
        try:
            i = 0
            while True:
                b = os.read(fd, PIECES[i % len(PIECES)])
                i += 1
                if not b:
                    break
                got.append(b)
        finally:
            os.close(fd)
        expect_eq(b"".join(got), pattern(n, n + 1), "odd-piece read of %d-byte file" % n)


@check("size.boundaries_append_one_byte")
def _(t):
    for n in SIZES:
        data = pattern(n, 2 * n)
        write_file(t.p("f"), data)
        fd = os.open(t.p("f"), os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"\xa5")
        os.close(fd)
        expect_eq(read_file(t.p("f")), data + b"\xa5", "content of %d-byte file + 1 byte" % n)
        # Overwrite the last byte in place and one byte straddling each boundary.
        fd = os.open(t.p("f"), os.O_WRONLY)
        os.pwrite(fd, b"\x5a", n)
        os.close(fd)
        expect_eq(read_file(t.p("f")), data + b"\x5a", "content after overwrite of byte %d" % n)


@check("size.truncate_down_across_boundaries")
def _(t):
    big = SIZES[-1]
    data = pattern(big, 77)
    write_file(t.p("f"), data)
    for n in reversed(SIZES):
        os.truncate(t.p("f"), n)
        expect_eq(os.stat(t.p("f")).st_size, n, "size after truncate to %d" % n)
        expect_eq(read_file(t.p("f")), data[:n], "content after truncate to %d" % n)
    # And back up: the regrown range must be zeros.
    write_file(t.p("g"), data)
    for n in SIZES[1:-1]:
        os.truncate(t.p("g"), n)
        os.truncate(t.p("g"), big)
        got = read_file(t.p("g"))
        expect_eq(got, data[:n] + bytes(big - n), "content after truncate to %d and regrow" % n)
        write_file(t.p("g"), data)


# ==========================================================================
# Nanosecond timestamps
# ==========================================================================


@check("time.mtime_ctime_on_write")
def _(t):
    write_file(t.p("f"), b"a")
    st0 = os.stat(t.p("f"))
    tick()
    fd = os.open(t.p("f"), os.O_WRONLY)
    os.write(fd, b"b")
    os.close(fd)
    st1 = os.stat(t.p("f"))
    expect(st1.st_mtime_ns > st0.st_mtime_ns, "mtime_ns did not change on write")
    expect(st1.st_ctime_ns > st0.st_ctime_ns, "ctime_ns did not change on write")
    tick()
    os.truncate(t.p("f"), 0)
    st2 = os.stat(t.p("f"))
    expect(st2.st_mtime_ns > st1.st_mtime_ns, "mtime_ns did not change on truncate")
    # Opening with O_TRUNC of an empty file still updates mtime (Linux).
    tick()
    os.close(os.open(t.p("f"), os.O_WRONLY | os.O_TRUNC))
    expect(os.stat(t.p("f")).st_mtime_ns > st2.st_mtime_ns, "mtime_ns did not change on O_TRUNC")


@check("time.ctime_on_chmod_not_mtime")
def _(t):
    touch(t.p("f"))
    st0 = os.stat(t.p("f"))
    tick()
    os.chmod(t.p("f"), 0o640)
    st1 = os.stat(t.p("f"))
    expect(st1.st_ctime_ns > st0.st_ctime_ns, "ctime_ns did not change on chmod")
    expect_eq(st1.st_mtime_ns, st0.st_mtime_ns, "mtime_ns after chmod")


@check("time.parent_mtime_on_dir_ops")
def _(t):
    d = t.dir

    def step(what, fn):
        st0 = os.stat(d)
        tick()
        fn()
        st1 = os.stat(d)
        expect(st1.st_mtime_ns > st0.st_mtime_ns, "parent mtime did not change on %s" % what)
        expect(st1.st_ctime_ns > st0.st_ctime_ns, "parent ctime did not change on %s" % what)

    step("create", lambda: touch(t.p("f")))
    step("rename", lambda: os.rename(t.p("f"), t.p("g")))
    step("link", lambda: os.link(t.p("g"), t.p("h")))
    step("unlink", lambda: os.unlink(t.p("h")))
    step("mkdir", lambda: os.mkdir(t.p("sub")))
    step("rmdir", lambda: os.rmdir(t.p("sub")))
    step("symlink", lambda: os.symlink("g", t.p("l")))
    # Writing a file inside does not touch the directory's mtime.
    st0 = os.stat(d)
    tick()
    write_file(t.p("g"), b"data")
    expect_eq(os.stat(d).st_mtime_ns, st0.st_mtime_ns, "parent mtime after writing a child")


@check("time.atime_and_rename_ctime")
def _(t):
    write_file(t.p("f"), b"data")
    st0 = os.stat(t.p("f"))
    tick()
    os.rename(t.p("f"), t.p("g"))
    st1 = os.stat(t.p("g"))
    # Linux filesystems update ctime of the renamed inode.
    expect(st1.st_ctime_ns >= st0.st_ctime_ns, "ctime went backwards on rename")
    expect_eq(st1.st_mtime_ns, st0.st_mtime_ns, "mtime changed by rename")
    # atime never runs ahead of "now" and is at least what utime set.
    os.utime(t.p("g"), ns=(1_000_000_000, st1.st_mtime_ns))
    read_file(t.p("g"))
    at = os.stat(t.p("g")).st_atime_ns
    expect(1_000_000_000 <= at <= time.time_ns() + 1_000_000_000, "atime %d not sane" % at)


# ==========================================================================
# Big directories and readdir
# ==========================================================================


@check("dir.many_entries", timeout=600)
def _(t):
    n = 2000 if t.quick else 10000
    d = t.p("big")
    os.mkdir(d)
    names = set()
    for i in range(n):
        name = "entry-%05d-%s" % (i, "x" * (i % 40))
        os.close(os.open(os.path.join(d, name), os.O_CREAT | os.O_WRONLY, 0o644))
        names.add(name)
    # A few other types so readdir d_type is exercised.
    os.mkdir(os.path.join(d, "a-subdir"))
    os.symlink("entry-00000-", os.path.join(d, "a-symlink"))
    os.mkfifo(os.path.join(d, "a-fifo"))
    listed = os.listdir(d)
    expect_eq(len(listed), n + 3, "number of entries listed")
    expect_eq(len(set(listed)), len(listed), "distinct entries listed")
    expect(set(listed) == names | {"a-subdir", "a-symlink", "a-fifo"}, "listed names differ")
    kinds = {"file": 0}
    with os.scandir(d) as it:
        for e in it:
            if e.name == "a-subdir":
                expect(e.is_dir(follow_symlinks=False), "subdir entry is not a dir")
            elif e.name == "a-symlink":
                expect(e.is_symlink(), "symlink entry is not a symlink")
            elif e.name == "a-fifo":
                expect(stat.S_ISFIFO(e.stat(follow_symlinks=False).st_mode), "fifo entry")
                expect(not e.is_file(follow_symlinks=False) and not e.is_dir(follow_symlinks=False),
                       "fifo entry claims to be a file or dir")
            else:
                expect(e.is_file(follow_symlinks=False), "%s is not a regular file" % e.name)
                kinds["file"] += 1
    expect_eq(kinds["file"], n, "regular files seen by scandir")
    for name in names:
        os.unlink(os.path.join(d, name))
    os.rmdir(os.path.join(d, "a-subdir"))
    os.unlink(os.path.join(d, "a-symlink"))
    os.unlink(os.path.join(d, "a-fifo"))
    expect_eq(os.listdir(d), [], "listing after deleting everything")
    os.rmdir(d)


@check("dir.scandir_inode_matches_stat")
def _(t):
    for i in range(50):
        touch(t.p("f%d" % i))
    os.mkdir(t.p("sub"))
    os.symlink("f0", t.p("lnk"))
    with os.scandir(t.dir) as it:
        for e in it:
            st = os.lstat(e.path)
            expect_eq(e.inode(), st.st_ino, "readdir d_ino vs lstat st_ino of %s" % e.name)


@check("dir.readdir_while_deleting", timeout=120)
def _(t):
    n = 600 if t.quick else 3000
    for i in range(n):
        touch(t.p("e%05d" % i))
    all_names = {"e%05d" % i for i in range(n)}
    rnd = random.Random(1234)
    # Delete a random third of the entries after the first few have been read.
    doomed = set(rnd.sample(sorted(all_names), n // 3))
    seen = []
    with os.scandir(t.dir) as it:
        for i, e in enumerate(it):
            seen.append(e.name)
            if i == 10:
                for name in doomed:
                    os.unlink(t.p(name))
    dup = len(seen) - len(set(seen))
    expect(dup == 0, "%d entries returned twice while deleting" % dup)
    missing = (all_names - doomed) - set(seen)
    expect(not missing, "%d surviving entries never returned, e.g. %s" % (len(missing), sorted(missing)[:3]))
    stray = set(seen) - all_names
    expect(not stray, "unknown names returned: %s" % sorted(stray)[:3])
    expect_eq(sorted(os.listdir(t.dir)), sorted(all_names - doomed), "listing after deletion")


@check("dir.readdir_while_creating")
def _(t):
    n = 500
    for i in range(n):
        touch(t.p("old%04d" % i))
    seen = []
    with os.scandir(t.dir) as it:
        for i, e in enumerate(it):
            seen.append(e.name)
            if i == 5:
                for j in range(200):
                    touch(t.p("new%04d" % j))
    expect_eq(len(seen), len(set(seen)), "entries returned while creating are distinct")
    old = {"old%04d" % i for i in range(n)}
    expect(old <= set(seen), "pre-existing entries missing while creating others")


# ==========================================================================
# Concurrency
# ==========================================================================


def _run_threads(fns):
    errors = []

    def wrap(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(fn,)) for fn in fns]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]


@check("concurrent.pwrite_regions_and_own_files", timeout=120)
def _(t):
    region = 256 * 1024
    chunk = 4096 + 17  # deliberately not block-aligned
    shared = t.p("shared")
    touch(shared)

    def region_writer(k):
        def run():
            data = pattern(region, 100 + k)
            fd = os.open(shared, os.O_WRONLY)
            try:
                for off in range(0, region, chunk):
                    pwrite_all(fd, data[off:off + chunk], k * region + off)
            finally:
                os.close(fd)
        return run

    def own_writer(k):
        def run():
            data = pattern(region + k, 200 + k)
            fd = os.open(t.p("own%d" % k), os.O_CREAT | os.O_WRONLY, 0o644)
            try:
                for off in range(0, len(data), chunk):
                    write_all(fd, data[off:off + chunk])
            finally:
                os.close(fd)
        return run

    _run_threads([region_writer(k) for k in range(4)] + [own_writer(k) for k in range(4)])
    got = read_file(shared)
    expect_eq(len(got), 4 * region, "shared file size")
    for k in range(4):
        expect_eq(got[k * region:(k + 1) * region], pattern(region, 100 + k), "region %d" % k)
        expect_eq(read_file(t.p("own%d" % k)), pattern(region + k, 200 + k), "own file %d" % k)


@check("concurrent.o_append_records", timeout=120)
def _(t):
    f = t.p("log")
    touch(f)
    per_thread, rec_len = 200, 100

    def appender(k):
        def run():
            fd = os.open(f, os.O_WRONLY | os.O_APPEND)
            try:
                for i in range(per_thread):
                    rec = ("%d:%05d:" % (k, i)).encode().ljust(rec_len - 1, b"abcdefgh"[k:k + 1]) + b"\n"
                    expect_eq(os.write(fd, rec), rec_len, "append write length")
            finally:
                os.close(fd)
        return run

    _run_threads([appender(k) for k in range(4)])
    data = read_file(f)
    expect_eq(len(data), 4 * per_thread * rec_len, "log size")
    recs = [data[i:i + rec_len] for i in range(0, len(data), rec_len)]
    seen = set()
    for r in recs:
        k, i = r.split(b":")[:2]
        k = int(k)
        expect_eq(r, ("%d:%05d:" % (k, int(i))).encode().ljust(rec_len - 1, b"abcdefgh"[k:k + 1]) + b"\n",
                  "record integrity")
        seen.add((k, int(i)))
    expect_eq(len(seen), 4 * per_thread, "distinct records")


@check("concurrent.processes_same_file", timeout=120)
def _(t):
    """Separate processes (not threads) writing interleaved stripes."""
    f = t.p("f")
    stripe, nstripes, nproc = 8192 + 5, 40, 4
    touch(f)
    pids = []
    for k in range(nproc):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                fd = os.open(f, os.O_WRONLY)
                for s in range(k, nstripes, nproc):
                    pwrite_all(fd, pattern(stripe, s), s * stripe)
                os.fsync(fd)
                os.close(fd)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        expect_eq(os.waitstatus_to_exitcode(status), 0, "writer process exit")
    got = read_file(f)
    expect_eq(got, b"".join(pattern(stripe, s) for s in range(nstripes)), "striped content")


# ==========================================================================
# mmap
# ==========================================================================


@check("mmap.shared_write_msync")
def _(t):
    size = 3 * 4096 + 100
    write_file(t.p("f"), bytes(size))
    fd = os.open(t.p("f"), os.O_RDWR)
    try:
        m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            data = pattern(size, 5)
            m[:] = data
            m.flush()  # msync(MS_SYNC)
            expect_eq(pread_exact(fd, size, 0), data, "read() after msync")
            expect_eq(read_file(t.p("f")), data, "read via new fd after msync")
            # Writes through read() path are visible in the mapping.
            os.pwrite(fd, b"WXYZ", 4094)
            expect_eq(m[4094:4098], b"WXYZ", "mapping sees pwrite")
        finally:
            m.close()
    finally:
        os.close(fd)
    expect_eq(os.stat(t.p("f")).st_size, size, "size after mmap writes")


@check("mmap.read_mapping")
def _(t):
    data = pattern(65536 + 123, 8)
    write_file(t.p("f"), data)
    fd = os.open(t.p("f"), os.O_RDONLY)
    try:
        with mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            expect_eq(len(m), len(data), "mapping length")
            expect_eq(bytes(m), data, "content read via mmap")
    finally:
        os.close(fd)


@check("mmap.after_truncate_extend")
def _(t):
    write_file(t.p("f"), b"head")
    fd = os.open(t.p("f"), os.O_RDWR)
    try:
        os.ftruncate(fd, 2 * 4096 + 1)
        with mmap.mmap(fd, 2 * 4096 + 1) as m:
            expect_eq(m[:4], b"head", "old data in mapping")
            expect_eq(bytes(m[4:]), bytes(2 * 4096 - 3), "extended range is zero in mapping")
            m[8190:8193] = b"end"
            m.flush()
        expect_eq(pread_exact(fd, 10000, 0), b"head" + bytes(8186) + b"end", "file after mmap write")
    finally:
        os.close(fd)


# ==========================================================================
# Extended attributes
# ==========================================================================


def _xattr_or_skip(path):
    try:
        os.setxattr(path, "user.probe", b"1")
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise Skip("user xattrs not supported here (ENOTSUP)")
        raise
    os.removexattr(path, "user.probe")


@check("xattr.set_get_list_remove")
def _(t):
    touch(t.p("f"))
    _xattr_or_skip(t.p("f"))
    values = {"user.a": b"alpha", "user.empty": b"", "user.bin": bytes(range(256)),
              "user.big": pattern(2000, 1), "user." + "n" * 200: b"long name"}
    for k, v in values.items():
        os.setxattr(t.p("f"), k, v)
    for k, v in values.items():
        expect_eq(os.getxattr(t.p("f"), k), v, "value of %s" % k[:20])
    listed = set(os.listxattr(t.p("f")))
    expect(set(values) <= listed, "listxattr misses %s" % sorted(set(values) - listed))
    os.setxattr(t.p("f"), "user.a", b"changed")
    expect_eq(os.getxattr(t.p("f"), "user.a"), b"changed", "value after overwrite")
    os.removexattr(t.p("f"), "user.a")
    expect("user.a" not in os.listxattr(t.p("f")), "removed xattr still listed")
    expect_errno(errno.ENODATA, os.removexattr, t.p("f"), "user.a", what="remove missing xattr")
    # xattrs on a directory, and survival across rename.
    os.mkdir(t.p("d"))
    os.setxattr(t.p("d"), "user.dir", b"d")
    os.rename(t.p("d"), t.p("d2"))
    expect_eq(os.getxattr(t.p("d2"), "user.dir"), b"d", "dir xattr after rename")
    # Through an fd.
    fd = os.open(t.p("f"), os.O_RDONLY)
    try:
        os.setxattr(fd, "user.fd", b"via fd")
        expect_eq(os.getxattr(t.p("f"), "user.fd"), b"via fd", "xattr set via fd")
    finally:
        os.close(fd)


@check("xattr.flags_and_errors")
def _(t):
    touch(t.p("f"))
    _xattr_or_skip(t.p("f"))
    os.setxattr(t.p("f"), "user.x", b"1", os.XATTR_CREATE)
    expect_errno(errno.EEXIST, os.setxattr, t.p("f"), "user.x", b"2", os.XATTR_CREATE,
                 what="XATTR_CREATE on existing")
    expect_errno(errno.ENODATA, os.setxattr, t.p("f"), "user.y", b"2", os.XATTR_REPLACE,
                 what="XATTR_REPLACE on missing")
    os.setxattr(t.p("f"), "user.x", b"3", os.XATTR_REPLACE)
    expect_eq(os.getxattr(t.p("f"), "user.x"), b"3", "value after XATTR_REPLACE")
    expect_errno(errno.ENODATA, os.getxattr, t.p("f"), "user.missing", what="getxattr missing")
    expect_errno(errno.ENOENT, os.getxattr, t.p("missing"), "user.x", what="getxattr on missing file")
    # Linux: user.* xattrs are refused on symlinks (EPERM on set, ENODATA on get).
    os.symlink("f", t.p("l"))
    expect_errno(errno.EPERM, os.setxattr, t.p("l"), "user.x", b"1", follow_symlinks=False,
                 what="set user xattr on symlink itself")
    expect_errno(errno.ENODATA, os.getxattr, t.p("l"), "user.x", follow_symlinks=False,
                 what="get user xattr on symlink itself")
    expect_eq(os.getxattr(t.p("l"), "user.x"), b"3", "getxattr following symlink")


@check("xattr.user_permissions")
def _(t):
    need_root()  # switches to ordinary uids
    touch(t.p("f"), 0o644)
    _xattr_or_skip(t.p("f"))
    os.setxattr(t.p("f"), "user.r", b"readable")
    expect_eq(user_ok(lambda: os.getxattr("f", "user.r"), "getxattr with read access", cwd=t.dir),
              b"readable", "xattr read by user")
    user_errno(errno.EACCES, lambda: os.setxattr("f", "user.w", b"1"), "setxattr without write access",
               cwd=t.dir)


# A version 2 file capability (VFS_CAP_REVISION_2 | effective) granting CAP_NET_BIND_SERVICE.
CAPS_NAME = "security.capability"
CAPS_VALUE = struct.pack("<5I", 0x02000001, 1 << 10, 0, 0, 0)


def _set_caps(path):
    try:
        os.setxattr(path, CAPS_NAME, CAPS_VALUE)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise Skip("security xattrs not supported here (ENOTSUP)")
        raise
    expect_eq(os.getxattr(path, CAPS_NAME), CAPS_VALUE, "capabilities as set")


@check("xattr.modification_drops_capabilities")
def _(t):
    need_root()
    write_file(t.p("f"), b"x")
    fd = os.open(t.p("f"), os.O_RDWR)
    try:
        # The inode's first write comes first: a kernel may stop checking after it.
        os.pwrite(fd, b"a", 0)
        # Linux: writing a file drops its capabilities, even when root writes.
        _set_caps(t.p("f"))
        os.pwrite(fd, b"b", 1)
        os.fsync(fd)
        expect_errno(errno.ENODATA, os.getxattr, t.p("f"), CAPS_NAME, what="capabilities after a write")
        _set_caps(t.p("f"))
        os.ftruncate(fd, 1)
        expect_errno(errno.ENODATA, os.getxattr, t.p("f"), CAPS_NAME,
                     what="capabilities after a truncate")
        _set_caps(t.p("f"))
        os.chown(t.p("f"), UID_A, GID_A)
        expect_errno(errno.ENODATA, os.getxattr, t.p("f"), CAPS_NAME, what="capabilities after a chown")
    finally:
        os.close(fd)


# ==========================================================================
# fsync / sync / statvfs
# ==========================================================================


@check("sync.fsync_fdatasync")
def _(t):
    write_file(t.p("f"), pattern(70000))
    fd = os.open(t.p("f"), os.O_RDWR)
    try:
        os.fsync(fd)
        os.pwrite(fd, b"more", 70000)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    fd = os.open(t.p("f"), os.O_RDONLY)  # fsync on a read-only fd is allowed
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(t.dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
        os.fdatasync(dfd)
    finally:
        os.close(dfd)
    os.sync()
    fd = os.open(t.p("f"), os.O_WRONLY | os.O_SYNC | os.O_APPEND)
    try:
        os.write(fd, b"!")
    finally:
        os.close(fd)
    expect_eq(read_file(t.p("f")), pattern(70000) + b"more!", "content after syncs")


@check("statvfs.sane")
def _(t):
    s = os.statvfs(t.dir)
    expect(s.f_bsize > 0, "f_bsize %d" % s.f_bsize)
    expect(s.f_frsize > 0, "f_frsize %d" % s.f_frsize)
    expect(s.f_blocks > 0, "f_blocks %d" % s.f_blocks)
    expect(s.f_bfree <= s.f_blocks, "f_bfree %d > f_blocks %d" % (s.f_bfree, s.f_blocks))
    expect(s.f_bavail <= s.f_bfree, "f_bavail %d > f_bfree %d" % (s.f_bavail, s.f_bfree))
    expect(s.f_ffree <= s.f_files, "f_ffree %d > f_files %d" % (s.f_ffree, s.f_files))
    expect_eq(s.f_namemax, 255, "f_namemax")
    fd = os.open(t.dir, os.O_RDONLY)
    try:
        expect_eq(os.fstatvfs(fd).f_namemax, 255, "fstatvfs f_namemax")
    finally:
        os.close(fd)


# ==========================================================================
# copy_file_range, O_DIRECT
# ==========================================================================


@check("copy_file_range.exact_bytes")
def _(t):
    if not hasattr(os, "copy_file_range"):
        raise Skip("os.copy_file_range unavailable")
    src_data = pattern(200000, 11)
    write_file(t.p("src"), src_data)
    write_file(t.p("dst"), b"")
    s = os.open(t.p("src"), os.O_RDONLY)
    d = os.open(t.p("dst"), os.O_RDWR)
    try:
        def copy(count, off_src, off_dst):
            while count > 0:
                n = os.copy_file_range(s, d, count, off_src, off_dst)
                if n == 0:
                    break
                count -= n
                off_src += n
                off_dst += n

        copy(75000, 65000, 3)  # crosses the 64 KiB and 128 KiB boundaries
        expect_eq(read_file(t.p("dst")), bytes(3) + src_data[65000:140000], "partial copy")
        os.ftruncate(d, 0)
        copy(len(src_data), 0, 0)
        expect_eq(read_file(t.p("dst")), src_data, "whole-file copy")
        # Copy starting beyond EOF copies nothing.
        expect_eq(os.copy_file_range(s, d, 10, len(src_data) + 5, 0), 0, "copy from past EOF")
    finally:
        os.close(s)
        os.close(d)


@check("odirect.roundtrip")
def _(t):
    try:
        fd = os.open(t.p("f"), os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o644)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise Skip("O_DIRECT refused with EINVAL (allowed)")
        raise
    try:
        buf = mmap.mmap(-1, 8192)  # page-aligned buffer
        data = pattern(8192, 6)
        buf[:] = data
        try:
            n = os.pwritev(fd, [buf], 0)
        except OSError as e:
            if e.errno == errno.EINVAL:
                raise Skip("O_DIRECT write refused with EINVAL (allowed)")
            raise
        expect_eq(n, 8192, "O_DIRECT write length")
        rbuf = mmap.mmap(-1, 8192)
        n = os.preadv(fd, [rbuf], 0)
        expect_eq(n, 8192, "O_DIRECT read length")
        expect_eq(bytes(rbuf), data, "O_DIRECT read content")
    finally:
        os.close(fd)
    expect_eq(read_file(t.p("f")), pattern(8192, 6), "buffered read after O_DIRECT write")


# ==========================================================================
# Miscellaneous
# ==========================================================================


@check("misc.getcwd_in_removed_dir")
def _(t):
    os.mkdir(t.p("gone"))
    os.chdir(t.p("gone"))
    try:
        os.rmdir(t.p("gone"))
        # Linux: getcwd() of an unlinked directory is ENOENT.
        expect_errno(errno.ENOENT, os.getcwd, what="getcwd in removed dir")
        expect_errno(errno.ENOENT, os.open, "new", os.O_CREAT | os.O_WRONLY, 0o644,
                     what="create in removed cwd")
        expect_errno(errno.ENOENT, os.mkdir, "newdir", what="mkdir in removed cwd")
        # ext4/tmpfs list it as empty; getdents on a dead directory may also
        # be ENOENT (fs/readdir.c: IS_DEADDIR), e.g. on FUSE mounts.
        try:
            listing = os.listdir(".")
        except FileNotFoundError:
            listing = []
        expect_eq(listing, [], "listing of removed cwd")
    finally:
        os.chdir("/")


@check("misc.rename_while_open")
def _(t):
    write_file(t.p("a"), b"original")
    fd = os.open(t.p("a"), os.O_RDWR)
    try:
        os.rename(t.p("a"), t.p("b"))
        expect_eq(pread_exact(fd, 100, 0), b"original", "read via fd after rename")
        os.pwrite(fd, b"ORIG", 0)
        expect_eq(read_file(t.p("b")), b"ORIGinal", "new name sees write via old fd")
        # Renaming another file over it leaves the open fd on the old inode.
        write_file(t.p("c"), b"other")
        os.rename(t.p("c"), t.p("b"))
        expect_eq(pread_exact(fd, 100, 0), b"ORIGinal", "fd after being renamed over")
        expect_eq(os.fstat(fd).st_nlink, 0, "nlink of replaced open file")
        expect_eq(read_file(t.p("b")), b"other", "content at name after rename-over")
    finally:
        os.close(fd)


@check("misc.fstat_matches_stat")
def _(t):
    write_file(t.p("f"), pattern(12345))
    fd = os.open(t.p("f"), os.O_RDONLY)
    try:
        a, b = os.fstat(fd), os.stat(t.p("f"))
        for field in ("st_ino", "st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                      "st_mtime_ns", "st_ctime_ns", "st_dev"):
            expect_eq(getattr(a, field), getattr(b, field), "fstat vs stat " + field)
        expect(b.st_blocks * 512 >= 12345, "st_blocks %d too small for 12345 bytes" % b.st_blocks)
        expect(b.st_blksize > 0, "st_blksize %d" % b.st_blksize)
    finally:
        os.close(fd)
    expect_eq(os.stat(t.dir).st_dev, os.stat(t.p("f")).st_dev, "st_dev of dir vs file")


@check("misc.dot_and_dotdot")
def _(t):
    os.makedirs(t.p("a", "b"))
    expect_eq(os.stat(t.p("a", "b", "..")).st_ino, os.stat(t.p("a")).st_ino, "a/b/..")
    expect_eq(os.stat(t.p("a", ".")).st_ino, os.stat(t.p("a")).st_ino, "a/.")
    expect_eq(os.stat(t.dir + "/..").st_ino, os.stat(os.path.dirname(t.dir)).st_ino, "check dir/..")
    expect("." not in os.listdir(t.p("a")) and ".." not in os.listdir(t.p("a")), "listdir shows . or ..")


def main(argv=None):
    return GATE.main(argv, doc=__doc__, prefix=".posix_gate", quick=True, json_report=True)


if __name__ == "__main__":
    sys.exit(main())
