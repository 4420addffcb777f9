#!/usr/bin/env bash
# Build the GCE cloud-controller-manager keelson-local runs on GCE clusters, once per version pair.
#
#   tests/kubernetes/build-gce-ccm.sh PROVIDERS_VERSION CLOUD_PROVIDER_VERSION   # e.g. 0.28.2 0.34.4
#                                                                               # prints the binary's directory
#
# cloud-provider-gcp's own command lives in the module k8s.io/cloud-provider-gcp, which the Go module
# proxy does not serve; its provider, k8s.io/cloud-provider-gcp/providers, is. So the binary is
# tests/kubernetes/gce-ccm/main.go (k8s.io/cloud-provider's generic external-CCM command with the GCE
# provider registered) built against k8s.io/cloud-provider@vCLOUD_PROVIDER_VERSION and
# k8s.io/cloud-provider-gcp/providers@vPROVIDERS_VERSION: static (CGO_ENABLED=0), version stamped.
# Output: $KEELSON_LOCAL_CACHE/gce-ccm/vPROVIDERS-vCLOUD_PROVIDER-KEY/bin/gcp-cloud-controller-manager
# (KEY: main.go's sha256); `.complete` marks a finished build. Nothing prebuilt is downloaded.
set -euo pipefail

providers=${1:?usage: build-gce-ccm.sh PROVIDERS_VERSION CLOUD_PROVIDER_VERSION}
providers=${providers#v}
cloudprovider=${2:?usage: build-gce-ccm.sh PROVIDERS_VERSION CLOUD_PROVIDER_VERSION}
cloudprovider=${cloudprovider#v}
for v in "$providers" "$cloudprovider"; do
  [[ $v =~ ^0\.[0-9]+\.[0-9]+$ ]] || { echo "build-gce-ccm.sh: '$v' is not a module version (0.MINOR.PATCH)" >&2; exit 2; }
done
command -v go >/dev/null || { echo "build-gce-ccm.sh: Go is not installed (needed to build the GCE CCM from source)" >&2; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
key=$(sha256sum <"$here/gce-ccm/main.go" | cut -c1-12)
cache=${KEELSON_LOCAL_CACHE:-/var/cache/keelson-local}
out="$cache/gce-ccm/v$providers-v$cloudprovider-$key"
binary=gcp-cloud-controller-manager

# shellcheck source=tests/kubernetes/build-cache.sh
. "$here/build-cache.sh"
enter_build_cache "$out" "$out/bin"

work="$out/src"
rm -rf "${work:?}" "${out:?}/bin.tmp"
mkdir -p "$work" "$out/bin.tmp"
start=$(date +%s)
echo "build-gce-ccm.sh: building $binary (providers v$providers, cloud-provider v$cloudprovider); once per version pair" >&2
cp "$here/gce-ccm/main.go" "$work/main.go"
cd "$work"
cat >go.mod <<MOD
module keelson.local/gcp-cloud-controller-manager

go 1.24

require (
	k8s.io/cloud-provider v$cloudprovider
	k8s.io/cloud-provider-gcp/providers v$providers
)
MOD
# The proxy only: with `,direct` a module the proxy lacks sends Go to a VCS host it cannot reach,
# and resolution hangs instead of failing.
export GOPROXY=https://proxy.golang.org CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=mod -buildvcs=false"
go mod tidy >&2
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$cloudprovider"
go build -trimpath -ldflags "$ldflags" -o "$out/bin.tmp/$binary" .
"$out/bin.tmp/$binary" --version >&2 || { echo "build-gce-ccm.sh: $binary --version failed" >&2; exit 1; }

rm -rf "${out:?}/bin" "${work:?}"
mv "$out/bin.tmp" "$out/bin"
(cd "$out/bin" && sha256sum "$binary") >"$out/sha256sums"
echo "built $binary in $(($(date +%s) - start)) s; binary $(du -sh "$out/bin/$binary" | cut -f1)" >"$out/build-info"
touch "$out/.complete"
cat "$out/build-info" >&2
echo "$out/bin"
