#!/usr/bin/env bash
# Build the upstream end-to-end suite of a Kubernetes version (e2e.test), the ginkgo CLI that runs it in
# parallel, and agnhost (the suite's test server), from the published Go modules, once per version.
#
#   tests/kubernetes/build-e2e.sh VERSION       # e.g. 1.34.4; prints the directory holding them
#
# The module is build.sh's (tests/kubernetes/k8s-module.sh): k8s.io/kubernetes@vVERSION with its staging
# modules replaced by their published versions. `go test -c k8s.io/kubernetes/test/e2e` gives e2e.test
# (static, the version stamped as build.sh does); ginkgo is github.com/onsi/ginkgo/v2/ginkgo at the
# version k8s.io/kubernetes's go.mod pins (the suite refuses a CLI of another version); agnhost is
# k8s.io/kubernetes/test/images/agnhost. The directory also holds conformance.yaml, the module's list of
# [Conformance] tests (test/conformance/testdata/conformance.yaml).
# Output: $KEELSON_LOCAL_CACHE/kubernetes/vVERSION/e2e/bin (default cache /var/cache/keelson-local, the
# same entry build.sh uses); a finished build leaves e2e/.complete, so a second run builds nothing.
set -euo pipefail

# shellcheck source=tests/kubernetes/k8s-module.sh
. "$(dirname "${BASH_SOURCE[0]}")/k8s-module.sh"
k8s_parse_version build-e2e.sh "${1:?usage: build-e2e.sh KUBERNETES_VERSION (e.g. 1.34.4)}"
version=$k8s_version

command -v go >/dev/null || { echo "build-e2e.sh: Go is not installed (needed to build the e2e suite from source)" >&2; exit 1; }

cache=${KEELSON_LOCAL_CACHE:-/var/cache/keelson-local}
out="$cache/kubernetes/v$version/e2e"

# shellcheck source=tests/kubernetes/build-cache.sh
. "$(dirname "${BASH_SOURCE[0]}")/build-cache.sh"
enter_build_cache "$out" "$out/bin"

work="$out/module"
rm -rf "${work:?}" "${out:?}/bin.tmp"
mkdir -p "$work" "$out/bin.tmp"
cd "$work"

start=$(date +%s)
echo "build-e2e.sh: building the e2e suite of Kubernetes v$version (e2e.test, ginkgo, agnhost) from the Go module; once per version" >&2

# tools.go imports what e2e_test.go imports, so tidy pins the suite's dependencies.
e2e_dir=$(go mod download -json "k8s.io/kubernetes@v$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
[ -f "$e2e_dir/test/e2e/e2e_test.go" ] || { echo "build-e2e.sh: k8s.io/kubernetes@v$version has no test/e2e/e2e_test.go" >&2; exit 1; }
mapfile -t imports < <(sed -n '/^import (/,/^)/p' "$e2e_dir/test/e2e/e2e_test.go" | grep -o '"[a-z0-9-]*\.[^"]*"' | tr -d '"' | sort -u)
k8s_module_init build-e2e.sh k8s.io/kubernetes/test/e2e "${imports[@]}"
ldflags=$(k8s_ldflags)

echo "build-e2e.sh: go test -c k8s.io/kubernetes/test/e2e (the longest step)" >&2
go test -c -trimpath -ldflags "$ldflags" -o "$out/bin.tmp/e2e.test" k8s.io/kubernetes/test/e2e
echo "build-e2e.sh: agnhost" >&2
go build -trimpath -ldflags "-s -w" -o "$out/bin.tmp/agnhost" k8s.io/kubernetes/test/images/agnhost

# ginkgo at the version the kubernetes module pins, in a module of its own (its CLI's dependencies
# are not the suite's).
ginkgo_version=$(sed -n 's#^[[:space:]]*github\.com/onsi/ginkgo/v2 \(v[0-9][^ ]*\).*#\1#p' "$k8s_gomod" | head -n1)
[ -n "$ginkgo_version" ] || { echo "build-e2e.sh: $k8s_gomod pins no github.com/onsi/ginkgo/v2" >&2; exit 1; }
echo "build-e2e.sh: ginkgo $ginkgo_version" >&2
mkdir -p "$out/ginkgo-module"
(
  cd "$out/ginkgo-module"
  printf 'module keelson.local/ginkgo-build\n\ngo 1.24\n' >go.mod
  go get "github.com/onsi/ginkgo/v2/ginkgo@$ginkgo_version" 2>get.log || { cat get.log >&2; exit 1; }
  go build -trimpath -ldflags "-s -w" -o "$out/bin.tmp/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
)
cp "$e2e_dir/test/conformance/testdata/conformance.yaml" "$out/bin.tmp/conformance.yaml"
chmod 644 "$out/bin.tmp/conformance.yaml"

"$out/bin.tmp/e2e.test" --help >/dev/null 2>&1 || { echo "build-e2e.sh: e2e.test --help failed" >&2; exit 1; }
"$out/bin.tmp/ginkgo" version | grep -qF "${ginkgo_version#v}" || { echo "build-e2e.sh: ginkgo version is not $ginkgo_version" >&2; exit 1; }
rm -rf "${out:?}/bin" "$out/ginkgo-module"
mv "$out/bin.tmp" "$out/bin"
(cd "$out/bin" && sha256sum e2e.test ginkgo agnhost conformance.yaml) >"$out/sha256sums.tmp"
mv "$out/sha256sums.tmp" "$out/sha256sums"
end=$(date +%s)
echo "built the e2e suite of v$version in $((end - start)) s; $(du -sh "$out/bin" | cut -f1)" >"$out/build-info.tmp"
mv "$out/build-info.tmp" "$out/build-info"
touch "$out/.complete"
cat "$out/build-info" >&2
echo "$out/bin"
