#!/usr/bin/env bash
# Runs every test: unit tests, mount tests through the real kernel, and the validation gates
# (posix_gate.py, crash_gate.py) against live mounts. Needs root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/.."
bash validation/install-deps.sh
cargo build --release
cargo test --release -- --test-threads=2
