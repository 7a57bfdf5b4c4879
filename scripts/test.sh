#!/usr/bin/env bash
# The project's whole test suite: formatting, lints, every crate's unit/scenario/integration/
# end-to-end tests, the Python client's tests against a local cluster (clients/python), and
# (when a Docker engine is present) the docker-compose node-loss and network-partition tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# cmake, g++ and libclang for HiGHS (installed with apt-get when run as root).
bash scripts/prerequisites.sh
echo "== rustfmt"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace
echo "== python client tests (clients/python, against a real testbed local cluster)"
# The tests start `target/debug/testbed local`, which runs the coordinator and worker binaries
# beside it: make sure all three are built. `cargo test --workspace --no-run` is a no-op after the
# tests above built them; `cargo build -p testbed -p coordinator -p worker` would not be: that
# package selection unifies the build scripts' dependencies (syn, regex-syntax) with other
# features, which gives highs-sys another hash and rebuilds HiGHS from source for minutes.
cargo test -q --workspace --no-run
# A Python with msgpack and pytest: $PYTHON if set, else the first python3 that has both (the
# system one gets them from Debian's python3-msgpack and python3-pytest, see .ci/run).
py=""
for cand in ${PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import msgpack, pytest' 2>/dev/null; then
    py=$cand
    break
  fi
done
if [ -z "$py" ]; then
  echo "no python3 with msgpack and pytest: apt-get install python3-msgpack python3-pytest" \
    "(or pip install msgpack pytest), or set PYTHON" >&2
  exit 1
fi
(cd clients/python && "$py" -m pytest -q -p no:cacheprovider tests)
if [ -f deploy/compose-test.sh ] && docker info >/dev/null 2>&1; then
  echo "== docker-compose test"
  BUILD_PROFILE=dev bash deploy/compose-test.sh
  echo "== docker-compose network-partition test"
  BUILD_PROFILE=dev bash deploy/compose-partition-test.sh
else
  echo "== docker-compose test skipped: no Docker engine reachable"
fi
