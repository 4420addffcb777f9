#!/usr/bin/env bash
# Build runc from its published Go module, once per version: a static binary of this host's
# architecture (cgo for runc's nsexec, glibc and libseccomp linked in, with the seccomp build tag as
# runc's releases are: every pod sandbox asks for the RuntimeDefault seccomp profile, which a runc
# without it refuses). keelson-local's machines of another architecture run it natively: qemu-user cannot
# emulate runc's clone of a process into new namespaces (EINVAL), so an arm64 machine's runc is
# this one, and it starts the containers' arm64 processes through binfmt_misc.
#
#   tests/kubernetes/build-runc.sh VERSION     # e.g. 1.4.3; prints the path of the runc binary
#
# Output: $KEELSON_LOCAL_CACHE/runc/vVERSION/runc (default cache /var/cache/keelson-local), with a
# `.complete` marker: a second run builds nothing. Needs go, a C compiler (gcc) with static glibc, and
# libseccomp's static library (Debian's libseccomp-dev; scripts/build-arm64 installs it).
set -euo pipefail

version=${1:?usage: build-runc.sh RUNC_VERSION (e.g. 1.4.3)}
version=${version#v}
if ! [[ $version =~ ^1\.[0-9]+\.[0-9]+$ ]]; then
  echo "build-runc.sh: '$version' is not a runc 1.x release version" >&2
  exit 2
fi
command -v go >/dev/null || { echo "build-runc.sh: Go is not installed" >&2; exit 1; }
command -v gcc >/dev/null || { echo "build-runc.sh: gcc is not installed (runc's nsexec is C)" >&2; exit 1; }
pkg-config --exists libseccomp 2>/dev/null || { echo "build-runc.sh: libseccomp's development files are missing: apt-get install libseccomp-dev (scripts/build-arm64 does)" >&2; exit 1; }

cache=${KEELSON_LOCAL_CACHE:-/var/cache/keelson-local}
out="$cache/runc/v$version-seccomp"
# shellcheck source=tests/kubernetes/build-cache.sh
. "$(dirname "${BASH_SOURCE[0]}")/build-cache.sh"
enter_build_cache "$out" "$out/runc"

work="$out/module"
rm -rf "${work:?}" "${out:?}/runc.tmp"
mkdir -p "$work"
cd "$work"
start=$(date +%s)
echo "build-runc.sh: building runc v$version from the Go module (once per version)" >&2
printf 'module keelson.local/runc-build\n\ngo 1.24\n' >go.mod
GOFLAGS=-mod=mod go get "github.com/opencontainers/runc@v$version" 2>get.log || { cat get.log >&2; exit 1; }
env -u GOARCH CGO_ENABLED=1 GOFLAGS="-mod=mod -buildvcs=false" go build -trimpath -tags "seccomp netgo osusergo" \
  -ldflags "-s -w -X main.version=$version -extldflags -static" -o "$out/runc.tmp" github.com/opencontainers/runc
"$out/runc.tmp" --version | grep -q "runc version $version" || { echo "build-runc.sh: the build does not say it is runc $version" >&2; exit 1; }
"$out/runc.tmp" --version | grep -q "^libseccomp: " || { echo "build-runc.sh: the build has no seccomp support" >&2; exit 1; }
mv "$out/runc.tmp" "$out/runc"
echo "built runc v$version in $(($(date +%s) - start)) s" >"$out/build-info"
touch "$out/.complete"
echo "$out/runc"
