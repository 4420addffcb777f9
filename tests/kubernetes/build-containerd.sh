#!/usr/bin/env bash
# Build containerd (containerd, containerd-shim-runc-v2, ctr) from its published Go module, once per
# version, and pack it as the upstream release archive is laid out (bin/…), for keelson-local's mirror.
#
#   tests/kubernetes/build-containerd.sh VERSION     # e.g. 2.3.4; prints the path of the .tar.gz
#   GOARCH=arm64 tests/kubernetes/build-containerd.sh VERSION   # for another architecture (cross-compiled)
#
# Output: $KEELSON_LOCAL_CACHE/containerd/vVERSION[-linux-ARCH]/containerd-VERSION-linux-ARCH.tar.gz (default cache
# /var/cache/keelson-local), with a `.complete` marker: a second run builds nothing. Static binaries
# (CGO_ENABLED=0, without the btrfs/devmapper/zfs snapshotters, which need C libraries).
set -euo pipefail

version=${1:?usage: build-containerd.sh CONTAINERD_VERSION (e.g. 2.3.4)}
version=${version#v}
if ! [[ $version =~ ^2\.[0-9]+\.[0-9]+$ ]]; then
  echo "build-containerd.sh: '$version' is not a containerd 2.x release version" >&2
  exit 2
fi
command -v go >/dev/null || { echo "build-containerd.sh: Go is not installed" >&2; exit 1; }

cache=${KEELSON_LOCAL_CACHE:-/var/cache/keelson-local}
arch=$(go env GOARCH)
out="$cache/containerd/v$version"
[ "$arch" = "$(env -u GOARCH go env GOARCH)" ] || out="$out-linux-$arch"
archive="$out/containerd-$version-linux-$arch.tar.gz"
# shellcheck source=tests/kubernetes/build-cache.sh
. "$(dirname "${BASH_SOURCE[0]}")/build-cache.sh"
enter_build_cache "$out" "$archive"

work="$out/module"
rm -rf "${work:?}" "${out:?}/bin"
mkdir -p "$work" "$out/bin"
cd "$work"
export GOFLAGS="${GOFLAGS:-} -mod=mod" CGO_ENABLED=0
start=$(date +%s)
echo "build-containerd.sh: building containerd v$version from the Go module (once per version)" >&2
printf 'module keelson.local/containerd-build\n\ngo 1.24\n\nrequire github.com/containerd/containerd/v2 v%s\n' "$version" > go.mod
m=github.com/containerd/containerd/v2
printf 'package tools\n\nimport (\n\t_ "%s/cmd/containerd/builtins"\n\t_ "%s/cmd/ctr/app"\n)\n' "$m" "$m" > tools.go
go mod tidy -e >/dev/null 2>tidy.log || { cat tidy.log >&2; exit 1; }
ldflags="-s -w -X $m/version.Version=v$version -X $m/version.Revision=keelson-local -X $m/version.Package=$m"
go build -trimpath -tags "no_btrfs no_devmapper no_zfs no_aufs" -ldflags "$ldflags" -o "$out/bin/" \
  "$m/cmd/containerd" "$m/cmd/containerd-shim-runc-v2" "$m/cmd/ctr"
"$out/bin/containerd" --version >&2
# Deterministic archive: fixed owner, mode and time.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$out" -cf - bin | gzip -n > "$archive.tmp"
mv "$archive.tmp" "$archive"
echo "built containerd v$version in $(( $(date +%s) - start )) s" > "$out/build-info"
touch "$out/.complete"
echo "$archive"
