#!/usr/bin/env python3
"""Stand-in for the agentfs binary, for testing crash_gate.py's own logic.

Implements the same CLI contract with a bind mount of a plain directory
(DB + ".data") instead of FUSE, and a real SQLite file at DB so the
integrity check has something to check:

    fake_agentfs.py init DB
    fake_agentfs.py mount DB MNT -f     bind-mounts DB.data on MNT, then stays
                                        in the foreground until MNT is unmounted
    fake_agentfs.py umount MNT
    fake_agentfs.py integrity DB        PRAGMA quick_check: exit 0 ok, 1 not

A SIGKILLed fake server leaves its bind mount behind, like a dead FUSE server
leaves a dead mount, so the gate's cleanup path (umount -l) is exercised.

With FAKE_AGENTFS_FUSE=bindfs (and bindfs installed) `mount` execs
`bindfs -f DB.data MNT` instead: a real FUSE server, so killing it leaves a
dead FUSE mount (ENOTCONN) and exercises the fusectl abort path too.

Fault injection for negative tests (environment variables):
    FAKE_AGENTFS_CORRUPT=1   on every mount, flip one byte of the largest
                             file in the tree (the gate must FAIL)
    FAKE_AGENTFS_LEAK=1      on every mount, create an unexpected file
"""

import os
import sqlite3
import subprocess
import sys
import time


def mounted(mnt):
    """True if mnt is a mount point (bind mounts share st_dev, so ask mountinfo)."""
    mnt = os.path.realpath(mnt)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == mnt for line in f)


def usage(msg):
    print("error: %s\n\nUsage: agentfs <init|mount|umount> ..." % msg, file=sys.stderr)
    return 2


def inject_faults(data):
    if os.environ.get("FAKE_AGENTFS_CORRUPT") == "1":
        best = None
        for dirpath, _, files in os.walk(data):
            for n in files:
                p = os.path.join(dirpath, n)
                s = os.path.getsize(p)
                if s and (best is None or s > best[0]):
                    best = (s, p)
        if best:
            with open(best[1], "r+b") as f:
                f.seek(best[0] // 2)
                b = f.read(1)
                f.seek(best[0] // 2)
                f.write(bytes([b[0] ^ 0xFF]))
    if os.environ.get("FAKE_AGENTFS_LEAK") == "1":
        for dirpath, dirs, _ in os.walk(data):
            if os.path.basename(dirpath).startswith("w"):
                open(os.path.join(dirpath, "leaked-garbage"), "w").write("x")
                break


def main(argv):
    if not argv:
        return usage("missing subcommand")
    cmd, rest = argv[0], argv[1:]
    if cmd == "init" and len(rest) == 1:
        db = rest[0]
        con = sqlite3.connect(db)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("CREATE TABLE IF NOT EXISTS mounts(t REAL)")
        con.commit()
        con.close()
        os.makedirs(db + ".data", exist_ok=True)
        return 0
    if cmd == "mount" and len(rest) == 3 and rest[2] == "-f":
        db, mnt = rest[0], rest[1]
        con = sqlite3.connect(db)
        con.execute("INSERT INTO mounts VALUES (?)", (time.time(),))
        con.commit()
        inject_faults(db + ".data")
        if os.environ.get("FAKE_AGENTFS_FUSE") == "bindfs":
            # A real FUSE server: this process becomes bindfs, so SIGKILL
            # leaves a dead FUSE mount (ENOTCONN) exactly like agentfs would.
            con.close()
            os.execvp("bindfs", ["bindfs", "-f", "--no-allow-other", db + ".data", mnt])
        rc = subprocess.call(["mount", "--bind", db + ".data", mnt])
        if rc != 0:
            return 1
        # Serve "in the foreground": keep the DB busy until unmounted.
        while mounted(mnt):
            con.execute("INSERT INTO mounts VALUES (?)", (time.time(),))
            con.commit()
            time.sleep(0.05)
        con.close()
        return 0
    if cmd == "umount" and len(rest) == 1:
        return subprocess.call(["umount", rest[0]])
    if cmd == "integrity" and len(rest) == 1:
        con = sqlite3.connect(rest[0])
        ok = con.execute("PRAGMA quick_check").fetchall() == [("ok",)]
        return 0 if ok else 1
    return usage("unrecognized subcommand '%s'" % cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
