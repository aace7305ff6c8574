#!/usr/bin/env bash
# Runs every test: unit tests, mount tests through the real kernel (both transports), the
# validation gates (POSIX, crash, coherence) against live mounts, and the external pjdfstest
# conformance suite compared with ext4. Needs root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/.."
bash validation/install-deps.sh
cargo build --release
cargo test --release -- --test-threads=2
bash validation/conformance.sh agentfs target/release/agentfs
