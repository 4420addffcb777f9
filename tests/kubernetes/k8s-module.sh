# shellcheck shell=bash
# Sourced by tests/kubernetes/build.sh and build-e2e.sh: the throw-away Go module both build
# Kubernetes from (k8s.io/kubernetes@vVERSION from the Go module proxy, its staging modules
# replaced by their published k8s.io/X@v0.MINOR.PATCH).
#
# k8s_parse_version SCRIPT VERSION
#   Checks VERSION (1.MINOR.PATCH, an optional leading v) and sets k8s_version, k8s_minor,
#   k8s_staging_version; exits 2 naming SCRIPT if it is not a release version.
# k8s_module_init SCRIPT PACKAGE...
#   In the current (empty) directory: go.mod requiring k8s.io/kubernetes@v$k8s_version with the
#   staging replace lines, tools.go importing each PACKAGE (so `go mod tidy` pins their dependencies),
#   tidied. Sets k8s_gomod (the kubernetes module's own go.mod) and k8s_commit (its commit, when the
#   proxy records it). Exports GOFLAGS=-mod=mod and CGO_ENABLED=0.
# k8s_ldflags
#   Prints the -ldflags of a release-like build: stripped, the version stamped as release builds do.

k8s_parse_version() {
  local script=$1 version=${2#v}
  if ! [[ $version =~ ^1\.([0-9]+)\.([0-9]+)$ ]]; then
    echo "$script: '$version' is not a Kubernetes release version (1.MINOR.PATCH)" >&2
    exit 2
  fi
  k8s_version=$version
  k8s_minor=${BASH_REMATCH[1]}
  k8s_staging_version="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
}

k8s_module_init() {
  local script=$1 staging m p
  shift
  export GOFLAGS="${GOFLAGS:-} -mod=mod"
  export CGO_ENABLED=0
  cat >go.mod <<MOD
module keelson.local/kubernetes-build

go 1.24
MOD
  # The kubernetes module's own go.mod lists the staging modules it replaces with local paths.
  go mod download -json "k8s.io/kubernetes@v$k8s_version" >download.json
  k8s_gomod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' download.json)
  [ -f "$k8s_gomod" ] || { echo "$script: go mod download gave no go.mod for k8s.io/kubernetes@v$k8s_version" >&2; exit 1; }
  staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/k8s\.io/.*#\1#p' "$k8s_gomod")
  [ -n "$staging" ] || { echo "$script: no staging replace lines in $k8s_gomod" >&2; exit 1; }
  {
    echo "require k8s.io/kubernetes v$k8s_version"
    for m in $staging; do echo "replace $m => $m $k8s_staging_version"; done
  } >>go.mod
  # A package importing each given package pins its dependencies in go.sum.
  {
    echo "package tools"
    echo "import ("
    for p in "$@"; do echo "  _ \"$p\""; done
    echo ")"
  } >tools.go
  go mod tidy -e >/dev/null 2>tidy.log || { cat tidy.log >&2; exit 1; }
  k8s_commit=$(sed -n 's/^[[:space:]]*"Hash": "\(.*\)",\{0,1\}$/\1/p' download.json | head -n1)
}

k8s_ldflags() {
  local ldflags="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=v$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$k8s_minor"
    ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z -X $p.gitCommit=${k8s_commit:-unknown}"
  done
  echo "$ldflags"
}
