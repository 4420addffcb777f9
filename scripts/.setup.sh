#!/usr/bin/env bash
# Install what the test suite needs (Debian packages, a Python venv with moto) and run every test.
# Idempotent: a second run installs nothing. Tests that need root or a tool fail loudly without it.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(shellcheck python3-venv etcd-server etcd-client e2fsprogs util-linux iproute2 curl xz-utils openssl binutils debootstrap systemd-container
  docker-registry skopeo umoci jq)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "scripts/test: installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

VENV=${KEELSON_VENV:-$PWD/.venv}
if ! "$VENV/bin/python" -c 'import moto, yaml' >/dev/null 2>&1; then
  echo "scripts/test: creating Python venv $VENV (moto server, PyYAML)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check 'moto[server]' pyyaml
fi
export KEELSON_PYTHON="$VENV/bin/python"

# Kubernetes for keelson-local, built from the k8s.io/kubernetes Go module at the examples' version
# (cached by version under /var/cache/keelson-local: only the first run compiles). keelson-local
# builds containerd, etcd and the images it needs the same way when a test brings a cluster up.
command -v go >/dev/null || { echo "scripts/test: Go is needed to build Kubernetes from source (go not found on PATH)" >&2; exit 1; }
# fake-gcs-server, the Cloud Storage emulator the gs:// state-store tests run against (pinned; built
# from its Go module once).
gobin=$(go env GOBIN); gobin=${gobin:-$(go env GOPATH)/bin}
export KEELSON_FAKE_GCS_SERVER="$gobin/fake-gcs-server"
if ! "$KEELSON_FAKE_GCS_SERVER" -help >/dev/null 2>&1; then
  echo "scripts/test: installing fake-gcs-server v1.56.1 (go install)"
  go install github.com/fsouza/fake-gcs-server@v1.56.1
fi

k8s_version=$(sed -n 's/^  kubernetesVersion: *//p' examples/ha.yaml)
tests/kubernetes/build.sh "$k8s_version" >/dev/null

echo SETUP-DONE
