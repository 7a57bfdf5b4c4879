#!/usr/bin/env bash
# Build the `hybrid-scheduler:local` Docker image (or $IMAGE) FROM scratch: the release binaries, the shared
# libraries they link (read off `ldd`), a static busybox (a shell for launch specs and health
# checks) and tini as PID 1 (reaps orphaned container processes). No image is pulled: this machine
# kind has no registry.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v busybox >/dev/null 2>&1 || ! [ -x /usr/bin/tini-static ]; then
  echo "build-image: installing busybox-static and tini (Debian packages)" >&2
  apt-get install -y -q busybox-static tini >/dev/null
fi

# BUILD_PROFILE=dev reuses the binaries `cargo test --workspace` already built (CI); release by
# default. The same package selection as that run (not `-p coordinator -p worker -p testbed`, whose
# feature unification gives highs-sys another hash and rebuilds HiGHS) keeps it a no-op.
profile="${BUILD_PROFILE:-release}"
if [ "$profile" = dev ]; then
  cargo test -q --workspace --no-run
  bindir=target/debug
else
  cargo build --release -p coordinator -p worker -p testbed
  bindir=target/release
fi

ctx=target/docker-context
rm -rf "$ctx"
mkdir -p "$ctx/rootfs/usr/local/bin" "$ctx/rootfs/bin" "$ctx/rootfs/tmp" "$ctx/rootfs/data" "$ctx/rootfs/etc"
for bin in coordinator worker testbed; do
  cp "$bindir/$bin" "$ctx/rootfs/usr/local/bin/$bin"
done
# Every shared library the binaries need, at the same path as on the build machine.
for bin in coordinator worker testbed; do
  ldd "$bindir/$bin" | awk '/=>/ { print $3 } $1 ~ /^\// { print $1 }'
done | sort -u | while read -r lib; do
  [ -n "$lib" ] && cp --parents -L "$lib" "$ctx/rootfs/"
done
cp "$(command -v busybox)" "$ctx/rootfs/bin/busybox"
for tool in sh ls cat sleep kill ps grep test true false mkdir rm echo env cp mv chmod id; do
  ln -sf busybox "$ctx/rootfs/bin/$tool"
done
cp /usr/bin/tini-static "$ctx/rootfs/bin/tini"
# `nobody` is the user workers run containers as (worker --container-user, default nobody).
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$ctx/rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$ctx/rootfs/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$ctx/rootfs/etc/nsswitch.conf"
chmod 1777 "$ctx/rootfs/tmp"

cat > "$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY rootfs/ /
ENV PATH=/usr/local/bin:/bin RUST_LOG=info
ENTRYPOINT ["/bin/tini", "--"]
DOCKERFILE

image="${IMAGE:-hybrid-scheduler:local}"
docker build -q -t "$image" "$ctx"
echo "built $image" >&2
