#!/usr/bin/env bash
# Build prerequisites that cargo cannot fetch: cmake, a C++ compiler and libclang build HiGHS
# (the 3σSched MILP solver, the `highs` crate) from source. On Debian/Ubuntu as root they are
# installed with apt-get; otherwise this names what to install and fails.
set -euo pipefail
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v g++ >/dev/null 2>&1 || need+=(g++)
# bindgen loads libclang itself (libclang.so / libclang-N.so), not libclang-cpp, which other
# packages install on their own.
if ! compgen -G "/usr/lib/llvm-*/lib/libclang.so*" >/dev/null &&
  ! compgen -G "/usr/lib/*/libclang.so*" >/dev/null &&
  ! compgen -G "/usr/lib/*/libclang-[0-9]*.so*" >/dev/null; then
  need+=(libclang-dev)
fi
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "installing build prerequisites: ${need[*]}" >&2
  apt-get update -q >/dev/null
  apt-get install -y -q "${need[@]}" >/dev/null
else
  echo "missing build prerequisites: ${need[*]} (Debian/Ubuntu: sudo apt-get install ${need[*]})" >&2
  exit 1
fi
