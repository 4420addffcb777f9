#!/usr/bin/env bash
# Build the AWS cloud-controller-manager keelson-local runs, from its published Go module, once per version.
#
#   tests/kubernetes/build-ccm.sh VERSION        # e.g. 1.34.4; prints the directory holding the binary
#
# The module k8s.io/cloud-provider-aws@vVERSION is fetched through the Go module proxy and built inside a
# copy of its own source tree (its go.mod carries `replace` lines, which `go install pkg@version` refuses),
# with its own go.sum, as its Makefile does: static (CGO_ENABLED=0), version stamped into
# k8s.io/component-base/version.gitVersion and main.gitVersion. Output goes to
# $KEELSON_LOCAL_CACHE/cloud-provider-aws/vVERSION/bin/aws-cloud-controller-manager (default cache
# /var/cache/keelson-local); a finished build leaves a `.complete` marker and `sha256sums`, so a second run
# builds nothing. Nothing prebuilt is downloaded.
set -euo pipefail

version=${1:?usage: build-ccm.sh CLOUD_PROVIDER_AWS_VERSION (e.g. 1.34.4)}
version=${version#v}
if ! [[ $version =~ ^1\.[0-9]+\.[0-9]+$ ]]; then
  echo "build-ccm.sh: '$version' is not a cloud-provider-aws release version (1.MINOR.PATCH)" >&2
  exit 2
fi
command -v go >/dev/null || { echo "build-ccm.sh: Go is not installed (needed to build the CCM from source)" >&2; exit 1; }

cache=${KEELSON_LOCAL_CACHE:-/var/cache/keelson-local}
out="$cache/cloud-provider-aws/v$version"
marker="$out/.complete"
binary=aws-cloud-controller-manager

# shellcheck source=tests/kubernetes/build-cache.sh
. "$(dirname "${BASH_SOURCE[0]}")/build-cache.sh"
enter_build_cache "$out" "$out/bin"

work="$out/src"
rm -rf "${work:?}" "${out:?}/bin.tmp"
mkdir -p "$out/bin.tmp"
start=$(date +%s)
echo "build-ccm.sh: building $binary v$version from the Go module k8s.io/cloud-provider-aws; once per version" >&2

tmpmod=$(mktemp -d)
trap 'rm -rf -- "$tmpmod"' EXIT
# `go mod download` needs a module context only for its cache; the throw-away one is enough.
(cd "$tmpmod" && printf 'module keelson.local/ccm-download\n\ngo 1.24\n' >go.mod &&
  go mod download -json "k8s.io/cloud-provider-aws@v$version") >"$out/download.json" ||
  { echo "build-ccm.sh: the Go module proxy does not serve k8s.io/cloud-provider-aws@v$version" >&2; exit 1; }
dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' "$out/download.json")
[ -f "$dir/go.mod" ] || { echo "build-ccm.sh: go mod download gave no source tree for v$version" >&2; exit 1; }
cp -r "$dir" "$work"
chmod -R u+w "$work"
cd "$work"

export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=mod -buildvcs=false"
# Every published version replaces github.com/google/cel-go with github.com/cel-expr/cel-go (the
# project's new home) at the same version, which the Go module proxy does not serve (403); the code is
# the same module at the same tag, so build against github.com/google/cel-go at the version go.mod
# requires instead.
if grep -q '^replace github.com/google/cel-go => github.com/cel-expr/cel-go' go.mod; then
  go mod edit -dropreplace github.com/google/cel-go
  echo "build-ccm.sh: dropped the replace github.com/google/cel-go => github.com/cel-expr/cel-go (not served by the proxy)" >&2
fi
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$version -X main.gitVersion=v$version"
go build -trimpath -ldflags "$ldflags" -o "$out/bin.tmp/$binary" "./cmd/$binary"
"$out/bin.tmp/$binary" --version >&2 || { echo "build-ccm.sh: $binary --version failed" >&2; exit 1; }

rm -rf "${out:?}/bin" "${work:?}"
mv "$out/bin.tmp" "$out/bin"
(cd "$out/bin" && sha256sum "$binary") >"$out/sha256sums.tmp"
mv "$out/sha256sums.tmp" "$out/sha256sums"
echo "built $binary v$version in $(($(date +%s) - start)) s; binary $(du -sh "$out/bin/$binary" | cut -f1)" >"$out/build-info.tmp"
mv "$out/build-info.tmp" "$out/build-info"
touch "$marker"
cat "$out/build-info" >&2
echo "$out/bin"
