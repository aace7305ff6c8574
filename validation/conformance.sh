#!/usr/bin/env bash
# POSIX conformance with pjdfstest (the Rust port, crates.io `pjdfstest`, BSD-2-Clause).
#
#   conformance.sh run DIR                 run the suite in DIR, print a summary
#   conformance.sh compare MOUNT NATIVE    run it in both; exit 1 if a test fails (or is
#                                          skipped) on MOUNT but passes on NATIVE, unless
#                                          it is in EXCLUSIONS below
#   conformance.sh agentfs [AGENTFS_BIN]   mount fresh AgentFS databases (default knobs, then
#                                          with every kernel cache off) and compare each with
#                                          a native directory; always unmounts
#
# Options (before the mode): --erofs also runs the 13 EROFS tests, which remount the file
# system read-only; every target must then be a mount point of its own (in `agentfs` mode a
# loop-mounted ext4 image is made for the native side, which needs losetup and mkfs.ext4).
#
# Environment: PJDFSTEST_ROOT (install dir, default ~/.cache/agentfs/pjdfstest),
# CONFORMANCE_OUT (logs, default a temp dir that is kept), CONFORMANCE_TIMEOUT (seconds per
# pjdfstest run, default 900). Needs root (the suite switches to dummy users; this script
# creates the system user `pjdtests` when it is missing) and, for `agentfs`, /dev/fuse.
# Uses only bash, coreutils, awk, util-linux, and cargo for the one-time install.
set -euo pipefail
export LC_ALL=C

PJD_VERSION=0.2.2
PJD_ROOT=${PJDFSTEST_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/agentfs/pjdfstest}
PJD=$PJD_ROOT/bin/pjdfstest
TIMEOUT=${CONFORMANCE_TIMEOUT:-900}
EROFS=0
HERE=$(cd "$(dirname "$0")" && pwd)

# Tests allowed to fail or be skipped on an AgentFS mount while they pass natively. Only
# behaviour that is inherent to FUSE (or to glibc's view of FUSE) belongs here, each with
# its evidence. Format: "test_name  reason".
EXCLUSIONS=(
  # pathconf(_PC_LINK_MAX) is computed by glibc, not the kernel: __statfs_link_max() in
  # sysdeps/unix/sysv/linux/pathconf.c switches on statfs.f_type and returns LINUX_LINK_MAX
  # (127) for any type it does not know, FUSE_SUPER_MAGIC 0x65735546 included; FUSE's
  # STATFS reply (struct fuse_kstatfs) has no field to report a link limit. pjdfstest's
  # guard has_reasonable_link_max() skips the test when LINK_MAX is 127. tmpfs gets the
  # same 127 and, like AgentFS, has no link limit at all (201 links to one file work on
  # both); see kernel-notes/posix-conformance.md.
  "link::link_count_max  glibc reports LINK_MAX=127 for every FUSE fs; the test skips itself"
)

die() { echo "conformance: $*" >&2; exit 2; }
log() { echo "conformance: $*" >&2; }

install_pjdfstest() {
  if [[ -x $PJD ]] && "$PJD" --version 2>/dev/null | grep -qF "$PJD_VERSION"; then return; fi
  command -v cargo >/dev/null || die "cargo not found (needed once to install pjdfstest)"
  log "installing pjdfstest $PJD_VERSION into $PJD_ROOT"
  cargo install pjdfstest --version "$PJD_VERSION" --locked --root "$PJD_ROOT" >&2 ||
    cargo install pjdfstest --version "$PJD_VERSION" --root "$PJD_ROOT" >&2 ||
    die "cargo install pjdfstest failed"
}

ensure_users() {
  [[ $(id -u) == 0 ]] || die "run as root: half the suite switches users or needs root"
  getent passwd nobody >/dev/null || die "no user 'nobody'"
  if ! getent passwd pjdtests >/dev/null; then
    log "creating system user pjdtests (dummy user for pjdfstest)"
    useradd --system --user-group --no-create-home --shell /usr/sbin/nologin pjdtests
  fi
}

# A writable directory on a file system other than that of $1, for the EXDEV tests; prints
# nothing if there is none (those tests then skip on that side and are reported).
secondary_dir() {
  local dev cand
  dev=$(stat -c %d "$1")
  for cand in /dev/shm /tmp /var/tmp "$HOME"; do
    [[ -d $cand && -w $cand ]] || continue
    [[ $(stat -c %d "$cand") != "$dev" ]] || continue
    mktemp -d "$cand/pjd-secondary.XXXXXX" && return
  done
}

# write_config FILE SECONDARY ALLOW_REMOUNT
# Features are those ext4 on Linux supports (pjdfstest's own ci/linux-ext4.toml plus
# rename_ctime, which ext4 implements); chflags, nfsv4_acls, stat_st_birthtime and
# chflags_sf_snapshot are BSD-only.
write_config() {
  {
    echo "[features]"
    echo "posix_fallocate = {}"
    echo "utime_now = {}"
    echo "utimensat = {}"
    echo "rename_ctime = {}"
    [[ -n $2 ]] && echo "secondary_fs = \"$2\""
    echo
    echo "[settings]"
    echo "naptime = 0.01"
    echo "allow_remount = $3"
    echo
    echo "[dummy_auth]"
    echo "entries = [[\"nobody\", \"$(id -gn nobody)\"], [\"pjdtests\", \"pjdtests\"]]"
  } >"$1"
}

# run_suite DIR OUTPREFIX: leaves OUTPREFIX.log (raw) and OUTPREFIX.res ("name status").
run_suite() {
  local dir=$1 out=$2 sec cfg rc=0 wrap
  [[ -d $dir ]] || die "$dir is not a directory"
  # Socket tests bind(2) a unix socket at DIR/.tmpXXXXXX/.tmpXXXXXX/<32 random chars>
  # (DIR + 55 bytes, some tests deeper) and sun_path holds 107 bytes plus NUL: with DIR
  # around 50 characters, dozens of tests fail with ENAMETOOLONG on any file system.
  # The dummy users must also be able to reach DIR.
  (( ${#dir} <= 40 )) || die "$dir: path longer than 40 characters (unix socket tests would fail)"
  [[ $(stat -c %a "$dir") == 7[0-7][5-7] ]] || log "warning: $dir is not searchable by others; user-switching tests will fail"
  sec=$(secondary_dir "$dir")
  cfg=$out.toml
  write_config "$cfg" "$sec" false
  log "pjdfstest in $dir (secondary fs: ${sec:-none}), log $out.log"
  local t0=$SECONDS
  (cd / && NO_COLOR=1 timeout -k 10 "$TIMEOUT" "$PJD" -c "$cfg" -p "$dir") >"$out.log" 2>&1 || rc=$?
  if [[ $EROFS == 1 ]]; then
    # Separate invocation: in a full run, files that earlier tests leave open for writing make
    # `mount -o remount,ro` fail with EBUSY. The mount wrapper adds -i so mount(8) does not
    # hand a fuse.* remount to /sbin/mount.fuse (which would try to run the server again).
    mountpoint -q "$dir" || die "--erofs: $dir is not a mount point"
    wrap=$(mktemp -d)
    printf '#!/bin/sh\nexec "%s" -i "$@"\n' "$(command -v mount)" >"$wrap/mount"
    chmod +x "$wrap/mount"
    write_config "$out.erofs.toml" "$sec" true
    (cd / && PATH=$wrap:$PATH NO_COLOR=1 timeout -k 10 "$TIMEOUT" "$PJD" -c "$out.erofs.toml" \
      -p "$dir" erofs) >"$out.erofs.log" 2>&1 || true
    rm -rf "$wrap"
  fi
  [[ -n $sec ]] && rm -rf "$sec"
  [[ $rc == 124 || $rc == 137 ]] && log "pjdfstest timed out after ${TIMEOUT}s in $dir"
  grep -q '^Summary:' "$out.log" || { log "pjdfstest did not finish (rc=$rc); tail of log:"; tail -20 "$out.log" >&2; return 1; }
  # Result lines are "name<spaces>status"; messages and skip reasons are tab-indented.
  parse "$out.log" >"$out.res"
  if [[ $EROFS == 1 ]]; then
    # The first run lists the erofs tests as skipped; take their results from the second.
    parse "$out.erofs.log" >"$out.erofs.res"
    awk 'NR==FNR {r[$1]=$2; next} ($1 in r) {$2=r[$1]} 1' "$out.erofs.res" "$out.res" >"$out.res.tmp"
    mv "$out.res.tmp" "$out.res"
  fi
  log "$dir: $(summary "$out.res") ($((SECONDS - t0)) s)"
}

parse() {
  awk '/^[^ \t]+ +(ok|FAILED|skipped|failed as expected|PASSED UNEXPECTEDLY)$/ {
         s = $NF; if ($0 ~ /failed as expected$/) s = "xfail"; else if ($0 ~ /PASSED UNEXPECTEDLY$/) s = "xpass";
         print $1, s }' "$1" | sort
}

summary() {
  awk '{n[$2]++} END {printf "%d passed, %d failed, %d skipped", n["ok"], n["FAILED"]+n["xpass"], n["skipped"]}' "$1"
}

# Print each failed test with the first line of its panic message.
show_failures() {
  awk '/^[^ \t]+ +FAILED$/ {name=$1; getline; sub(/^\t/, ""); print "  FAIL " name ": " $0}' "$1"
}

is_excluded() {
  local e
  for e in "${EXCLUSIONS[@]}"; do [[ ${e%% *} == "$1" ]] && return 0; done
  return 1
}

# Totals over every mount compared, for the closing line: passed = ok on the mount,
# failed = regressions (plus mounts whose run did not complete), skipped = the rest.
TOT_PASS=0 TOT_FAIL=0 TOT_OTHER=0

# compare_results MOUNTPREFIX NATIVEPREFIX: 0 when nothing regresses on the mount.
compare_results() {
  local m=$1 n=$2 bad=0 name ms ns
  while read -r name ms ns; do
    if [[ $ns == ok && $ms != ok ]]; then
      if is_excluded "$name"; then
        echo "  excluded $name: $ms on mount, ok natively"
      else
        echo "  REGRESSION $name: $ms on mount, ok natively"
        bad=1
        TOT_FAIL=$((TOT_FAIL + 1))
        continue
      fi
    elif [[ $ms == ok && $ns != ok ]]; then
      echo "  note $name: ok on mount, $ns natively"
    elif [[ $ms == none || $ns == none ]]; then
      echo "  note $name: only in one run (mount=$ms native=$ns)"
    fi
    if [[ $ms == ok ]]; then TOT_PASS=$((TOT_PASS + 1)); else TOT_OTHER=$((TOT_OTHER + 1)); fi
  done < <(join -a1 -a2 -e none -o 0,1.2,2.2 "$m.res" "$n.res")
  return $bad
}

compare() {
  local mnt=$1 nat=$2 out=$3 rc=0
  run_suite "$nat" "$out/native" || return 1
  run_suite "$mnt" "$out/mount" || { show_failures "$out/mount.log"; TOT_FAIL=$((TOT_FAIL + 1)); return 1; }
  echo "native ($nat): $(summary "$out/native.res")"
  echo "mount  ($mnt): $(summary "$out/mount.res")"
  show_failures "$out/mount.log"
  compare_results "$out/mount" "$out/native" || rc=1
  return $rc
}

# ---- agentfs mode ---------------------------------------------------------------------------
WORK=""
MOUNTS=()
LOOPMNT=""
cleanup() {
  local m
  for m in "${MOUNTS[@]}"; do
    if grep -qs " $m fuse" /proc/mounts; then
      timeout 60 "$AGENTFS" umount "$m" >/dev/null 2>&1 ||
        timeout 60 "$AGENTFS" umount --force "$m" >/dev/null 2>&1 || umount -l "$m" || true
    fi
  done
  if [[ -n $LOOPMNT ]] && mountpoint -q "$LOOPMNT"; then umount "$LOOPMNT" || umount -l "$LOOPMNT" || true; fi
  [[ -n $WORK ]] && rm -rf "$WORK"
}

agentfs_mode() {
  AGENTFS=$(realpath "${1:-$HERE/../target/release/agentfs}")
  [[ -x $AGENTFS ]] || die "no agentfs binary at $AGENTFS (cargo build --release first)"
  [[ -e /dev/fuse ]] || die "/dev/fuse missing"
  local out rc=0 profile nat
  out=${CONFORMANCE_OUT:-$(mktemp -d /tmp/agentfs-conformance.XXXXXX)}
  mkdir -p "$out"
  # Short paths (see run_suite) and mode 755: mktemp makes 0700, which the dummy users
  # could not traverse.
  WORK=$(mktemp -d /tmp/afc.XXXXXX)
  chmod 755 "$WORK"
  trap cleanup EXIT
  trap 'exit 130' INT TERM

  nat=$WORK/n
  mkdir -p "$nat"
  if [[ $EROFS == 1 ]]; then
    truncate -s 512M "$WORK/ext4.img" && mkfs.ext4 -q -F "$WORK/ext4.img" ||
      die "--erofs: cannot make an ext4 image"
    LOOPMNT=$nat
    mount -o loop "$WORK/ext4.img" "$nat" || die "--erofs: cannot loop-mount the ext4 image"
  fi
  run_suite "$nat" "$out/native" || return 1
  echo "native ($(stat -f -c %T "$nat") at $nat): $(summary "$out/native.res")"

  # default: the knobs as shipped; uncached: every kernel-side cache off, so each stat and
  # write reaches the server and the kernel cannot hide a wrong reply.
  for profile in default uncached; do
    local mnt=$WORK/m-${profile:0:1}
    mkdir -p "$mnt"
    MOUNTS+=("$mnt")
    local knobs=()
    [[ $profile == uncached ]] && knobs=(AGENTFS_FUSE_WRITEBACK_CACHE=0 AGENTFS_FUSE_ATTR_TTL_MS=0
      AGENTFS_FUSE_ENTRY_TTL_MS=0 AGENTFS_FUSE_READDIRPLUS=0)
    if ! env "${knobs[@]}" timeout 60 "$AGENTFS" mount "$WORK/$profile.db" "$mnt"; then
      echo "agentfs [$profile]: mount failed"
      TOT_FAIL=$((TOT_FAIL + 1))
      rc=1
      continue
    fi
    if run_suite "$mnt" "$out/agentfs-$profile"; then
      echo "agentfs [$profile]: $(summary "$out/agentfs-$profile.res")"
      show_failures "$out/agentfs-$profile.log"
      compare_results "$out/agentfs-$profile" "$out/native" || rc=1
    else
      echo "agentfs [$profile]: pjdfstest did not complete"
      TOT_FAIL=$((TOT_FAIL + 1))
      rc=1
    fi
    timeout 60 "$AGENTFS" umount "$mnt" || { log "umount of $mnt failed"; rc=1; }
  done
  echo "logs in $out"
  return $rc
}

# ---- main -----------------------------------------------------------------------------------
while [[ ${1:-} == --* ]]; do
  case $1 in
    --erofs) EROFS=1 ;;
    --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) die "unknown option $1" ;;
  esac
  shift
done

mode=${1:-}
[[ -n $mode ]] || { sed -n '2,20p' "$0"; exit 2; }
shift
[[ $mode == run || $mode == compare || $mode == agentfs ]] || die "unknown mode $mode (run, compare, agentfs)"
install_pjdfstest
ensure_users

case $mode in
  run)
    [[ $# == 1 ]] || die "usage: conformance.sh run DIR"
    out=${CONFORMANCE_OUT:-$(mktemp -d /tmp/conformance.XXXXXX)}
    mkdir -p "$out"
    run_suite "$(realpath "$1")" "$out/run" || exit 1
    show_failures "$out/run.log"
    echo "log: $out/run.log"
    echo "pjdfstest: $(summary "$out/run.res")"
    ! grep -qE ' (FAILED|xpass)$' "$out/run.res"
    ;;
  compare)
    [[ $# == 2 ]] || die "usage: conformance.sh compare MOUNT NATIVE"
    out=${CONFORMANCE_OUT:-$(mktemp -d /tmp/conformance.XXXXXX)}
    mkdir -p "$out"
    if compare "$(realpath "$1")" "$(realpath "$2")" "$out"; then
      echo "conformance: OK (no test fails on the mount that passes natively); logs in $out"
      echo "conformance: $TOT_PASS passed, $TOT_FAIL failed, $TOT_OTHER skipped"
    else
      echo "conformance: FAILED; logs in $out"
      echo "conformance: $TOT_PASS passed, $TOT_FAIL failed, $TOT_OTHER skipped"
      exit 1
    fi
    ;;
  agentfs)
    if agentfs_mode "${1:-}"; then
      echo "conformance: OK (no test fails on AgentFS that passes natively)"
      echo "conformance: $TOT_PASS passed, $TOT_FAIL failed, $TOT_OTHER skipped"
    else
      echo "conformance: FAILED"
      echo "conformance: $TOT_PASS passed, $TOT_FAIL failed, $TOT_OTHER skipped"
      exit 1
    fi
    ;;
  *) die "unknown mode $mode (run, compare, agentfs)" ;;
esac
