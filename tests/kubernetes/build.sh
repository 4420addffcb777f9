#!/usr/bin/env bash
# Build the Kubernetes binaries keelson-local runs, from the published Go module, once per version.
#
#   tests/kubernetes/build.sh VERSION            # e.g. 1.34.4; prints the directory holding the binaries
#
# A throw-away module requires k8s.io/kubernetes@vVERSION; the staging modules it names as
# `./staging/src/k8s.io/X` are replaced by their published k8s.io/X@v0.MINOR.PATCH. Binaries are static
# (CGO_ENABLED=0) and carry the version in their `--version`, as release builds do. Output goes to
# $KEELSON_LOCAL_CACHE/kubernetes/vVERSION/bin (default cache /var/cache/keelson-local); a finished build
# leaves a `.complete` marker with the sha256 of every binary, so a second run builds nothing.
# Nothing prebuilt is downloaded: only Go modules, through the Go module proxy.
set -euo pipefail

version=${1:?usage: build.sh KUBERNETES_VERSION (e.g. 1.34.4)}
version=${version#v}
if ! [[ $version =~ ^1\.([0-9]+)\.([0-9]+)$ ]]; then
  echo "build.sh: '$version' is not a Kubernetes release version (1.MINOR.PATCH)" >&2
  exit 2
fi
minor=${BASH_REMATCH[1]}
patch=${BASH_REMATCH[2]}
staging_version="v0.${minor}.${patch}"

command -v go >/dev/null || { echo "build.sh: Go is not installed (needed to build Kubernetes from source)" >&2; exit 1; }

cache=${KEELSON_LOCAL_CACHE:-/var/cache/keelson-local}
out="$cache/kubernetes/v$version"
marker="$out/.complete"
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl)

# shellcheck source=tests/kubernetes/build-cache.sh
. "$(dirname "${BASH_SOURCE[0]}")/build-cache.sh"
enter_build_cache "$out" "$out/bin"

work="$out/module"
rm -rf "${work:?}" "${out:?}/bin.tmp"
mkdir -p "$work" "$out/bin.tmp"
cd "$work"

export GOFLAGS="${GOFLAGS:-} -mod=mod"
export CGO_ENABLED=0
start=$(date +%s)
echo "build.sh: building Kubernetes v$version (${COMPONENTS[*]}) from the Go module; once per version" >&2

cat > go.mod <<MOD
module keelson.local/kubernetes-build

go 1.24
MOD
# The kubernetes module's own go.mod lists the staging modules it replaces with local paths.
go mod download -json "k8s.io/kubernetes@v$version" > download.json
gomod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' download.json)
[ -f "$gomod" ] || { echo "build.sh: go mod download gave no go.mod for k8s.io/kubernetes@v$version" >&2; exit 1; }
staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/k8s\.io/.*#\1#p' "$gomod")
[ -n "$staging" ] || { echo "build.sh: no staging replace lines in $gomod" >&2; exit 1; }
{
  echo "require k8s.io/kubernetes v$version"
  for m in $staging; do echo "replace $m => $m $staging_version"; done
} >> go.mod
# A package importing each component pins its dependencies in go.sum.
{
  echo "package tools"
  echo "import ("
  for c in "${COMPONENTS[@]}"; do echo "  _ \"k8s.io/kubernetes/cmd/$c/app\""; done
  echo ")"
} > tools.go
go mod tidy -e >/dev/null 2>tidy.log || { cat tidy.log >&2; exit 1; }

pkg=k8s.io/component-base/version
commit=$(sed -n 's/^[[:space:]]*"Hash": "\(.*\)",\{0,1\}$/\1/p' download.json | head -n1)
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=v$version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z -X $p.gitCommit=${commit:-unknown}"
done
: "$pkg"
targets=()
for c in "${COMPONENTS[@]}"; do targets+=("k8s.io/kubernetes/cmd/$c"); done
go build -trimpath -ldflags "$ldflags" -o "$out/bin.tmp/" "${targets[@]}"

for c in "${COMPONENTS[@]}"; do
  "$out/bin.tmp/$c" --version >/dev/null 2>&1 || [ "$c" = kubectl ] || { echo "build.sh: $c --version failed" >&2; exit 1; }
done
rm -rf "${out:?}/bin"
mv "$out/bin.tmp" "$out/bin"
(cd "$out/bin" && sha256sum "${COMPONENTS[@]}") > "$out/sha256sums.tmp"
mv "$out/sha256sums.tmp" "$out/sha256sums"
end=$(date +%s)
echo "built v$version in $((end - start)) s; binaries $(du -sh "$out/bin" | cut -f1)" > "$out/build-info.tmp"
mv "$out/build-info.tmp" "$out/build-info"
touch "$marker"
cat "$out/build-info" >&2
echo "$out/bin"
