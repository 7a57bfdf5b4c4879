#!/usr/bin/env bash
# The project's whole test suite: formatting, lints, every crate's unit/scenario/integration/
# end-to-end tests, and (when a Docker engine is present) the docker-compose node-loss and
# network-partition tests.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== rustfmt"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace
if [ -f deploy/compose-test.sh ] && docker info >/dev/null 2>&1; then
  echo "== docker-compose test"
  BUILD_PROFILE=dev bash deploy/compose-test.sh
  echo "== docker-compose network-partition test"
  BUILD_PROFILE=dev bash deploy/compose-partition-test.sh
else
  echo "== docker-compose test skipped: no Docker engine reachable"
fi
