#!/usr/bin/env python3
"""Overlay gate: a read-only base directory seen through a copy-on-write overlay mount.

    python3 validation/overlay_gate.py --kind kernel-overlay|fuse-overlayfs|agentfs
        [--agentfs BIN] [--workdir DIR] [--quick] [-k PATTERN]... [--json]
        [--timeout-scale F] [--list]

Legs (--kind): `kernel-overlay` mounts the kernel's overlayfs (lowerdir = the base, upper and
work directories next to it; redirect_dir=off, so renaming a base directory is EXDEV as in the
AgentFS model) and is the reference; `fuse-overlayfs` the same with the fuse-overlayfs program;
`agentfs` runs `agentfs init DB --base BASE`, `agentfs mount DB MNT`, `agentfs umount MNT` with
the binary given by --agentfs (default target/release/agentfs).

The gate builds a fixture base tree in the work directory (files of several sizes including a
3 MiB one, nested directories, symlinks inside and outside the base, a hard-linked pair, an
executable, an empty directory, a file others may not read), records a manifest of the base
(every path: type, mode, uid, gid, size, mtime_ns, sha256 or symlink target) and checks after
every group that nothing in it changed (`manifest.<group>`). Groups:

  posix.fresh/*  the POSIX gate's checks in a directory created in the overlay;
  posix.base/*   the same checks, each in its own directory of the base (copied up when the
                 check first changes it, removed through the overlay at the end);
  copyup.*       reads change nothing in the delta; the first write, chmod, utime, truncate or
                 xattr copies up; content is base + change;
  ino.*          st_ino is stable across copy-up; hard links to base files;
  whiteout.*     deleted base entries vanish from lookup and readdir; a recreated directory is
                 empty; merged listings have no duplicates, also while entries come and go;
  exdev.*        rename(2) of a base directory is EXDEV, mv works; renames of files and of
                 overlay directories work;
  drift.*        (own base copy) the base changes behind the mount: a read returns the old or
                 the new content whole, or EIO, never a mix; the gate restores the base;
  partial.*      (agentfs, own base copy, init --partial-origin on) partial-origin files;
  roundtrip.*    (agentfs, own base copies) `agentfs diff --patch --binary | git apply` on copy A and
                 `agentfs apply` on copy B give the merged view seen through the mount.

Output and exit status as the other gates (gatekit.py): PASS/FAIL/SKIP lines, a summary line,
exit 0 iff nothing failed. Run as root. Standard library only (Python >= 3.8).
"""

import argparse
import errno
import hashlib
import json
import mmap
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # gatekit.py and posix_gate.py, from any cwd
import gatekit  # noqa: E402
from gatekit import (  # noqa: E402
    Gate, Skip, expect, expect_eq, expect_errno, fail, pattern, pread_exact, pwrite_all,
    random_pattern, read_file, safe_name, write_file)
import posix_gate  # noqa: E402

GATE = Gate(default_timeout=60.0)
check = GATE.check

MIB = 1 << 20
BIG = 3 * MIB
OUTSIDE_TARGET = "/etc/hostname"  # a symlink in the base pointing out of it

# The leg and the mount the running group works on. Set in the parent before a group runs;
# the forked check children inherit them.
LEG = None
MOUNT = None


# --------------------------------------------------------------------------
# Fixture and manifest
# --------------------------------------------------------------------------


def build_fixture(d):
    """The base tree every overlay check gets (in its own directory of the base)."""
    os.makedirs(d)
    write_file(os.path.join(d, "empty"), b"")
    write_file(os.path.join(d, "small.txt"), b"hello, base\n")
    write_file(os.path.join(d, "medium.bin"), pattern(100 * 1024 + 3, seed=1))
    write_file(os.path.join(d, "big.bin"), random_pattern(BIG, seed=2))
    write_file(os.path.join(d, "exec.sh"), b"#!/bin/sh\necho hi\n", mode=0o755)
    os.chmod(os.path.join(d, "exec.sh"), 0o755)
    write_file(os.path.join(d, "secret"), b"not for others\n")
    os.chmod(os.path.join(d, "secret"), 0o640)
    os.chown(os.path.join(d, "secret"), gatekit.UID_A, gatekit.GID_A)
    os.makedirs(os.path.join(d, "sub", "deeper"))
    write_file(os.path.join(d, "sub", "a.txt"), b"a\n")
    write_file(os.path.join(d, "sub", "deeper", "nested.txt"), pattern(5000, seed=3))
    os.mkdir(os.path.join(d, "emptydir"))
    os.symlink("small.txt", os.path.join(d, "link-in"))
    os.symlink(OUTSIDE_TARGET, os.path.join(d, "link-out"))
    write_file(os.path.join(d, "hard1"), b"linked\n")
    os.link(os.path.join(d, "hard1"), os.path.join(d, "hard2"))
    for i in range(3):
        os.makedirs(os.path.join(d, "tree", "d%d" % i, "e"))
        write_file(os.path.join(d, "tree", "d%d" % i, "f"), pattern(300 + i, seed=i))
        write_file(os.path.join(d, "tree", "d%d" % i, "e", "g"), b"g%d" % i)
    write_file(os.path.join(d, "setid"), b"setid\n")
    os.chown(os.path.join(d, "setid"), gatekit.UID_A, gatekit.GID_A)
    os.chmod(os.path.join(d, "setid"), 0o6777)
    write_file(os.path.join(d, "tagged"), b"tagged\n")
    os.mkdir(os.path.join(d, "tagdir"))
    try:
        os.setxattr(os.path.join(d, "tagged"), "user.origin", b"base")
        os.setxattr(os.path.join(d, "tagdir"), "user.dir", b"d")
    except OSError as e:
        if e.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    os.mkdir(os.path.join(d, "many"))
    for i in range(300):
        write_file(os.path.join(d, "many", "b%03d" % i), b"%d" % i)


def build_base(base, groups_checks, posix_checks):
    """The base: checks/<group>/<check>/ = fixture per overlay check, posix/<check>/ = an empty
    directory per POSIX check (the posix.base run)."""
    os.makedirs(base)
    for group, names in groups_checks.items():
        for name in names:
            build_fixture(os.path.join(base, "checks", group, safe_name(name)))
    os.makedirs(os.path.join(base, "posix"))
    for name in posix_checks:
        p = os.path.join(base, "posix", safe_name(name))
        os.mkdir(p)
        os.chmod(p, 0o755)
    os.chmod(os.path.join(base, "posix"), 0o755)


def sha256_file(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while True:
            b = f.read(MIB)
            if not b:
                return h.hexdigest()
            h.update(b)


def manifest(root):
    """{relative path: (type, mode, uid, gid, size, mtime_ns, sha256 | symlink target | None)}."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                kind, extra = "l", os.readlink(p)
            elif stat.S_ISDIR(st.st_mode):
                kind, extra = "d", None
            elif stat.S_ISREG(st.st_mode):
                kind, extra = "f", sha256_file(p)
            else:
                kind, extra = "o", None
            out[os.path.relpath(p, root)] = (kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                                             st.st_size if kind != "d" else 0, st.st_mtime_ns, extra)
    return out


def manifest_diff(before, after, limit=5):
    lines = []
    for p in sorted(set(before) | set(after)):
        if before.get(p) != after.get(p):
            lines.append("%s: %r -> %r" % (p, before.get(p), after.get(p)))
    return "; ".join(lines[:limit]) + (" (+%d more)" % (len(lines) - limit) if len(lines) > limit else "")


def view(root):
    """What a user sees under root: {path: (type, permission bits, sha256 | target | None)}."""
    return {p: (v[0], v[1], v[6]) for p, v in manifest(root).items()}


def restore_from(pristine, base, rel):
    """Put base/rel back exactly as pristine/rel (content in place, mode, times)."""
    src, dst = os.path.join(pristine, rel), os.path.join(base, rel)
    st = os.lstat(src)
    with open(src, "rb") as f:
        data = f.read()
    fd = os.open(dst, os.O_WRONLY | os.O_TRUNC)
    try:
        gatekit.write_all(fd, data)
    finally:
        os.close(fd)
    os.chmod(dst, stat.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))


# --------------------------------------------------------------------------
# Legs: how a base is mounted and how its delta is observed
# --------------------------------------------------------------------------


def sh(cmd, **kw):
    """Run a command; returns (rc, stdout+stderr text)."""
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, **kw)
    return p.returncode, p.stdout.decode(errors="replace")


def must(cmd, **kw):
    rc, out = sh(cmd, **kw)
    if rc != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), rc, out.strip()[-500:]))
    return out


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def wait_mounted(path, want=True, seconds=20):
    end = time.monotonic() + seconds
    while is_mounted(path) != want:
        if time.monotonic() > end:
            raise RuntimeError("%s: %s after %ds" % (path, "not mounted" if want else "still mounted",
                                                     seconds))
        time.sleep(0.02)


class Mount:
    """One mounted base. Attributes: base, mnt; leg-specific: upper (overlays), db (agentfs)."""

    def __init__(self, leg, base, work, init_args=()):
        self.leg, self.base, self.work, self.init_args = leg, base, work, list(init_args)
        self.mnt = os.path.join(work, "mnt")
        self.upper = os.path.join(work, "upper")
        self.db = os.path.join(work, "delta.db")
        os.makedirs(self.mnt, exist_ok=True)
        leg.create(self)
        self.mount()

    def mount(self):
        self.leg.mount(self)
        wait_mounted(self.mnt)

    def unmount(self):
        if is_mounted(self.mnt):
            self.leg.unmount(self)
            wait_mounted(self.mnt, False)

    def remount(self):
        self.unmount()
        self.mount()

    def rel(self, path):
        """A path in the mount -> its path relative to the mount root."""
        return os.path.relpath(path, self.mnt)

    def base_path(self, path):
        return os.path.join(self.base, self.rel(path))


class KernelOverlay:
    name = "kernel-overlay"

    def create(self, m):
        for d in ("upper", "ovwork"):
            os.makedirs(os.path.join(m.work, d), exist_ok=True)

    def options(self, m):
        return "lowerdir=%s,upperdir=%s,workdir=%s" % (m.base, m.upper, os.path.join(m.work, "ovwork"))

    def mount(self, m):
        # redirect_dir=off: renaming a lower directory is EXDEV, as in the AgentFS model.
        must(["mount", "-t", "overlay", "overlay", "-o", self.options(m) + ",redirect_dir=off",
              m.mnt])

    def unmount(self, m):
        must(["umount", m.mnt])

    def delta_state(self, m, rel):
        """What the delta holds for the subtree rel (comparable before/after)."""
        return manifest(os.path.join(m.upper, rel)) if os.path.isdir(os.path.join(m.upper, rel)) \
            else {}

    def in_delta(self, m, rel):
        return os.path.lexists(os.path.join(m.upper, rel))


class FuseOverlayfs(KernelOverlay):
    name = "fuse-overlayfs"

    def mount(self, m):
        must(["fuse-overlayfs", "-o", self.options(m), m.mnt])

    def unmount(self, m):
        must(["fusermount3", "-u", m.mnt])


class AgentFs:
    name = "agentfs"

    def __init__(self, binary):
        self.bin = binary

    def create(self, m):
        must([self.bin, "init", m.db, "--base", m.base] + m.init_args)

    def mount(self, m):
        must([self.bin, "mount", m.db, m.mnt])

    def unmount(self, m):
        must([self.bin, "umount", m.mnt])

    def query(self, m, sql, args=()):
        # Another process sees committed state only: a barrier (fsync of a directory of the
        # mount) commits every acknowledged operation first.
        fd = os.open(m.mnt, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        c = sqlite3.connect("file:%s?mode=ro" % m.db, uri=True, timeout=30)
        try:
            return c.execute(sql, args).fetchall()
        finally:
            c.close()

    def delta_ino(self, m, rel):
        """The delta inode at rel (None if the delta has no entry there)."""
        ino = 1
        for name in [p for p in rel.split("/") if p and p != "."]:
            rows = self.query(m, "SELECT ino FROM fs_dentry WHERE parent_ino=? AND name=?",
                              (ino, name))
            if not rows:
                return None
            ino = rows[0][0]
        return ino

    def in_delta(self, m, rel):
        return self.delta_ino(m, rel) is not None

    def db_bytes(self, m):
        return sum(os.path.getsize(m.db + s) for s in ("", "-wal") if os.path.exists(m.db + s))

    def delta_state(self, m, rel):
        rc, out = sh([self.bin, "diff", m.db, "--name-only"])
        if rc != 0:
            raise RuntimeError("agentfs diff --name-only: exit %d: %s" % (rc, out.strip()[-300:]))
        mine = sorted(line for line in out.splitlines()
                      if line.strip("/").startswith(rel.strip("/")))
        return {"diff": mine, "db_bytes": self.db_bytes(m),
                "fs_data": self.query(m, "SELECT count(*) FROM fs_data")[0][0],
                "fs_inode": self.query(m, "SELECT count(*) FROM fs_inode")[0][0]}


def need_agentfs(what):
    if LEG.name != "agentfs":
        raise Skip("%s: agentfs leg only" % what)


def base_of(t, *parts):
    return os.path.join(MOUNT.base_path(t.dir), *parts)


def rel_of(t, *parts):
    return os.path.join(MOUNT.rel(t.dir), *parts)


# --------------------------------------------------------------------------
# copyup: reading changes nothing; the first change copies up
# --------------------------------------------------------------------------


@check("copyup.reads_change_nothing")
def _(t):
    before = LEG.delta_state(MOUNT, rel_of(t))
    for name in ("small.txt", "medium.bin", "big.bin", "exec.sh", "empty", "hard1",
                 "sub/deeper/nested.txt"):
        p = t.p(name)
        expect_eq(read_file(p), read_file(base_of(t, name)), "content of %s" % name)
        if os.path.getsize(p):
            with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
                expect_eq(mm[:], read_file(base_of(t, name)), "mmap of %s" % name)
        os.close(os.open(p, os.O_RDONLY))
    expect_eq(os.readlink(t.p("link-in")), "small.txt", "link-in target")
    expect_eq(os.readlink(t.p("link-out")), OUTSIDE_TARGET, "link-out target")
    expect_eq(read_file(t.p("link-in")), b"hello, base\n", "read through link-in")
    for dirpath, _, _ in os.walk(t.dir):
        os.listdir(dirpath)
        os.stat(dirpath)
    expect_eq(sorted(os.listdir(t.p("emptydir"))), [], "listing of emptydir")
    after = LEG.delta_state(MOUNT, rel_of(t))
    if before != after:
        fail("reads changed the delta: %r -> %r" % (before, after))


def _copied_up(t, name, change, expected):
    base_before = read_file(base_of(t, name))
    expect(not LEG.in_delta(MOUNT, rel_of(t, name)), "%s in the delta before the change" % name)
    change(t.p(name))
    expect(LEG.in_delta(MOUNT, rel_of(t, name)), "%s not copied up by the change" % name)
    expect_eq(read_file(t.p(name)), expected(base_before), "content of %s after copy-up" % name)
    expect_eq(read_file(base_of(t, name)), base_before, "base %s after copy-up" % name)


@check("copyup.write")
def _(t):
    def change(p):
        fd = os.open(p, os.O_WRONLY)
        try:
            pwrite_all(fd, b"XY", 50 * 1024)
        finally:
            os.close(fd)
    _copied_up(t, "medium.bin", change, lambda b: b[:50 * 1024] + b"XY" + b[50 * 1024 + 2:])

    def append(p):
        with open(p, "ab") as f:
            f.write(b"tail")
    _copied_up(t, "big.bin", append, lambda b: b + b"tail")


@check("copyup.chmod")
def _(t):
    _copied_up(t, "small.txt", lambda p: os.chmod(p, 0o600), lambda b: b)
    expect_eq(stat.S_IMODE(os.stat(t.p("small.txt")).st_mode), 0o600, "mode after chmod")
    expect_eq(stat.S_IMODE(os.stat(base_of(t, "small.txt")).st_mode), 0o644, "base mode")


@check("copyup.utime")
def _(t):
    _copied_up(t, "exec.sh", lambda p: os.utime(p, ns=(10**18, 10**18)), lambda b: b)
    expect_eq(os.stat(t.p("exec.sh")).st_mtime_ns, 10**18, "mtime after utime")
    expect_eq(stat.S_IMODE(os.stat(t.p("exec.sh")).st_mode), 0o755, "mode kept by copy-up")


@check("copyup.truncate")
def _(t):
    _copied_up(t, "sub/deeper/nested.txt", lambda p: os.truncate(p, 1000), lambda b: b[:1000])
    _copied_up(t, "hard1", lambda p: os.truncate(p, 0), lambda b: b"")


@check("copyup.xattr")
def _(t):
    try:
        _copied_up(t, "medium.bin", lambda p: os.setxattr(p, "user.gate", b"v1"), lambda b: b)
    except OSError as e:
        if e.errno == errno.EOPNOTSUPP:
            raise Skip("user xattrs not supported")
        raise
    expect_eq(os.getxattr(t.p("medium.bin"), "user.gate"), b"v1", "xattr after copy-up")


@check("copyup.base_xattrs")
def _(t):
    # The base's extended attributes show through, are copied up with the object, and
    # removing one hides it in the merged view only.
    try:
        base_has = os.getxattr(base_of(t, "tagged"), "user.origin")
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise Skip("the base filesystem has no user xattrs")
        raise
    expect_eq(os.getxattr(t.p("tagged"), "user.origin"), base_has, "base xattr through the mount")
    expect("user.origin" in os.listxattr(t.p("tagged")), "base xattr not listed")
    expect_eq(os.getxattr(t.p("tagdir"), "user.dir"), b"d", "base directory xattr")
    expect(not LEG.in_delta(MOUNT, rel_of(t, "tagged")), "reading xattrs copied the file up")
    _copied_up(t, "tagged", lambda p: os.chmod(p, 0o600), lambda b: b)
    expect_eq(os.getxattr(t.p("tagged"), "user.origin"), b"base", "xattr kept by copy-up")
    os.removexattr(t.p("tagdir"), "user.dir")
    expect_errno(errno.ENODATA, os.getxattr, t.p("tagdir"), "user.dir", what="removed base xattr")
    expect("user.dir" not in os.listxattr(t.p("tagdir")), "removed base xattr still listed")
    expect_eq(os.getxattr(base_of(t, "tagdir"), "user.dir"), b"d", "base directory xattr after removal")
    expect_eq(os.getxattr(base_of(t, "tagged"), "user.origin"), b"base", "base file xattr")


@check("copyup.write_clears_setid")
def _(t):
    # An unprivileged write to a set-id base file copies it up without S_ISUID and S_ISGID
    # (group execute is set), as a write to any file does.
    def change(p):
        gatekit.user_ok(lambda: pwrite_all_path(os.path.basename(p), b"X", 0), "user write to 06777",
                        uid=gatekit.UID_B, gid=gatekit.GID_B, cwd=t.dir)
    _copied_up(t, "setid", change, lambda b: b"X" + b[1:])
    expect_eq(stat.S_IMODE(os.stat(t.p("setid")).st_mode), 0o777, "mode after unprivileged write")
    expect_eq(stat.S_IMODE(os.stat(base_of(t, "setid")).st_mode), 0o6777, "base mode")


def pwrite_all_path(path, data, off):
    fd = os.open(path, os.O_WRONLY)
    try:
        pwrite_all(fd, data, off)
    finally:
        os.close(fd)


@check("copyup.owner_and_mode_kept")
def _(t):
    # A write as root to a file root does not own: copy-up keeps owner, group and mode.
    _copied_up(t, "secret", lambda p: open(p, "ab").close() or os.truncate(p, 3), lambda b: b[:3])
    st = os.stat(t.p("secret"))
    expect_eq((st.st_uid, st.st_gid), (gatekit.UID_A, gatekit.GID_A), "owner after copy-up")
    expect_eq(stat.S_IMODE(st.st_mode), 0o640, "mode after copy-up")
    gatekit.user_errno(errno.EACCES, lambda: read_file(os.path.basename(t.p("secret"))),
                       "read secret", uid=gatekit.UID_B, gid=gatekit.GID_B, cwd=t.dir)


# --------------------------------------------------------------------------
# ino: st_ino stable across copy-up; hard links
# --------------------------------------------------------------------------


@check("ino.stable_across_copy_up")
def _(t):
    for name, change in (("medium.bin", lambda p: write_file(p, b"new")),
                         ("small.txt", lambda p: os.chmod(p, 0o600)),
                         ("sub/a.txt", lambda p: os.utime(p, ns=(1, 1)))):
        ino = os.stat(t.p(name)).st_ino
        change(t.p(name))
        expect_eq(os.stat(t.p(name)).st_ino, ino, "st_ino of %s after copy-up" % name)
        fd = os.open(t.p(name), os.O_RDONLY)
        expect_eq(os.fstat(fd).st_ino, ino, "fstat st_ino of %s" % name)
        os.close(fd)


@check("ino.hard_link_to_base_file")
def _(t):
    ino = os.stat(t.p("small.txt")).st_ino
    os.link(t.p("small.txt"), t.p("small-link"))
    a, b = os.stat(t.p("small.txt")), os.stat(t.p("small-link"))
    expect_eq(a.st_ino, b.st_ino, "st_ino of both names")
    expect_eq(a.st_ino, ino, "st_ino after link")
    expect_eq((a.st_nlink, b.st_nlink), (2, 2), "nlink of both names")
    with open(t.p("small-link"), "ab") as f:
        f.write(b"more")
    expect_eq(read_file(t.p("small.txt")), b"hello, base\nmore", "write through the link")
    expect_eq(read_file(base_of(t, "small.txt")), b"hello, base\n", "base after link + write")


@check("ino.base_hard_link_pair")
def _(t):
    # Before any copy-up the base's pair shows as one inode with two links. (After a copy-up
    # of one name kernel overlayfs without index=on breaks the pair; not checked.)
    a, b = os.stat(t.p("hard1")), os.stat(t.p("hard2"))
    expect_eq(a.st_ino, b.st_ino, "st_ino of hard1 and hard2")
    expect_eq((a.st_nlink, b.st_nlink), (2, 2), "nlink of hard1 and hard2")


# --------------------------------------------------------------------------
# whiteout: deletes, recreation, merged readdir
# --------------------------------------------------------------------------


@check("whiteout.delete_files_and_subtree")
def _(t):
    os.unlink(t.p("small.txt"))
    os.unlink(t.p("link-out"))
    shutil.rmtree(t.p("tree"))
    os.rmdir(t.p("emptydir"))
    for name in ("small.txt", "link-out", "tree", "tree/d0", "tree/d1/e/g", "emptydir"):
        expect_errno(errno.ENOENT, os.lstat, t.p(name), what="lstat %s after delete" % name)
    names = os.listdir(t.dir)
    for name in ("small.txt", "link-out", "tree", "emptydir"):
        expect(name not in names, "%s still listed after delete" % name)
    expect("link-in" in names and "sub" in names, "untouched names missing: %r" % names)
    # link-in now dangles: it pointed at the deleted small.txt.
    expect_errno(errno.ENOENT, os.stat, t.p("link-in"), what="stat of dangling link-in")
    expect(os.path.exists(base_of(t, "tree", "d1", "e", "g")), "base subtree gone")


@check("whiteout.recreated_dir_is_empty")
def _(t):
    shutil.rmtree(t.p("tree"))
    os.mkdir(t.p("tree"))
    expect_eq(os.listdir(t.p("tree")), [], "listing of recreated tree")
    expect_errno(errno.ENOENT, os.lstat, t.p("tree", "d0"), what="old base child d0")
    os.mkdir(t.p("tree", "d0"))
    expect_eq(os.listdir(t.p("tree", "d0")), [], "listing of recreated tree/d0")
    write_file(t.p("tree", "d0", "f"), b"new")
    expect_eq(read_file(t.p("tree", "d0", "f")), b"new", "new file in recreated dir")
    # A deleted file comes back as a new, empty file.
    os.unlink(t.p("medium.bin"))
    write_file(t.p("medium.bin"), b"")
    expect_eq(read_file(t.p("medium.bin")), b"", "recreated medium.bin")


@check("whiteout.merged_readdir")
def _(t):
    base_names = set(os.listdir(base_of(t)))
    os.unlink(t.p("small.txt"))
    shutil.rmtree(t.p("sub"))
    write_file(t.p("new1"), b"1")
    os.mkdir(t.p("newdir"))
    write_file(t.p("medium.bin"), b"rewritten")  # copied up: one entry, not two
    listing = os.listdir(t.dir)
    expect_eq(len(listing), len(set(listing)), "duplicates in %r" % sorted(listing))
    expect_eq(set(listing), (base_names - {"small.txt", "sub"}) | {"new1", "newdir"},
              "merged listing")
    ents = {e.name: e for e in os.scandir(t.dir)}
    for name, e in ents.items():
        expect_eq(e.inode(), os.lstat(t.p(name)).st_ino, "d_ino of %s" % name)
    many = os.listdir(t.p("many"))
    expect_eq(sorted(many), ["b%03d" % i for i in range(300)], "listing of many/")


@check("whiteout.readdir_interleaved", timeout=120)
def _(t):
    d = t.p("many")
    base_names = {"b%03d" % i for i in range(300)}
    removed, added = set(), set()
    seen = []
    it = os.scandir(d)
    try:
        for i, e in enumerate(it):
            seen.append(e.name)
            if i % 7 == 0:
                victim = "b%03d" % (299 - i // 7)
                if victim not in removed and victim not in seen:
                    os.unlink(os.path.join(d, victim))
                    removed.add(victim)
                name = "n%03d" % i
                write_file(os.path.join(d, name), b"x")
                added.add(name)
    finally:
        it.close()
    expect_eq(len(seen), len(set(seen)), "an entry was returned twice")
    stable = base_names - removed
    missing = stable - set(seen)
    expect(not missing, "entries present throughout but not returned: %s" % sorted(missing)[:5])
    unknown = set(seen) - base_names - added
    expect(not unknown, "unknown entries returned: %s" % sorted(unknown)[:5])
    final = set(os.listdir(d))
    expect_eq(final, stable | added, "listing afterwards")


@check("whiteout.readdir_during_copy_up")
def _(t):
    # A name copied up while a listing is in progress keeps its place: listed exactly once.
    d = t.p("many")
    seen = []
    it = os.scandir(d)
    try:
        for i, e in enumerate(it):
            seen.append(e.name)
            if i == 50:
                os.chmod(os.path.join(d, "b299"), 0o600)
                write_file(os.path.join(d, "b298"), b"changed", flags=os.O_APPEND)
    finally:
        it.close()
    expect_eq(sorted(seen), ["b%03d" % i for i in range(300)], "names listed during copy-ups")
    expect_eq(len(os.listdir(d)), 300, "listing afterwards")


@check("copyup.unlinked_while_open")
def _(t):
    # Open a base file, remove its name, keep writing: the writes are not lost (overlayfs
    # copies up at open; the data lives on in an orphan until the last close).
    fd = os.open(t.p("small.txt"), os.O_RDWR | os.O_APPEND)
    try:
        os.unlink(t.p("small.txt"))
        expect_eq(os.write(fd, b"more\n"), 5, "write after unlink")
        os.fsync(fd)
        os.lseek(fd, 0, os.SEEK_SET)
        expect_eq(os.read(fd, 100), b"hello, base\nmore\n", "content through the open fd")
        os.fchmod(fd, 0o600)
        expect_eq(os.fstat(fd).st_mode & 0o777, 0o600, "fchmod after unlink")
    finally:
        os.close(fd)
    expect(not os.path.lexists(t.p("small.txt")), "the name stays removed")
    fd = os.open(t.p("exec.sh"), os.O_RDWR)
    try:
        os.rename(t.p("hard1"), t.p("exec.sh"))
        os.pwrite(fd, b"X", 0)
        os.fsync(fd)
        expect_eq(os.pread(fd, 3, 0), b"X!/", "write to a file replaced by rename")
    finally:
        os.close(fd)
    expect_eq(read_file(t.p("exec.sh")), b"linked\n", "the new name's content")


@check("partial.huge_truncate_and_fallocate")
def _(t):
    need_agentfs("partial-origin")
    # Sizes far beyond the base must not make the server take over every chunk.
    with open(t.p("big.bin"), "r+b") as f:
        os.ftruncate(f.fileno(), 1 << 50)
        expect_eq(os.fstat(f.fileno()).st_size, 1 << 50, "size after a huge truncate")
        os.ftruncate(f.fileno(), BIG)
        os.posix_fallocate(f.fileno(), 0, 1 << 40)
        expect_eq(os.fstat(f.fileno()).st_size, 1 << 40, "size after a huge fallocate")
        os.ftruncate(f.fileno(), BIG)
    expect_eq(len(read_file(t.p("big.bin"))), BIG, "size back")


# --------------------------------------------------------------------------
# exdev: renames
# --------------------------------------------------------------------------


@check("exdev.rename_base_dir")
def _(t):
    expect_errno(errno.EXDEV, os.rename, t.p("sub"), t.p("sub2"), what="rename(2) of base dir")
    # A base directory that was copied up (a child changed) is still a base directory.
    write_file(t.p("tree", "d0", "new"), b"n")
    expect_errno(errno.EXDEV, os.rename, t.p("tree"), t.p("tree2"),
                 what="rename(2) of copied-up base dir")
    expect(os.path.isdir(t.p("sub")) and not os.path.lexists(t.p("sub2")), "state after EXDEV")


@check("exdev.mv_base_dir")
def _(t):
    want = view(t.p("sub"))
    rc, out = sh(["mv", t.p("sub"), t.p("moved")])
    expect(rc == 0, "mv of a base dir: exit %d: %s" % (rc, out.strip()))
    expect_errno(errno.ENOENT, os.lstat, t.p("sub"), what="old name after mv")
    expect_eq(view(t.p("moved")), want, "moved tree")
    expect("sub" not in os.listdir(t.dir), "old name still listed")


@check("exdev.rename_base_files")
def _(t):
    data = read_file(t.p("big.bin"))
    ino = os.stat(t.p("big.bin")).st_ino
    os.rename(t.p("big.bin"), t.p("big2.bin"))
    expect_errno(errno.ENOENT, os.lstat, t.p("big.bin"), what="old name")
    expect_eq(read_file(t.p("big2.bin")), data, "content under the new name")
    expect_eq(os.stat(t.p("big2.bin")).st_ino, ino, "st_ino after rename")
    os.rename(t.p("sub", "a.txt"), t.p("a-moved.txt"))  # across directories
    expect_eq(read_file(t.p("a-moved.txt")), b"a\n", "moved across dirs")
    os.rename(t.p("link-in"), t.p("link-renamed"))
    expect_eq(os.readlink(t.p("link-renamed")), "small.txt", "renamed symlink")
    os.rename(t.p("hard1"), t.p("small.txt"))  # over another base file
    expect_eq(read_file(t.p("small.txt")), b"linked\n", "rename over a base file")
    names = set(os.listdir(t.dir))
    expect(not names & {"big.bin", "hard1", "link-in"}, "old names listed: %r" % sorted(names))
    expect_eq(read_file(base_of(t, "big.bin")), data, "base big.bin")


@check("exdev.rename_overlay_dir")
def _(t):
    os.makedirs(t.p("mine", "x"))
    write_file(t.p("mine", "x", "f"), b"f")
    os.rename(t.p("mine"), t.p("yours"))
    expect_eq(read_file(t.p("yours", "x", "f")), b"f", "content after dir rename")
    expect_errno(errno.ENOENT, os.lstat, t.p("mine"), what="old dir name")
    os.rename(t.p("yours"), t.p("sub", "yours"))  # into a merged dir
    expect_eq(read_file(t.p("sub", "yours", "x", "f")), b"f", "after move into base dir")


# --------------------------------------------------------------------------
# drift: the base changes behind the mount (own base copy, restored by each check)
# --------------------------------------------------------------------------


def _drift(t, name, new):
    """Read part of name through the mount (fills caches), change the base file, read it all.
    Returns the whole-file read (bytes) or the errno."""
    old = read_file(t.p(name))
    fd = os.open(t.p(name), os.O_RDONLY)
    try:
        pread_exact(fd, max(1, len(old) // 2), 0)  # leave the first half in the page cache
    finally:
        os.close(fd)
    rel = MOUNT.rel(t.p(name))
    try:
        write_file(os.path.join(MOUNT.base, rel), new)
        try:
            got = read_file(t.p(name))
        except OSError as e:
            return old, e.errno
        return old, got
    finally:
        restore_from(PRISTINE, MOUNT.base, rel)


def _drift_whole(t, name, new):
    old, got = _drift(t, name, new)
    if isinstance(got, int):
        expect_eq(got, errno.EIO, "errno of a read after drift")
        return
    expect(got in (old, new), "read after drift is neither the old nor the new content (%s / %s)"
           % (gatekit.describe_bytes_diff(got, old), gatekit.describe_bytes_diff(got, new)))


@check("drift.same_size")
def _(t):
    _drift_whole(t, "big.bin", random_pattern(BIG, seed=99))


@check("drift.other_size")
def _(t):
    _drift_whole(t, "medium.bin", pattern(70 * 1024 + 11, seed=42))


@check("drift.after_copy_up_the_delta_wins")
def _(t):
    write_file(t.p("small.txt"), b"delta")
    rel = MOUNT.rel(t.p("small.txt"))
    try:
        write_file(os.path.join(MOUNT.base, rel), b"changed base")
        expect_eq(read_file(t.p("small.txt")), b"delta", "copied-up file after base drift")
    finally:
        restore_from(PRISTINE, MOUNT.base, rel)


# --------------------------------------------------------------------------
# partial: partial-origin files (agentfs, init --partial-origin on)
# --------------------------------------------------------------------------


def _rows(table, ino):
    col = "delta_ino"
    return LEG.query(MOUNT, "SELECT count(*) FROM %s WHERE %s=?" % (table, col), (ino,))[0][0]


@check("partial.one_byte_write_and_remount")
def _(t):
    need_agentfs("partial-origin")
    want = bytearray(read_file(base_of(t, "big.bin")))
    fd = os.open(t.p("big.bin"), os.O_WRONLY)
    try:
        pwrite_all(fd, b"\x5a", BIG // 2 + 3)
        os.fsync(fd)
    finally:
        os.close(fd)
    want[BIG // 2 + 3] = 0x5A
    expect_eq(read_file(t.p("big.bin")), bytes(want), "content after a 1-byte write")
    ino = LEG.delta_ino(MOUNT, rel_of(t, "big.bin"))
    expect(ino is not None, "big.bin not in the delta")
    expect_eq(_rows("fs_partial_origin", ino), 1, "fs_partial_origin rows of big.bin")
    data_rows = LEG.query(MOUNT, "SELECT count(*) FROM fs_data WHERE ino=?", (ino,))[0][0]
    expect(data_rows <= 2, "a 1-byte write stored %d chunks" % data_rows)
    MOUNT.remount()
    expect_eq(read_file(t.p("big.bin")), bytes(want), "content after remount")


@check("partial.truncate_shrink_extend")
def _(t):
    need_agentfs("partial-origin")
    base = read_file(base_of(t, "big.bin"))
    with open(t.p("big.bin"), "r+b") as f:
        f.write(b"HEAD")
    cut = MIB + 12345
    os.truncate(t.p("big.bin"), cut)
    os.truncate(t.p("big.bin"), BIG)
    want = b"HEAD" + base[4:cut] + bytes(BIG - cut)
    expect_eq(read_file(t.p("big.bin")), want, "content after shrink + extend")
    MOUNT.remount()
    expect_eq(read_file(t.p("big.bin")), want, "content after remount")


@check("partial.unlink_removes_rows")
def _(t):
    need_agentfs("partial-origin")
    with open(t.p("big.bin"), "r+b") as f:
        f.seek(2 * MIB)
        f.write(b"x")
    ino = LEG.delta_ino(MOUNT, rel_of(t, "big.bin"))
    expect(ino is not None, "big.bin not in the delta after a write")
    expect_eq(_rows("fs_partial_origin", ino), 1, "fs_partial_origin rows before unlink")
    expect(_rows("fs_chunk_override", ino) >= 1, "no fs_chunk_override row before unlink")
    os.unlink(t.p("big.bin"))
    MOUNT.remount()  # the last reference is gone once the kernel forgot the inode
    for table in ("fs_partial_origin", "fs_chunk_override", "fs_origin"):
        expect_eq(_rows(table, ino), 0, "%s rows after unlink" % table)


@check("partial.drift_is_eio")
def _(t):
    need_agentfs("partial-origin")
    with open(t.p("big.bin"), "r+b") as f:
        f.seek(100)
        f.write(b"x")
    rel = MOUNT.rel(t.p("big.bin"))
    try:
        write_file(os.path.join(MOUNT.base, rel), random_pattern(BIG, seed=7))
        expect_errno(errno.EIO, read_file, t.p("big.bin"), what="read of a drifted partial file")
    finally:
        restore_from(PRISTINE, MOUNT.base, rel)


# --------------------------------------------------------------------------
# roundtrip: diff --patch | git apply and apply give the merged view (agentfs)
# --------------------------------------------------------------------------


def _session(root):
    """A scripted session in an overlay whose base is a fixture."""
    write_file(os.path.join(root, "created.txt"), b"created\n")
    os.makedirs(os.path.join(root, "newdir", "a", "b"))
    write_file(os.path.join(root, "newdir", "a", "b", "deep.txt"), b"deep\n")
    write_file(os.path.join(root, "binary.bin"), bytes(range(256)) * 40)
    with open(os.path.join(root, "sub", "a.txt"), "ab") as f:
        f.write(b"appended line\n")
    fd = os.open(os.path.join(root, "medium.bin"), os.O_WRONLY)
    pwrite_all(fd, b"\x00\xffbinary edit", 4000)
    os.close(fd)
    os.unlink(os.path.join(root, "small.txt"))
    shutil.rmtree(os.path.join(root, "tree", "d1"))
    os.rename(os.path.join(root, "hard2"), os.path.join(root, "renamed"))
    os.rename(os.path.join(root, "sub", "deeper", "nested.txt"), os.path.join(root, "nested-moved"))
    os.chmod(os.path.join(root, "exec.sh"), 0o644)
    os.chmod(os.path.join(root, "created.txt"), 0o755)
    os.symlink("created.txt", os.path.join(root, "newlink"))
    os.unlink(os.path.join(root, "link-out"))
    os.symlink("/etc/passwd", os.path.join(root, "link-out"))


def _git_view(v):
    """What git can carry: files/symlinks with content, exec bit only, no directories."""
    return {p: (k, 0o755 if (k == "f" and m & 0o100) else (0o644 if k == "f" else None), x)
            for p, (k, m, x) in v.items() if k != "d"}


@check("roundtrip.diff_patch_and_apply", timeout=300)
def _(t):
    need_agentfs("diff/apply")
    work = t.dir  # outside any mount: the check's directory in the gate's work area
    a, b = os.path.join(work, "copy-a"), os.path.join(work, "copy-b")
    build_fixture(a)
    build_fixture(b)
    m = Mount(LEG, b, os.path.join(work, "m"))
    try:
        _session(m.mnt)
        merged = view(m.mnt)
    finally:
        m.unmount()
    # Bytes, not text: a file without NUL bytes is a text diff even if it is not UTF-8.
    d = subprocess.run([LEG.bin, "diff", m.db, "--patch", "--binary"], stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    expect(d.returncode == 0, "agentfs diff --patch: exit %d: %s"
           % (d.returncode, d.stderr.decode(errors="replace").strip()[-300:]))
    # Outside any repository (the work area may lie inside one, where git apply would take
    # paths relative to that repository's top and silently skip them).
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=os.path.dirname(a))
    p = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], input=d.stdout, cwd=a, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    expect(p.returncode == 0, "git apply: %s" % p.stdout.decode(errors="replace")[-500:])
    rc, out = sh([LEG.bin, "apply", m.db])
    expect(rc == 0, "agentfs apply: exit %d: %s" % (rc, out.strip()[-300:]))
    vb = view(b)
    diff = manifest_diff(merged, vb)
    expect(not diff, "apply result differs from the merged view: %s" % diff)
    # git carries no directories (an empty one vanishes) and only the exec bit of a mode.
    ga, gm = _git_view(view(a)), _git_view(merged)
    diff = manifest_diff(gm, ga)
    expect(not diff, "git apply result differs from the merged view: %s" % diff)


# --------------------------------------------------------------------------
# Runner
# --------------------------------------------------------------------------

GROUPS_ON_MAIN = ("copyup", "ino", "whiteout", "exdev")

# Checks a reference leg is known to fail, with the reason; they are not run on that leg and
# are reported as SKIP with the reason. Keys are full check names.
EXCLUDED = {
    "kernel-overlay": {
        # overlayfs reports st_nlink 1 for a merged directory (the kernel's overlayfs
        # documentation: link counts of merged directories are not computed; 1 means
        # "unknown" to find(1)), so the ext4 rule "2 + subdirectories" does not hold there.
        "posix.base/mkdir.nlink": "overlayfs reports nlink 1 for merged directories",
        "posix.base/rename.dir_over_empty_dir": "overlayfs reports nlink 1 for merged directories",
    },
    "agentfs": {
        # Like overlayfs, AgentFS overlay mode reports st_nlink 1 for a merged directory (the
        # base's subdirectories are not counted without listing the base).
        "posix.base/mkdir.nlink": "merged directories report nlink 1, as on overlayfs",
        "posix.base/rename.dir_over_empty_dir": "merged directories report nlink 1, as on overlayfs",
    },
    "fuse-overlayfs": {
        # fuse-overlayfs 1.10 keeps 4 bytes of every name for its ".wh." whiteout prefix:
        # NAME_MAX is 251 (statvfs says so), 255-byte names are ENAMETOOLONG.
        "posix.fresh/open.name_max": "NAME_MAX is 251 (whiteout prefix)",
        "posix.base/open.name_max": "NAME_MAX is 251 (whiteout prefix)",
        "posix.fresh/statvfs.sane": "f_namemax is 251 (whiteout prefix)",
        "posix.base/statvfs.sane": "f_namemax is 251 (whiteout prefix)",
        # fstat of an open, unlinked file still reports nlink 1 (observed with 1.10).
        "posix.fresh/open.unlink_while_open": "nlink 1 after unlink of an open file",
        "posix.base/open.unlink_while_open": "nlink 1 after unlink of an open file",
        # A directory created in a setgid directory gets the creator's gid (observed, 1.10).
        "posix.fresh/perm.setgid_dir_inheritance": "mkdir ignores the parent's setgid bit",
        "posix.base/perm.setgid_dir_inheritance": "mkdir ignores the parent's setgid bit",
        # rm -rf of a base directory, then mkdir of the same name: the old base children
        # show again inside the new directory (observed, 1.10), and it cannot be removed.
        "whiteout.recreated_dir_is_empty": "a re-created directory shows the old base children",
        # An unprivileged write that copies up a 06777 base file keeps both set-id bits
        # (observed, 1.10; a write to a file already in the upper layer clears them).
        "copyup.write_clears_setid": "copy-up by an unprivileged write keeps S_ISUID/S_ISGID",
        # open(dir, O_TMPFILE) answers EOPNOTSUPP (observed, 1.10: it implements no TMPFILE).
        "posix.fresh/tmpfile.link_and_reap": "O_TMPFILE is EOPNOTSUPP",
        "posix.base/tmpfile.link_and_reap": "O_TMPFILE is EOPNOTSUPP",
    },
}
PRISTINE = None  # the pristine copy of the running group's own base (drift, partial)


def group_of(name):
    return name.split(".", 1)[0]


def main(argv=None):
    global LEG, MOUNT, PRISTINE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", required=True, choices=["kernel-overlay", "fuse-overlayfs", "agentfs"])
    ap.add_argument("--agentfs", help="agentfs binary (default target/release/agentfs)")
    ap.add_argument("--workdir", help="where the base, deltas and mounts go (default: a temp dir "
                    "in /var/tmp); not on an overlay or tmpfs for kernel-overlay")
    ap.add_argument("--quick", action="store_true", help="the POSIX checks with smaller sizes")
    ap.add_argument("-k", dest="pattern", action="append", default=[],
                    help="only checks whose name contains PATTERN (repeatable; any matches); "
                    "POSIX checks are named posix.fresh/NAME and posix.base/NAME")
    ap.add_argument("--skip", action="append", default=[],
                    help="do not run checks whose name contains PATTERN (repeatable); they are "
                    "reported as SKIP")
    ap.add_argument("--json", action="store_true", help="print a JSON report on stdout")
    ap.add_argument("--timeout-scale", type=float, default=1.0)
    ap.add_argument("--list", action="store_true", help="list check names and exit")
    args = ap.parse_args(argv)

    excluded = dict(EXCLUDED.get(args.kind, {}))
    every = (["posix.fresh/" + n for n, _, _ in posix_gate.CHECKS]
             + ["posix.base/" + n for n, _, _ in posix_gate.CHECKS] + [n for n, _, _ in GATE.checks])
    for pat in args.skip:
        for name in every:
            if pat in name:
                excluded.setdefault(name, "--skip %s" % pat)

    def chosen(name):
        return (not args.pattern or any(p in name for p in args.pattern)) and name not in excluded

    posix_fresh = [c for c in posix_gate.CHECKS if chosen("posix.fresh/" + c[0])]
    posix_base = [c for c in posix_gate.CHECKS if chosen("posix.base/" + c[0])]
    mine = [c for c in GATE.checks if chosen(c[0])]
    if args.list:
        for n, _, _ in posix_fresh:
            print("posix.fresh/" + n)
        for n, _, _ in posix_base:
            print("posix.base/" + n)
        for n, _, _ in mine:
            print(n)
        return 0
    if os.geteuid() != 0:
        ap.error("run as root (mounts)")

    if args.kind == "kernel-overlay":
        LEG = KernelOverlay()
    elif args.kind == "fuse-overlayfs":
        if shutil.which("fuse-overlayfs") is None:
            ap.error("fuse-overlayfs is not installed (apt-get install fuse-overlayfs)")
        LEG = FuseOverlayfs()
    else:
        binary = args.agentfs or os.path.join(os.path.dirname(HERE), "target", "release", "agentfs")
        if not os.access(binary, os.X_OK):
            ap.error("agentfs binary %s not found (--agentfs)" % binary)
        LEG = AgentFs(os.path.abspath(binary))

    human = sys.stderr if args.json else sys.stdout
    results = []
    mounts = []

    def report(name, ok, detail=""):
        status = "PASS" if ok else "FAIL"
        results.append({"name": name, "status": status, "detail": detail, "seconds": 0})
        print(gatekit.result_line(status, name, detail), file=human, flush=True)

    def run_group(gate, label, checks, scratch, base):
        """Run checks with scratch as their parent dir; the base must not change."""
        before = manifest(base)
        results.extend(gate.run(checks, scratch, quick=args.quick,
                                timeout_scale=args.timeout_scale, out=human, label=label))
        after = manifest(base)
        report("manifest.%s" % (label.rstrip("/") or group_of(checks[0][0])), before == after,
               manifest_diff(before, after))

    def own_base(work, name, checks):
        base = os.path.join(work, name + "-base")
        build_base(base, {name: [n for n, _, _ in checks]}, [])
        pristine = os.path.join(work, name + "-pristine")
        shutil.copytree(base, pristine, symlinks=True)
        return base, pristine

    work = args.workdir and os.path.abspath(args.workdir)
    own_work = work is None
    if own_work:
        work = tempfile.mkdtemp(prefix="overlay-gate-", dir="/var/tmp")
    else:
        work = tempfile.mkdtemp(prefix="overlay-gate-", dir=work)
    t_all = time.monotonic()
    for name, why in excluded.items():
        if not args.pattern or any(p in name for p in args.pattern):
            results.append({"name": name, "status": "SKIP", "detail": why, "seconds": 0})
            print(gatekit.result_line("SKIP", name, "excluded on %s: %s" % (args.kind, why)),
                  file=human, flush=True)
    try:
        by_group = {}
        for c in mine:
            by_group.setdefault(group_of(c[0]), []).append(c)
        main_groups = {g: [n for n, _, _ in by_group.get(g, [])] for g in GROUPS_ON_MAIN}
        base = os.path.join(work, "base")
        build_base(base, main_groups, [n for n, _, _ in posix_base])
        MOUNT = Mount(LEG, base, os.path.join(work, "main"))
        mounts.append(MOUNT)
        if posix_fresh:
            fresh = os.path.join(MOUNT.mnt, "posix-fresh")
            os.mkdir(fresh)
            os.chmod(fresh, 0o755)
            run_group(posix_gate.GATE, "posix.fresh/", posix_fresh, fresh, base)
        if posix_base:
            run_group(posix_gate.GATE, "posix.base/", posix_base, os.path.join(MOUNT.mnt, "posix"), base)
        for g in GROUPS_ON_MAIN:
            if by_group.get(g):
                run_group(GATE, "", by_group[g], os.path.join(MOUNT.mnt, "checks", g), base)
        MOUNT.unmount()
        for g, init_args in (("drift", []), ("partial", ["--partial-origin", "on"])):
            checks = by_group.get(g)
            if not checks:
                continue
            if g == "partial" and LEG.name != "agentfs":
                skipdir = os.path.join(work, "partial-skip")
                os.mkdir(skipdir)
                results.extend(GATE.run(checks, skipdir, timeout_scale=args.timeout_scale,
                                        out=human))
                continue
            gbase, PRISTINE = own_base(work, g, checks)
            MOUNT = Mount(LEG, gbase, os.path.join(work, g), init_args)
            mounts.append(MOUNT)
            run_group(GATE, "", checks, os.path.join(MOUNT.mnt, "checks", g), gbase)
            MOUNT.unmount()
        if by_group.get("roundtrip"):
            # Self-contained: the check builds its two base copies and mounts in its directory.
            rt = os.path.join(work, "roundtrip")
            os.mkdir(rt)
            results.extend(GATE.run(by_group["roundtrip"], rt, timeout_scale=args.timeout_scale,
                                    out=human))
    finally:
        for m in mounts:
            try:
                m.unmount()
            except Exception as e:  # noqa: BLE001
                report("gate.unmount", False, "%s: %s" % (m.mnt, e))
        if not any(is_mounted(m.mnt) for m in mounts):
            gatekit.rmtree(work)

    npass = sum(r["status"] == "PASS" for r in results)
    nfail = sum(r["status"] == "FAIL" for r in results)
    nskip = sum(r["status"] == "SKIP" for r in results)
    summary = gatekit.summary_line(npass, nfail, nskip)
    print(summary, file=human, flush=True)
    print("# %s leg, %.1fs" % (LEG.name, time.monotonic() - t_all), file=sys.stderr, flush=True)
    if args.json:
        json.dump({"kind": LEG.name, "passed": npass, "failed": nfail, "skipped": nskip,
                   "summary": summary, "results": results}, sys.stdout, indent=1)
        print()
    return 0 if nfail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
