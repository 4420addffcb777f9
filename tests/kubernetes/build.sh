#!/usr/bin/env bash
# Build the Kubernetes binaries keelson-local runs, from the published Go module, once per version.
#
#   tests/kubernetes/build.sh VERSION            # e.g. 1.34.4; prints the directory holding the binaries
#   GOARCH=arm64 tests/kubernetes/build.sh VERSION   # a worker's binaries for another architecture
#
# A throw-away module requires k8s.io/kubernetes@vVERSION; the staging modules it names as
# `./staging/src/k8s.io/X` are replaced by their published k8s.io/X@v0.MINOR.PATCH. Binaries are static
# (CGO_ENABLED=0) and carry the version in their `--version`, as release builds do. Output goes to
# $KEELSON_LOCAL_CACHE/kubernetes/vVERSION/bin (default cache /var/cache/keelson-local); a finished build
# leaves a `.complete` marker with the sha256 of every binary, so a second run builds nothing.
# Nothing prebuilt is downloaded: only Go modules, through the Go module proxy.
set -euo pipefail

# shellcheck source=tests/kubernetes/k8s-module.sh
. "$(dirname "${BASH_SOURCE[0]}")/k8s-module.sh"
k8s_parse_version build.sh "${1:?usage: build.sh KUBERNETES_VERSION (e.g. 1.34.4)}"
version=$k8s_version

command -v go >/dev/null || { echo "build.sh: Go is not installed (needed to build Kubernetes from source)" >&2; exit 1; }

cache=${KEELSON_LOCAL_CACHE:-/var/cache/keelson-local}
# The host's architecture builds every component; another one ($GOARCH, cross-compiled) only what a
# worker of that architecture runs (its kubelet and kubectl assets, kube-proxy's image), checked under
# qemu-user (binfmt_misc) and cached beside the host's entry.
arch=$(go env GOARCH)
host_arch=$(env -u GOARCH go env GOARCH)
if [ "$arch" = "$host_arch" ]; then
  out="$cache/kubernetes/v$version"
  COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl)
else
  out="$cache/kubernetes/v$version-linux-$arch"
  COMPONENTS=(kube-proxy kubelet kubectl)
fi
marker="$out/.complete"

# shellcheck source=tests/kubernetes/build-cache.sh
. "$(dirname "${BASH_SOURCE[0]}")/build-cache.sh"
enter_build_cache "$out" "$out/bin"

work="$out/module"
rm -rf "${work:?}" "${out:?}/bin.tmp"
mkdir -p "$work" "$out/bin.tmp"
cd "$work"

start=$(date +%s)
echo "build.sh: building Kubernetes v$version (${COMPONENTS[*]}) from the Go module; once per version" >&2

components=()
for c in "${COMPONENTS[@]}"; do components+=("k8s.io/kubernetes/cmd/$c/app"); done
k8s_module_init build.sh "${components[@]}"
ldflags=$(k8s_ldflags)
targets=()
for c in "${COMPONENTS[@]}"; do targets+=("k8s.io/kubernetes/cmd/$c"); done
go build -trimpath -ldflags "$ldflags" -o "$out/bin.tmp/" "${targets[@]}"

for c in "${COMPONENTS[@]}"; do
  "$out/bin.tmp/$c" --version >/dev/null 2>&1 || [ "$c" = kubectl ] ||
    { echo "build.sh: $c --version failed (a $arch build runs on this $host_arch host only through qemu-user-static's binfmt_misc entry)" >&2; exit 1; }
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
