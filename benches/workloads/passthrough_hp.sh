#!/bin/sh
# Build libfuse's passthrough_hp example for the `passthrough_hp` column of the workloads bench
# (benches/workloads.rs), from libfuse's release source, and put it at
# target/bench-tools/passthrough_hp. Does nothing when that file is already there.
#
# The source is the libfuse 3.18.3 release tarball as Debian's archive carries it (the same
# bytes as its .dsc names), checked against a pinned sha256. libfuse is built as a static
# library, so the binary runs from anywhere without it installed (liburing and libnuma stay
# shared). It is built with FUSE-over-io_uring (libfuse 3.18 and later), so one binary serves
# both of the bench's columns: /dev/fuse, and the ring with FUSE_URING_ENABLE=1. A build
# without the ring fails here rather than giving a column that silently uses /dev/fuse. Only
# the example is built: no utilities (fusermount3, mount.fuse3; the bench runs as root and
# mounts directly), no tests, so no udev is needed. A binary from another version is rebuilt.
#
# Needs a C and C++ compiler, pkg-config, curl, python3, liburing (with SQE128: 2.2 or later)
# and libnuma; meson and ninja are taken from PATH or installed with pip into a virtual
# environment under target/bench-tools. On Debian, run as root, missing system packages are
# installed with apt-get.
#
# Usage: sh benches/workloads/passthrough_hp.sh
set -eu

VERSION=3.18.3
URL="http://deb.debian.org/debian/pool/main/f/fuse3/fuse3_${VERSION}.orig.tar.gz"
SHA256=bcd19582c5e30f7fe45dd86a5540e998590aa01903afc7ebcbeea6c8ac5421ee
MESON=meson==1.6.1
NINJA=ninja==1.11.1.3

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TOOLS="$ROOT/target/bench-tools"
OUT="$TOOLS/passthrough_hp"
# What the binary was built from; a binary without it (or from another version) is rebuilt.
STAMP="$OUT.built"
BUILT="libfuse $VERSION with io_uring"

if [ -x "$OUT" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$BUILT" ]; then
    echo "passthrough_hp: $OUT is already built ($BUILT)"
    exit 0
fi

die() {
    echo "passthrough_hp: $*" >&2
    exit 1
}

# Install Debian packages, as root with apt-get; elsewhere name what is missing and stop.
apt_install() {
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
    else
        die "missing: $* (install them, or run this as root on Debian)"
    fi
}

# System packages a fresh Debian lacks.
missing=""
command -v c++ >/dev/null 2>&1 || missing="$missing g++"
command -v cc >/dev/null 2>&1 || missing="$missing gcc"
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
command -v curl >/dev/null 2>&1 || missing="$missing curl ca-certificates"
command -v python3 >/dev/null 2>&1 || missing="$missing python3"
if ! command -v pkg-config >/dev/null 2>&1 || ! pkg-config --exists liburing; then
    missing="$missing liburing-dev"
fi
if ! command -v pkg-config >/dev/null 2>&1 || ! pkg-config --exists numa; then
    missing="$missing libnuma-dev"
fi
# shellcheck disable=SC2086 # a word list on purpose
[ -z "$missing" ] || apt_install $missing

mkdir -p "$TOOLS"
WORK=$(mktemp -d "$TOOLS/passthrough_hp-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT INT TERM

# meson and ninja: from PATH, else a virtual environment kept for the next build.
if command -v meson >/dev/null 2>&1 && command -v ninja >/dev/null 2>&1; then
    MESON_BIN=meson
    NINJA_BIN=ninja
else
    VENV="$TOOLS/venv"
    if [ ! -x "$VENV/bin/meson" ] || [ ! -x "$VENV/bin/ninja" ]; then
        rm -rf "$VENV"
        if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
            # Debian keeps venv's pip bootstrap in its own package.
            rm -rf "$VENV"
            apt_install python3-venv
            python3 -m venv "$VENV" || die "python3 -m venv $VENV failed"
        fi
        "$VENV/bin/pip" install --quiet "$MESON" "$NINJA" || die "pip install $MESON $NINJA failed"
    fi
    MESON_BIN="$VENV/bin/meson"
    NINJA_BIN="$VENV/bin/ninja"
    PATH="$VENV/bin:$PATH"
    export PATH
fi

TARBALL="$WORK/fuse3_${VERSION}.orig.tar.gz"
curl -fsSL -o "$TARBALL" "$URL" || die "download failed: $URL"
echo "$SHA256  $TARBALL" | sha256sum -c --quiet - || die "sha256 mismatch: $URL"
tar -xzf "$TARBALL" -C "$WORK"
SRC="$WORK/fuse-$VERSION"
[ -f "$SRC/example/passthrough_hp.cc" ] || die "no example/passthrough_hp.cc in $URL"

"$MESON_BIN" setup "$WORK/build" "$SRC" \
    --buildtype=release \
    -Ddefault_library=static \
    -Dexamples=true -Dutils=false -Dtests=false -Denable-io-uring=true \
    >"$WORK/setup.log" 2>&1 ||
    { cat "$WORK/setup.log" >&2; die "meson setup failed"; }
# libfuse leaves the ring out quietly when liburing or libnuma is missing or too old.
grep -q "HAVE_URING" "$WORK/build/fuse_config.h" 2>/dev/null ||
    { cat "$WORK/setup.log" >&2; die "libfuse was configured without io_uring (liburing with SQE128 and libnuma needed)"; }
"$NINJA_BIN" -C "$WORK/build" example/passthrough_hp >"$WORK/build.log" 2>&1 ||
    { cat "$WORK/build.log" >&2; die "ninja failed"; }

cp "$WORK/build/example/passthrough_hp" "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "$BUILT" >"$STAMP"
echo "passthrough_hp: built $OUT ($BUILT, libfuse linked statically)"
