#!/usr/bin/env bash
# Build the container images keelson-local's Kubernetes tests run, as an OCI image layout, and push them
# to a registry. Nothing prebuilt is downloaded: Kubernetes comes from tests/kubernetes/build.sh, etcd is
# built from its Go module, go-runner/pause/echo from tests/kubernetes/images/, and kube-proxy's base is a
# Debian root made by debootstrap.
#
#   tests/kubernetes/images.sh build K8S_VERSION ETCD_VERSION PAUSE_VERSION   # e.g. build 1.34.4 3.6.12 3.10.1
#       Prints the OCI layout directory, $KEELSON_LOCAL_CACHE/images/KEY/oci (default cache
#       /var/cache/keelson-local); progress goes to stderr. KEY is a short sha256 over the versions, the
#       sha256sums of the Kubernetes binaries, this script and the Go sources under images/, so a second
#       call builds nothing. KEY/bin/ holds the etcd binaries (etcd, and etcdctl/etcdutl when the Go module
#       proxy serves them at that version) for use on the host.
#   tests/kubernetes/images.sh etcd ETCD_VERSION                                # e.g. etcd 3.5.21
#       Prints a directory holding etcd (and etcdctl/etcdutl) of that version, built once and cached
#       (tests run members of two versions with them).
#   tests/kubernetes/images.sh push LAYOUT REGISTRY                             # e.g. push .../oci 127.0.0.1:5000
#       Copies every image of LAYOUT to docker://REGISTRY/NAME:TAG (TLS not verified; plain HTTP is fine).
#
# The layout's tags (org.opencontainers.image.ref.name) are exactly the NAME:TAG pushed:
#   kube-apiserver:vK8S  kube-controller-manager:vK8S  kube-scheduler:vK8S
#       static binary at /usr/local/bin/NAME, /go-runner, /etc/passwd+group (root, nobody), /tmp (1777),
#       /etc/ssl/certs/ca-certificates.crt (from the host, if present); entrypoint /go-runner
#   kube-proxy:vK8S
#       Debian bookworm minbase with iptables (nft backend), ip6tables, conntrack, ipset, nft, kmod, iproute2,
#       plus /usr/local/bin/kube-proxy and /go-runner; entrypoint /go-runner
#   etcd:vETCD       /usr/local/bin/etcd (+ etcdctl, etcdutl when available); entrypoint /usr/local/bin/etcd
#   pause:PAUSE      /pause (entrypoint), user 65535
#   keelson-test/echo:1
#       /echo (entrypoint), user 65534: `echo [serve [ADDR]]` answers on ADDR (default :8080) with
#       $POD_NAME (else the hostname) and a newline; `echo get URL` prints URL's body
# All images are linux/<host arch>, with PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin.
# Read a tag with skopeo/umoci as oci:LAYOUT:NAME:TAG (e.g. umoci unpack --image LAYOUT:keelson-test/echo:1).
#
# Caches, all under $KEELSON_LOCAL_CACHE/images: KEY/ (the layout; a `.complete` marker), etcd/vETCD-HASH/
# (etcd build, once per version and recipe), base/debian-bookworm-HASH/rootfs (debootstrap root, keyed by
# its recipe). Old entries are not removed.
# Needs: go, umoci, skopeo (push), jq, debootstrap and root (for the Debian root, once), flock.
set -euo pipefail

die() { echo "images.sh: $*" >&2; exit 1; }
log() { echo "images.sh: $*" >&2; }

usage() {
  sed -n '/^#   tests/,/^#       Copies/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
self="$here/$(basename "${BASH_SOURCE[0]}")"
src="$here/images"
cache=${KEELSON_LOCAL_CACHE:-/var/cache/keelson-local}
root="$cache/images"

DEBIAN_SUITE=bookworm
DEBIAN_MIRROR=${KEELSON_DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBIAN_PACKAGES=iptables,conntrack,ipset,nftables,kmod,iproute2
IMAGE_PATH_ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
K8S_IMAGES=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy)
CREATED=1970-01-01T00:00:00Z # fixed image timestamps: only kube-proxy's Debian layer differs between builds

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || die "'$tool' is not installed (needed to $WHY)"
  done
}

# --- build ------------------------------------------------------------------------------------------------

# The sha256sums of the Kubernetes binaries the images hold: build.sh's record, else computed.
k8s_sums() {
  local bin=$1 name
  if [ -f "$bin/../sha256sums" ]; then
    for name in "${K8S_IMAGES[@]}"; do
      grep -E "[[:space:]]\*?$name\$" "$bin/../sha256sums" || die "$bin/../sha256sums has no entry for $name"
    done
  else
    (cd "$bin" && sha256sum "${K8S_IMAGES[@]}")
  fi
}

# Everything the layout is made from; its sha256 names the cache entry.
key_input() {
  local k8s=$1 etcd=$2 pause=$3 bin=$4
  printf 'kubernetes %s\netcd %s\npause %s\n' "$k8s" "$etcd" "$pause"
  k8s_sums "$bin"
  # The script without its conformance block: the suite's images are not the cluster's, and a new
  # suite image must not rebuild the cluster's layout.
  sed '/^# --- BEGIN conformance images/,/^# --- END conformance images/d' "$self" | sha256sum
  (cd "$src" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
}

# build_go_program NAME OUTPUT [EXTRA_LDFLAGS]: a static build of tests/kubernetes/images/NAME.
build_go_program() {
  local name=$1 output=$2 extra=${3:-}
  log "building $name (Go)"
  (cd "$src/$name" && CGO_ENABLED=0 GOOS=linux GOARCH="$arch" GOFLAGS="${GOFLAGS:-} -buildvcs=false" \
    go build -trimpath -ldflags "-s -w $extra" -o "$output" .) || die "building $src/$name failed"
}

# ensure_etcd VERSION: prints a directory holding etcd (and etcdctl/etcdutl at VERSION, or at the
# newest patch of the same minor the proxy serves), built from the Go modules once per version and
# recipe (this function) into
# $root/etcd/vVERSION-HASH/bin.
ensure_etcd() {
  local version=$1 dir
  dir="$root/etcd/v$version-$({ echo "$arch"; declare -f ensure_etcd; } | sha256sum | cut -c1-8)"
  if [ -f "$dir/.complete" ]; then echo "$dir/bin"; return; fi
  mkdir -p "$dir"
  (
    exec 7>"$dir/.lock"
    flock 7
    if [ -f "$dir/.complete" ]; then exit 0; fi
    local work="$dir/module" start hash tool
    local -a built=()
    start=$(date +%s)
    rm -rf "${work:?}" "${dir:?}/bin" "$dir/bin.tmp" "$dir"/module-*
    mkdir -p "$work" "$dir/bin.tmp"
    cd "$work"
    export CGO_ENABLED=0 GOOS=linux GOARCH="$arch" GOFLAGS="${GOFLAGS:-} -mod=mod -buildvcs=false"
    log "building etcd v$version from the Go module go.etcd.io/etcd/server/v3 (once per version)"
    printf 'module keelson.local/etcd-build\n\ngo 1.24\n' >go.mod
    go mod download -json "go.etcd.io/etcd/server/v3@v$version" >download.json 2>download.err ||
      { cat download.err >&2; die "the Go module proxy does not serve go.etcd.io/etcd/server/v3@v$version"; }
    hash=$(jq -r '.Origin.Hash // empty' download.json) # the proxy does not always record it
    local ldflags="-s -w"
    [ -z "$hash" ] || ldflags+=" -X go.etcd.io/etcd/api/v3/version.GitSHA=${hash:0:8}"
    go get "go.etcd.io/etcd/server/v3@v$version" 2>get.log || { cat get.log >&2; die "go get etcd server failed"; }
    go build -trimpath -ldflags "$ldflags" -o "$dir/bin.tmp/etcd" go.etcd.io/etcd/server/v3 ||
      die "building etcd v$version failed"
    built+=(etcd)
    for tool in etcdctl etcdutl; do
      local tool_version=v$version minor=${version%.*}
      if ! go list -m "go.etcd.io/etcd/$tool/v3@v$version" >/dev/null 2>list.err; then
        # Only a definite "not there" leaves the tool out; any other failure must not be cached.
        grep -qE 'not available|40[34] |410 |unknown revision|invalid version' list.err ||
          { cat list.err >&2; die "could not ask the Go module proxy for go.etcd.io/etcd/$tool/v3@v$version"; }
        # The newest patch of the same minor the proxy serves: snapshot and data formats do not
        # change within a minor, so its etcdutl restores this server's snapshots.
        tool_version=$(go list -m -versions "go.etcd.io/etcd/$tool/v3" 2>/dev/null | tr ' ' '\n' |
          grep -E "^v${minor//./\\.}\.[0-9]+$" | sort -V | tail -n 1 || true)
        if [ -z "$tool_version" ]; then
          log "the Go module proxy serves no go.etcd.io/etcd/$tool/v3 of etcd $minor: the etcd image has no $tool"
          continue
        fi
        log "the Go module proxy does not serve go.etcd.io/etcd/$tool/v3@v$version: building $tool $tool_version (same minor)"
      fi
      mkdir -p "$dir/module-$tool"
      (
        cd "$dir/module-$tool"
        printf 'module keelson.local/%s-build\n\ngo 1.24\n' "$tool" >go.mod
        go get "go.etcd.io/etcd/$tool/v3@$tool_version" 2>get.log || { cat get.log >&2; exit 1; }
        go build -trimpath -ldflags "$ldflags" -o "$dir/bin.tmp/$tool" "go.etcd.io/etcd/$tool/v3"
      ) || die "building $tool $tool_version failed"
      built+=("$tool@$tool_version")
    done
    "$dir/bin.tmp/etcd" --version >&2 || die "the etcd built from v$version does not run"
    mv "$dir/bin.tmp" "$dir/bin"
    echo "built ${built[*]} v$version in $(($(date +%s) - start)) s" >"$dir/build-info"
    touch "$dir/.complete"
  ) || exit 1
  echo "$dir/bin"
}

# The Debian root of the kube-proxy image. Its cache key is this recipe (suite, packages, the function).
build_debian_base() {
  local target=$1
  log "debootstrap $DEBIAN_SUITE minbase + $DEBIAN_PACKAGES from $DEBIAN_MIRROR (once; a few minutes)"
  debootstrap --variant=minbase --components=main --arch="$arch" --include="$DEBIAN_PACKAGES" \
    "$DEBIAN_SUITE" "$target" "$DEBIAN_MIRROR" >"$target.log" 2>&1 ||
    { tail -n 40 "$target.log" >&2; die "debootstrap failed (full log: $target.log)"; }
  # Runtime state the container runtime provides, host files debootstrap copied in, and bulk nobody reads.
  local real
  real=$(readlink -f "$target")
  if awk '{print $2}' /proc/self/mounts | grep -qF "$real/"; then
    die "something is still mounted under $target (debootstrap's /proc or /sys?); not cleaning it"
  fi
  (
    cd "$target" || exit 1
    rm -rf dev/* proc/* sys/* run/* tmp/* var/tmp/* var/lib/apt/lists/* var/cache/apt/* var/cache/debconf/*-old \
      var/cache/ldconfig/* var/log/* usr/share/doc/* usr/share/man/* usr/share/info/* usr/share/locale/* \
      usr/share/lintian usr/share/common-licenses etc/hostname etc/resolv.conf etc/machine-id
  ) || die "cleaning the Debian root failed"
  chmod 1777 "$target/tmp" "$target/var/tmp"
  local tool
  for tool in iptables ip6tables iptables-restore iptables-save ip6tables-restore ip6tables-save \
    conntrack ipset nft modprobe ip; do
    chroot "$target" /bin/sh -c "command -v $tool" >/dev/null || die "the Debian root has no $tool"
  done
  # By the alternatives link, not by running it: another architecture's iptables runs here under
  # qemu-user, which has no nftables netlink.
  case $(readlink -f "$target/usr/sbin/iptables") in
    */xtables-nft-multi) ;;
    *) die "iptables in the Debian root is not the nft backend ($(readlink -f "$target/usr/sbin/iptables"))" ;;
  esac
}

# ensure_debian_base: prints the cached Debian root.
ensure_debian_base() {
  local bkey dir
  bkey=$({ echo "$DEBIAN_SUITE $DEBIAN_PACKAGES $arch"; declare -f build_debian_base; } | sha256sum | cut -c1-12)
  dir="$root/base/debian-$DEBIAN_SUITE-$bkey"
  if [ -f "$dir/.complete" ]; then echo "$dir/rootfs"; return; fi
  [ "$(id -u)" = 0 ] || die "building the Debian root of kube-proxy (debootstrap) needs root"
  WHY="build kube-proxy's Debian root" need debootstrap
  mkdir -p "$dir"
  (
    exec 7>"$dir/.lock"
    flock 7
    if [ -f "$dir/.complete" ]; then exit 0; fi
    rm -rf "$dir/rootfs" "$dir/rootfs.tmp" "$dir/rootfs.tmp.log"
    build_debian_base "$dir/rootfs.tmp"
    mv "$dir/rootfs.tmp.log" "$dir/debootstrap.log"
    mv "$dir/rootfs.tmp" "$dir/rootfs"
    touch "$dir/.complete"
  ) || exit 1
  echo "$dir/rootfs"
}

# layer_tar DIR OUT [tar options...]: DIR's contents as an uncompressed layer (entries without "./").
layer_tar() {
  local dir=$1 out=$2
  shift 2
  local -a entries
  mapfile -t entries < <(find "$dir" -mindepth 1 -maxdepth 1 -printf '%P\n' | LC_ALL=C sort)
  [ "${#entries[@]}" -gt 0 ] || die "layer $dir is empty"
  tar --create --file "$out" --directory "$dir" --sort=name --numeric-owner "$@" -- "${entries[@]}"
}

# root-owned layer with a fixed mtime, for the files this script assembles
owned_layer_tar() { layer_tar "$1" "$2" --owner=0 --group=0 --mtime=@0; }

# stage_static_base DIR: what a FROM-scratch image needs to run a Go binary as root or nobody
# (/etc/passwd+group, nsswitch, /tmp 1777, /root, /var/log, the host's CA bundle if it has one).
stage_static_base() {
  local d=$1
  mkdir -p "$d/etc/ssl/certs" "$d/tmp" "$d/var/log" "$d/root"
  chmod 1777 "$d/tmp"
  chmod 700 "$d/root"
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' >"$d/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nobody:x:65534:' >"$d/etc/group"
  printf '%s\n' 'passwd: files' 'group: files' 'hosts: files dns' >"$d/etc/nsswitch.conf"
  chmod 644 "$d/etc/passwd" "$d/etc/group" "$d/etc/nsswitch.conf"
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp -L /etc/ssl/certs/ca-certificates.crt "$d/etc/ssl/certs/ca-certificates.crt"
    chmod 644 "$d/etc/ssl/certs/ca-certificates.crt"
  else
    log "the host has no /etc/ssl/certs/ca-certificates.crt; the images get no CA bundle"
  fi
}

# claim_cache_entry NAME KEY: sets out=$root/NAME-KEY; returns 1 when that entry is complete. Otherwise
# holds its lock (fd 8, until the script ends), makes the scratch directory tmp (removed on exit unless
# finish_layout moves it into place) and sets start; returns 0.
claim_cache_entry() {
  local name=$1 key=$2
  out="$root/$name-$key"
  if [ -f "$out/.complete" ]; then return 1; fi
  umask 022
  mkdir -p "$root"
  exec 8>"$root/.$name-$key.lock"
  flock 8
  if [ -f "$out/.complete" ]; then return 1; fi
  rm -rf "$root/.tmp-$name-$key".*
  tmp=$(mktemp -d "$root/.tmp-$name-$key.XXXXXX")
  # shellcheck disable=SC2064 # expand now
  trap "rm -rf -- '$tmp'" EXIT
  chmod 755 "$tmp"
  start=$(date +%s)
}

# finish_layout TMP OUT WHAT START: garbage-collect the layout in TMP, record the build, move it to OUT
# (the cache entry, marked complete) and print OUT/oci.
finish_layout() {
  local tmp=$1 out=$2 what=$3 start=$4
  umoci gc --layout "$tmp/oci"
  rm -rf "$tmp/work"
  echo "built in $(($(date +%s) - start)) s; layout $(du -sh "$tmp/oci" | cut -f1)" >"$tmp/build-info"
  touch "$tmp/.complete"
  rm -rf "$out"
  mv "$tmp" "$out"
  trap - EXIT
  log "$what: $(cat "$out/build-info")"
  echo "$out/oci"
}

# image REF ENTRYPOINT USER LAYER...: a new image in the layout from the given layer tars.
image() {
  local ref=$1 entrypoint=$2 user=$3 layer
  shift 3
  log "assembling $ref"
  umoci new --image "$layout:$ref"
  for layer in "$@"; do
    umoci raw add-layer --image "$layout:$ref" --history.created "$CREATED" \
      --history.created_by "keelson images.sh: $layer" "$layers/$layer.tar"
  done
  local -a user_opt=()
  [ -z "$user" ] || user_opt=(--config.user "$user")
  umoci config --image "$layout:$ref" --no-history --created "$CREATED" --architecture "$arch" --os linux \
    --author keelson --config.env "$IMAGE_PATH_ENV" --config.workingdir / \
    --config.entrypoint "$entrypoint" "${user_opt[@]}"
}

cmd_build() {
  [ $# -eq 3 ] || usage
  local k8s=${1#v} etcd=${2#v} pause=${3#v}
  [[ $k8s =~ ^1\.[0-9]+\.[0-9]+$ ]] || die "'$1' is not a Kubernetes version (1.MINOR.PATCH)"
  [[ $etcd =~ ^3\.([5-9]|[1-9][0-9])\.[0-9]+$ ]] || die "'$2' is not an etcd version (3.MINOR.PATCH, 3.5 or later)"
  [[ $pause =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]] || die "'$3' is not a pause version (e.g. 3.10.1)"

  local k8s_bin key out
  k8s_bin=$("$here/build.sh" "$k8s" | tail -n1) || die "building Kubernetes v$k8s (tests/kubernetes/build.sh) failed"
  [ -d "$k8s_bin" ] || die "tests/kubernetes/build.sh printed '$k8s_bin', not a directory"
  key=$(key_input "$k8s" "$etcd" "$pause" "$k8s_bin" | sha256sum | cut -c1-16)
  out="$root/$key"
  if [ -f "$out/.complete" ]; then echo "$out/oci"; return; fi

  WHY="build the test images" need go umoci jq tar flock find
  umask 022 # the modes of the directories and files put in the layers
  mkdir -p "$root"
  exec 8>"$root/.$key.lock"
  flock 8
  if [ -f "$out/.complete" ]; then echo "$out/oci"; return; fi
  rm -rf "$root/.tmp-$key".* # left by a build that was killed (we hold the lock)
  tmp=$(mktemp -d "$root/.tmp-$key.XXXXXX")
  trap 'rm -rf -- "$tmp"' EXIT
  chmod 755 "$tmp"

  local start stage name
  start=$(date +%s)
  arch=$(go env GOARCH)
  layout="$tmp/oci"
  layers="$tmp/work/layers"
  stage="$tmp/work/stage"
  mkdir -p "$layers" "$stage" "$tmp/bin"
  log "building the test images (Kubernetes v$k8s, etcd v$etcd, pause $pause) into $out"

  local etcd_bin base_root
  etcd_bin=$(ensure_etcd "$etcd")
  base_root=$(ensure_debian_base)

  # Layers. static-base: what a FROM-scratch image needs to run a Go binary as root or nobody.
  stage_static_base "$stage/static-base"
  owned_layer_tar "$stage/static-base" "$layers/static-base.tar"

  mkdir -p "$stage/go-runner" "$stage/pause" "$stage/echo"
  build_go_program go-runner "$stage/go-runner/go-runner"
  build_go_program pause "$stage/pause/pause" "-X main.version=$pause"
  build_go_program echo "$stage/echo/echo"
  for name in go-runner pause echo; do owned_layer_tar "$stage/$name" "$layers/$name.tar"; done

  for name in "${K8S_IMAGES[@]}"; do
    mkdir -p "$stage/$name/usr/local/bin"
    install -m 755 "$k8s_bin/$name" "$stage/$name/usr/local/bin/$name"
    owned_layer_tar "$stage/$name" "$layers/$name.tar"
  done

  mkdir -p "$stage/etcd/usr/local/bin"
  for name in etcd etcdctl etcdutl; do
    [ -f "$etcd_bin/$name" ] || continue
    install -m 755 "$etcd_bin/$name" "$stage/etcd/usr/local/bin/$name"
    install -m 755 "$etcd_bin/$name" "$tmp/bin/$name"
  done
  owned_layer_tar "$stage/etcd" "$layers/etcd.tar"

  log "packing the Debian root of kube-proxy"
  layer_tar "$base_root" "$layers/debian-$DEBIAN_SUITE.tar"

  # Images.
  umoci init --layout "$layout"
  for name in kube-apiserver kube-controller-manager kube-scheduler; do
    image "$name:v$k8s" /go-runner "" static-base go-runner "$name"
  done
  image "kube-proxy:v$k8s" /go-runner "" "debian-$DEBIAN_SUITE" go-runner kube-proxy
  image "etcd:v$etcd" /usr/local/bin/etcd "" static-base etcd
  image "pause:$pause" /pause 65535:65535 pause
  image "keelson-test/echo:1" /echo 65534:65534 static-base echo
  umoci gc --layout "$layout"

  rm -rf "$tmp/work"
  {
    echo "built in $(($(date +%s) - start)) s; layout $(du -sh "$layout" | cut -f1)"
    jq -r '.manifests[].annotations["org.opencontainers.image.ref.name"]' "$layout/index.json"
  } >"$tmp/build-info"
  touch "$tmp/.complete"
  rm -rf "$out"
  mv "$tmp" "$out"
  trap - EXIT
  log "$(head -n1 "$out/build-info")"
  echo "$out/oci"
}

# --- push -------------------------------------------------------------------------------------------------

cmd_push() {
  [ $# -eq 2 ] || usage
  local layout=${1%/} registry=${2%/} host port ref
  if ! [ -f "$layout/oci-layout" ] || ! [ -f "$layout/index.json" ]; then
    die "'$layout' is not an OCI image layout"
  fi
  [[ $layout != *:* ]] || die "the layout path '$layout' contains ':', which skopeo's oci: transport cannot take"
  WHY="push the test images" need skopeo jq timeout

  # REGISTRY is HOST[:PORT][/NAMESPACE]; check that something listens before skopeo's long retries.
  if [[ $registry =~ ^\[([0-9A-Fa-f:.]+)\](:([0-9]+))?(/.*)?$ ]] || [[ $registry =~ ^([^:/]+)(:([0-9]+))?(/.*)?$ ]]; then
    host=${BASH_REMATCH[1]}
    port=${BASH_REMATCH[3]:-443}
  else
    die "'$registry' is not a registry address (HOST[:PORT][/NAMESPACE], e.g. 127.0.0.1:5000)"
  fi
  # shellcheck disable=SC2016 # expanded by the inner bash
  timeout 5 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$host" "$port" 2>/dev/null ||
    die "the registry $registry is unreachable (no TCP connection to $host:$port within 5 s)"

  local -a refs
  mapfile -t refs < <(jq -r '.manifests[].annotations["org.opencontainers.image.ref.name"] // empty' "$layout/index.json")
  [ "${#refs[@]}" -gt 0 ] || die "'$layout' has no tagged images"
  for ref in "${refs[@]}"; do
    # The source is a local layout we built, so there is no signature policy to apply.
    # --all: a multi-platform index (`index`) goes with every platform's image.
    skopeo --insecure-policy copy --all --quiet --dest-tls-verify=false "oci:$layout:$ref" "docker://$registry/$ref" ||
      die "pushing $ref to $registry failed"
    log "pushed $registry/$ref"
  done
}

# --- BEGIN aws-cloud-controller-manager image (keelson ccm branch; self-contained block) -----------------
#   tests/kubernetes/images.sh build-ccm CCM_VERSION        # e.g. build-ccm 1.34.4
#       Prints an OCI layout holding provider-aws-cloud-controller-manager:vCCM_VERSION: the static binary
#       from tests/kubernetes/build-ccm.sh at /usr/local/bin/aws-cloud-controller-manager on the same
#       static base as kube-controller-manager (/etc/passwd+group, /tmp, CA bundle), entrypoint the
#       binary, user 0. Cached as $KEELSON_LOCAL_CACHE/images/ccm-KEY (KEY: version, binary sha256, this
#       block); push it with `images.sh push LAYOUT REGISTRY` like the main layout.
CCM_BINARY=aws-cloud-controller-manager

cmd_build_ccm() {
  [ $# -eq 1 ] || usage
  local version=${1#v} bin key out tmp stage layers start
  [[ $version =~ ^1\.[0-9]+\.[0-9]+$ ]] || die "'$1' is not a cloud-provider-aws version (1.MINOR.PATCH)"
  bin=$("$here/build-ccm.sh" "$version" | tail -n1) || die "building the AWS CCM v$version (tests/kubernetes/build-ccm.sh) failed"
  [ -x "$bin/$CCM_BINARY" ] || die "tests/kubernetes/build-ccm.sh printed '$bin', which has no $CCM_BINARY"
  key=$({ echo "ccm $version"; sha256sum <"$bin/$CCM_BINARY"; sed -n '/^# --- BEGIN aws-cloud-controller-manager/,/^# --- END aws-cloud-controller-manager/p' "$self"; declare -f claim_cache_entry stage_static_base finish_layout; } |
    sha256sum | cut -c1-16)
  WHY="build the CCM image" need go umoci jq tar flock find
  claim_cache_entry ccm "$key" || { echo "$out/oci"; return; }
  arch=$(go env GOARCH)
  layout="$tmp/oci"
  layers="$tmp/work/layers"
  stage="$tmp/work/stage"
  mkdir -p "$layers" "$stage/ccm/usr/local/bin"
  stage_static_base "$stage/static-base"
  owned_layer_tar "$stage/static-base" "$layers/static-base.tar"
  install -m 755 "$bin/$CCM_BINARY" "$stage/ccm/usr/local/bin/$CCM_BINARY"
  owned_layer_tar "$stage/ccm" "$layers/ccm.tar"
  umoci init --layout "$layout"
  image "provider-aws-cloud-controller-manager:v$version" "/usr/local/bin/$CCM_BINARY" "" static-base ccm
  finish_layout "$tmp" "$out" "CCM image" "$start"
}

if [ "${1:-}" = build-ccm ]; then
  shift
  cmd_build_ccm "$@"
  exit 0
fi
# --- END aws-cloud-controller-manager image ----------------------------------------------------------------

# --- BEGIN gcp-cloud-controller-manager image (self-contained block) ---------------------------------------
#   tests/kubernetes/images.sh build-gce-ccm PROVIDERS_VERSION CLOUD_PROVIDER_VERSION   # e.g. 0.28.2 0.34.4
#       Prints an OCI layout holding gcp-cloud-controller-manager:vPROVIDERS_VERSION: the static binary from
#       tests/kubernetes/build-gce-ccm.sh at /usr/local/bin/gcp-cloud-controller-manager on the same static
#       base as kube-controller-manager (/etc/passwd+group, /tmp, CA bundle), entrypoint the binary, user 0.
#       Cached as $KEELSON_LOCAL_CACHE/images/gce-ccm-KEY (KEY: versions, binary sha256, this block); push it
#       with `images.sh push LAYOUT REGISTRY` like the main layout.
GCE_CCM_BINARY=gcp-cloud-controller-manager

cmd_build_gce_ccm() {
  [ $# -eq 2 ] || usage
  local providers=${1#v} cloudprovider=${2#v} bin key out tmp stage layers start
  bin=$("$here/build-gce-ccm.sh" "$providers" "$cloudprovider" | tail -n1) ||
    die "building the GCE CCM (tests/kubernetes/build-gce-ccm.sh $providers $cloudprovider) failed"
  [ -x "$bin/$GCE_CCM_BINARY" ] || die "tests/kubernetes/build-gce-ccm.sh printed '$bin', which has no $GCE_CCM_BINARY"
  key=$({ echo "gce-ccm $providers $cloudprovider"; sha256sum <"$bin/$GCE_CCM_BINARY"; sed -n '/^# --- BEGIN gcp-cloud-controller-manager/,/^# --- END gcp-cloud-controller-manager/p' "$self"; declare -f claim_cache_entry stage_static_base finish_layout; } |
    sha256sum | cut -c1-16)
  WHY="build the GCE CCM image" need go umoci jq tar flock find
  claim_cache_entry gce-ccm "$key" || { echo "$out/oci"; return; }
  arch=$(go env GOARCH)
  layout="$tmp/oci"
  layers="$tmp/work/layers"
  stage="$tmp/work/stage"
  mkdir -p "$layers" "$stage/ccm/usr/local/bin"
  stage_static_base "$stage/static-base"
  owned_layer_tar "$stage/static-base" "$layers/static-base.tar"
  install -m 755 "$bin/$GCE_CCM_BINARY" "$stage/ccm/usr/local/bin/$GCE_CCM_BINARY"
  owned_layer_tar "$stage/ccm" "$layers/ccm.tar"
  umoci init --layout "$layout"
  image "gcp-cloud-controller-manager:v$providers" "/usr/local/bin/$GCE_CCM_BINARY" "" static-base ccm
  finish_layout "$tmp" "$out" "GCE CCM image" "$start"
}

if [ "${1:-}" = build-gce-ccm ]; then
  shift
  cmd_build_gce_ccm "$@"
  exit 0
fi
# --- END gcp-cloud-controller-manager image ----------------------------------------------------------------

# --- BEGIN coredns image (keelson coredns branch; self-contained block) ------------------------------------
#   tests/kubernetes/images.sh build-coredns COREDNS_VERSION   # e.g. build-coredns 1.14.2
#       Prints an OCI layout holding coredns-coredns:vCOREDNS_VERSION — the name the compiler gives
#       registry.k8s.io/coredns/coredns:vCOREDNS_VERSION under assets.containerRegistry — with the coredns
#       binary built from the Go module github.com/coredns/coredns@vCOREDNS_VERSION (static, CGO_ENABLED=0,
#       its own go.sum, the commit stamped as the version tag, as its Makefile does) at /coredns on the same
#       static base as kube-controller-manager (/etc/passwd+group, /tmp, CA bundle); entrypoint /coredns,
#       user 0 (the addon drops every capability but NET_BIND_SERVICE, which upstream's nonroot image gets
#       from a file capability instead). Cached as $KEELSON_LOCAL_CACHE/images/coredns-KEY (KEY: version,
#       arch, this block); push it with `images.sh push LAYOUT REGISTRY` like the main layout.
COREDNS_MODULE=github.com/coredns/coredns
COREDNS_REF=coredns-coredns

cmd_build_coredns() {
  [ $# -eq 1 ] || usage
  local version=${1#v} key out tmp stage layers start dir
  [[ $version =~ ^1\.[0-9]+\.[0-9]+$ ]] || die "'$1' is not a CoreDNS version (1.MINOR.PATCH)"
  WHY="build the CoreDNS image" need go umoci jq tar flock find
  arch=$(go env GOARCH)
  key=$({ echo "coredns $version $arch"; sed -n '/^# --- BEGIN coredns image/,/^# --- END coredns image/p' "$self"; declare -f claim_cache_entry stage_static_base finish_layout; } |
    sha256sum | cut -c1-16)
  claim_cache_entry coredns "$key" || { echo "$out/oci"; return; }
  layout="$tmp/oci"
  layers="$tmp/work/layers"
  stage="$tmp/work/stage"
  mkdir -p "$layers" "$stage/coredns" "$tmp/work/download"

  log "building coredns v$version from the Go module $COREDNS_MODULE"
  # `go mod download` needs a module context only for its cache; a throw-away one is enough.
  printf 'module keelson.local/coredns-download\n\ngo 1.24\n' >"$tmp/work/download/go.mod"
  (cd "$tmp/work/download" && go mod download -json "$COREDNS_MODULE@v$version") >"$tmp/work/download.json" ||
    die "the Go module proxy does not serve $COREDNS_MODULE@v$version"
  dir=$(jq -r '.Dir // empty' "$tmp/work/download.json")
  [ -f "$dir/go.mod" ] || die "go mod download gave no source tree for $COREDNS_MODULE@v$version"
  # Built inside a copy of its own tree (with its go.sum), as its Makefile does.
  cp -r "$dir" "$tmp/work/src"
  chmod -R u+w "$tmp/work/src"
  (cd "$tmp/work/src" && CGO_ENABLED=0 GOOS=linux GOARCH="$arch" GOFLAGS="${GOFLAGS:-} -mod=mod -buildvcs=false" \
    go build -trimpath -ldflags "-s -w -X $COREDNS_MODULE/coremain.GitCommit=v$version" \
    -o "$stage/coredns/coredns" .) || die "building $COREDNS_MODULE@v$version failed"
  "$stage/coredns/coredns" -version >&2 || die "the coredns v$version just built does not run (-version)"

  stage_static_base "$stage/static-base"
  owned_layer_tar "$stage/static-base" "$layers/static-base.tar"
  owned_layer_tar "$stage/coredns" "$layers/coredns.tar"
  umoci init --layout "$layout"
  image "$COREDNS_REF:v$version" /coredns "" static-base coredns
  finish_layout "$tmp" "$out" "CoreDNS image" "$start"
}

if [ "${1:-}" = build-coredns ]; then
  shift
  cmd_build_coredns "$@"
  exit 0
fi
# --- END coredns image -------------------------------------------------------------------------------------

# --- BEGIN metrics-server image (keelson metrics branch; self-contained block) -----------------------------
#   tests/kubernetes/images.sh build-metrics-server VERSION   # e.g. build-metrics-server 0.8.0
#       Prints an OCI layout holding metrics-server-metrics-server:vVERSION — the name the compiler gives
#       registry.k8s.io/metrics-server/metrics-server:vVERSION under assets.containerRegistry — with the
#       metrics-server binary built from the Go module sigs.k8s.io/metrics-server@vVERSION (static,
#       CGO_ENABLED=0, its own go.sum, the version stamped as its Makefile does) at /metrics-server on the
#       same static base as kube-controller-manager (/etc/passwd+group, /tmp, CA bundle); entrypoint
#       /metrics-server, user 65534 as upstream's image (the addon runs it as 1000, read-only, no
#       capabilities). Cached as $KEELSON_LOCAL_CACHE/images/metrics-server-KEY (KEY: version, arch, this
#       block); push it with `images.sh push LAYOUT REGISTRY` like the main layout.
METRICS_SERVER_MODULE=sigs.k8s.io/metrics-server
METRICS_SERVER_REF=metrics-server-metrics-server

cmd_build_metrics_server() {
  [ $# -eq 1 ] || usage
  local version=${1#v} key out tmp stage layers start dir commit
  [[ $version =~ ^0\.[0-9]+\.[0-9]+$ ]] || die "'$1' is not a metrics-server version (0.MINOR.PATCH)"
  WHY="build the metrics-server image" need go umoci jq tar flock find
  arch=$(go env GOARCH)
  key=$({ echo "metrics-server $version $arch"; sed -n '/^# --- BEGIN metrics-server image/,/^# --- END metrics-server image/p' "$self"; declare -f claim_cache_entry stage_static_base finish_layout; } |
    sha256sum | cut -c1-16)
  claim_cache_entry metrics-server "$key" || { echo "$out/oci"; return; }
  layout="$tmp/oci"
  layers="$tmp/work/layers"
  stage="$tmp/work/stage"
  mkdir -p "$layers" "$stage/metrics-server" "$tmp/work/download"

  log "building metrics-server v$version from the Go module $METRICS_SERVER_MODULE"
  # `go mod download` needs a module context only for its cache; a throw-away one is enough.
  printf 'module keelson.local/metrics-server-download\n\ngo 1.24\n' >"$tmp/work/download/go.mod"
  (cd "$tmp/work/download" && go mod download -json "$METRICS_SERVER_MODULE@v$version") >"$tmp/work/download.json" ||
    die "the Go module proxy does not serve $METRICS_SERVER_MODULE@v$version"
  dir=$(jq -r '.Dir // empty' "$tmp/work/download.json")
  commit=$(jq -r '.Origin.Hash // empty' "$tmp/work/download.json") # the proxy does not always record it
  [ -f "$dir/go.mod" ] || die "go mod download gave no source tree for $METRICS_SERVER_MODULE@v$version"
  # Built inside a copy of its own tree (with its go.sum), with the version variables its Makefile sets
  # (no build date: the image stays reproducible).
  cp -r "$dir" "$tmp/work/src"
  chmod -R u+w "$tmp/work/src"
  (cd "$tmp/work/src" && CGO_ENABLED=0 GOOS=linux GOARCH="$arch" GOFLAGS="${GOFLAGS:-} -mod=mod -buildvcs=false" \
    go build -trimpath -ldflags "-s -w -X k8s.io/client-go/pkg/version.gitVersion=v$version -X k8s.io/client-go/pkg/version.gitCommit=$commit" \
    -o "$stage/metrics-server/metrics-server" ./cmd/metrics-server) || die "building $METRICS_SERVER_MODULE@v$version failed"
  "$stage/metrics-server/metrics-server" --version 2>&1 | grep -qF "v$version" ||
    die "the metrics-server v$version just built does not run or does not say its version (--version)"

  stage_static_base "$stage/static-base"
  owned_layer_tar "$stage/static-base" "$layers/static-base.tar"
  owned_layer_tar "$stage/metrics-server" "$layers/metrics-server.tar"
  umoci init --layout "$layout"
  image "$METRICS_SERVER_REF:v$version" /metrics-server 65534:65534 static-base metrics-server
  finish_layout "$tmp" "$out" "metrics-server image" "$start"
}

if [ "${1:-}" = build-metrics-server ]; then
  shift
  cmd_build_metrics_server "$@"
  exit 0
fi
# --- END metrics-server image ------------------------------------------------------------------------------

# --- BEGIN flannel images (keelson flannel branch; self-contained block) -----------------------------------
#   tests/kubernetes/images.sh build-flannel FLANNEL_VERSION CNI_PLUGIN_TAG   # e.g. build-flannel 0.28.4 1.9.1-flannel1
#       Prints an OCI layout holding the two images of upstream's kube-flannel.yml under the names the
#       compiler gives them under assets.containerRegistry:
#       ghcr.io-flannel-io-flannel:vFLANNEL_VERSION — flanneld built from the Go module
#           github.com/flannel-io/flannel@vFLANNEL_VERSION (its main package and its own go.sum, static with
#           CGO as its Makefile builds it, the version stamped as it does) at /opt/bin/flanneld, on
#           kube-proxy's Debian root (iptables with the nft backend, cp for the install-cni init
#           container); entrypoint /opt/bin/flanneld, user 0. The tencentvpc backend is left out of the
#           build: its SDK module (tencentcloud-sdk-go/tencentcloud/common v1.3.79) is not served.
#       ghcr.io-flannel-io-flannel-cni-plugin:vCNI_PLUGIN_TAG — the `flannel` CNI plugin at /flannel on
#           the same Debian root (cp for the install-cni-plugin init container). github.com/flannel-io/
#           cni-plugin, which upstream's image is built from, is not served by the Go module proxy; the
#           plugin is github.com/containernetworking/plugins@v0.9.1's plugins/meta/flannel, the last
#           release that has it (the code flannel-io/cni-plugin was split from). The tag is the name the
#           manifest uses, not that module's version.
#       Each module's h1: hash from the proxy is checked against the one pinned here (the checksum
#       database checks the same). Cached as $KEELSON_LOCAL_CACHE/images/flannel-KEY (KEY: versions,
#       arch, this block, the Debian root's recipe); push it with `images.sh push LAYOUT REGISTRY`.
FLANNEL_MODULE=github.com/flannel-io/flannel
FLANNEL_CNI_MODULE=github.com/containernetworking/plugins
FLANNEL_CNI_MODULE_VERSION=0.9.1
# go mod download's .Sum for each module version this block builds.
declare -A FLANNEL_MODULE_SUMS=(
  ["$FLANNEL_MODULE@v0.28.4"]="h1:6O4wGCrCTl0Gf5BBpxfOJgOstkxZhEx3ZXzcKRopH8Q="
  ["$FLANNEL_CNI_MODULE@v0.9.1"]="h1:FD1tADPls2EEi3flPc2OegIY1M9pUa9r2Quag7HMLV8="
)

# flannel_module MODULE VERSION DIR: the module's source tree copied (writable) to DIR, its sum checked.
flannel_module() {
  local module=$1 version=$2 dest=$3 json want got dir
  json="$dest.download.json"
  mkdir -p "$dest.download"
  printf 'module keelson.local/flannel-download\n\ngo 1.24\n' >"$dest.download/go.mod"
  (cd "$dest.download" && go mod download -json "$module@v$version") >"$json" || die "the Go module proxy does not serve $module@v$version"
  want=${FLANNEL_MODULE_SUMS["$module@v$version"]:-}
  [ -n "$want" ] || die "no pinned h1: sum for $module@v$version in images.sh (add it to FLANNEL_MODULE_SUMS)"
  got=$(jq -r '.Sum // empty' "$json")
  [ "$got" = "$want" ] || die "$module@v$version: the proxy's sum $got is not the pinned $want"
  dir=$(jq -r '.Dir // empty' "$json")
  [ -f "$dir/go.mod" ] || die "go mod download gave no source tree for $module@v$version"
  cp -r "$dir" "$dest"
  chmod -R u+w "$dest"
}

cmd_build_flannel() {
  [ $# -eq 2 ] || usage
  local version=${1#v} plugin_tag=${2#v} key out tmp stage layers start base_root src_dir
  [[ $version =~ ^0\.[0-9]+\.[0-9]+$ ]] || die "'$1' is not a flannel version (0.MINOR.PATCH)"
  [[ $plugin_tag =~ ^[0-9]+\.[0-9]+\.[0-9]+-flannel[0-9]+$ ]] || die "'$2' is not a flannel-cni-plugin tag (e.g. 1.9.1-flannel1)"
  WHY="build the flannel images" need go gcc umoci jq tar flock find
  arch=$(go env GOARCH)
  base_root=$(ensure_debian_base)
  key=$({ echo "flannel $version $plugin_tag $arch"; echo "$base_root"; sed -n '/^# --- BEGIN flannel images/,/^# --- END flannel images/p' "$self"; declare -f claim_cache_entry finish_layout; } |
    sha256sum | cut -c1-16)
  claim_cache_entry flannel "$key" || { echo "$out/oci"; return; }
  layout="$tmp/oci"
  layers="$tmp/work/layers"
  stage="$tmp/work/stage"
  mkdir -p "$layers" "$stage/flanneld/opt/bin" "$stage/cni-plugin"

  log "building flanneld v$version from the Go module $FLANNEL_MODULE"
  src_dir="$tmp/work/flannel"
  flannel_module "$FLANNEL_MODULE" "$version" "$src_dir"
  grep -q '"github.com/flannel-io/flannel/pkg/backend/tencentvpc"' "$src_dir/main.go" ||
    die "$FLANNEL_MODULE@v$version's main.go does not import the tencentvpc backend this block leaves out"
  sed -i '\#_ "github.com/flannel-io/flannel/pkg/backend/tencentvpc"#d' "$src_dir/main.go"
  # CGO for the udp backend's proxy, linked statically as its Makefile does; Go's own resolver and
  # user lookup (netgo, osusergo), so the static binary never loads glibc's NSS modules.
  (cd "$src_dir" && CGO_ENABLED=1 GOOS=linux GOARCH="$arch" GOFLAGS="${GOFLAGS:-} -mod=mod -buildvcs=false" \
    go build -tags netgo,osusergo -trimpath -ldflags "-s -w -X $FLANNEL_MODULE/pkg/version.Version=v$version -extldflags -static" \
    -o "$stage/flanneld/opt/bin/flanneld" .) || die "building $FLANNEL_MODULE@v$version failed"
  "$stage/flanneld/opt/bin/flanneld" --version 2>&1 | grep -qxF "v$version" ||
    die "the flanneld v$version just built does not run or does not say its version (--version)"

  log "building the flannel CNI plugin from $FLANNEL_CNI_MODULE@v$FLANNEL_CNI_MODULE_VERSION (plugins/meta/flannel)"
  src_dir="$tmp/work/cni-plugins"
  flannel_module "$FLANNEL_CNI_MODULE" "$FLANNEL_CNI_MODULE_VERSION" "$src_dir"
  rm -rf "$src_dir/vendor" # the module zip keeps only vendor/modules.txt
  (cd "$src_dir" && CGO_ENABLED=0 GOOS=linux GOARCH="$arch" GOFLAGS="${GOFLAGS:-} -mod=mod -buildvcs=false" \
    go build -trimpath -ldflags "-s -w" -o "$stage/cni-plugin/flannel" ./plugins/meta/flannel) ||
    die "building $FLANNEL_CNI_MODULE@v$FLANNEL_CNI_MODULE_VERSION plugins/meta/flannel failed"
  "$stage/cni-plugin/flannel" 2>&1 | grep -q '^CNI flannel plugin' || die "the flannel CNI plugin just built does not run"

  layer_tar "$base_root" "$layers/debian-$DEBIAN_SUITE.tar"
  owned_layer_tar "$stage/flanneld" "$layers/flanneld.tar"
  owned_layer_tar "$stage/cni-plugin" "$layers/cni-plugin.tar"
  umoci init --layout "$layout"
  image "ghcr.io-flannel-io-flannel:v$version" /opt/bin/flanneld "" "debian-$DEBIAN_SUITE" flanneld
  image "ghcr.io-flannel-io-flannel-cni-plugin:v$plugin_tag" /flannel "" "debian-$DEBIAN_SUITE" cni-plugin
  finish_layout "$tmp" "$out" "flannel images" "$start"
}

if [ "${1:-}" = build-flannel ]; then
  shift
  cmd_build_flannel "$@"
  exit 0
fi
# --- END flannel images ------------------------------------------------------------------------------------

# --- BEGIN cluster-autoscaler image (keelson autoscaler branch; self-contained block) ----------------------
#   tests/kubernetes/images.sh package-cluster-autoscaler BINARY VERSION   # e.g. ... /tmp/ca/cluster-autoscaler 1.34.4
#       Prints an OCI layout holding autoscaling-cluster-autoscaler:vVERSION — the name the compiler gives
#       registry.k8s.io/autoscaling/cluster-autoscaler:vVERSION under assets.containerRegistry — with the
#       GIVEN static cluster-autoscaler binary at /cluster-autoscaler (the addon runs ./cluster-autoscaler
#       from the working directory /, as upstream's image) on the same static base as
#       kube-controller-manager (/etc/passwd+group, /tmp, CA bundle), user 65534 as upstream's image.
#       This script does not fetch or build the autoscaler: the Go module proxy does not serve
#       k8s.io/autoscaler/cluster-autoscaler, so the binary comes from the caller (docs/local-cluster.md
#       says how it was built here). Cached as $KEELSON_LOCAL_CACHE/images/cluster-autoscaler-KEY (KEY:
#       version, the binary's sha256, this block); push it with `images.sh push LAYOUT REGISTRY`.
CLUSTER_AUTOSCALER_REF=autoscaling-cluster-autoscaler

cmd_package_cluster_autoscaler() {
  [ $# -eq 2 ] || usage
  local bin=$1 version=${2#v} key out tmp stage layers start help
  [[ $version =~ ^1\.[0-9]+\.[0-9]+$ ]] || die "'$2' is not a cluster-autoscaler version (1.MINOR.PATCH)"
  [ -f "$bin" ] && [ -x "$bin" ] || die "'$bin' is not an executable file"
  WHY="package the cluster-autoscaler image" need go umoci jq tar flock find sha256sum
  arch=$(go env GOARCH)
  # A static binary only: the image has no C library.
  if LC_ALL=C od -An -c -N 4096 "$bin" | tr -d ' \n' | grep -q 'ld-linux'; then
    die "'$bin' is dynamically linked (build it with CGO_ENABLED=0)"
  fi
  help=$("$bin" --help 2>&1 || true) # its --help exits 2
  [[ $help == *--node-group-auto-discovery* ]] || die "'$bin' does not run or is not cluster-autoscaler (--help)"
  key=$({ echo "cluster-autoscaler $version $arch"; sha256sum <"$bin"; sed -n '/^# --- BEGIN cluster-autoscaler image/,/^# --- END cluster-autoscaler image/p' "$self"; declare -f claim_cache_entry stage_static_base finish_layout; } |
    sha256sum | cut -c1-16)
  claim_cache_entry cluster-autoscaler "$key" || { echo "$out/oci"; return; }
  layout="$tmp/oci"
  layers="$tmp/work/layers"
  stage="$tmp/work/stage"
  mkdir -p "$layers" "$stage/cluster-autoscaler"
  install -m 755 "$bin" "$stage/cluster-autoscaler/cluster-autoscaler"
  stage_static_base "$stage/static-base"
  owned_layer_tar "$stage/static-base" "$layers/static-base.tar"
  owned_layer_tar "$stage/cluster-autoscaler" "$layers/cluster-autoscaler.tar"
  umoci init --layout "$layout"
  image "$CLUSTER_AUTOSCALER_REF:v$version" /cluster-autoscaler 65534:65534 static-base cluster-autoscaler
  finish_layout "$tmp" "$out" "cluster-autoscaler image" "$start"
}

if [ "${1:-}" = package-cluster-autoscaler ]; then
  shift
  cmd_package_cluster_autoscaler "$@"
  exit 0
fi
# --- END cluster-autoscaler image --------------------------------------------------------------------------

# --- BEGIN conformance images (self-contained block) -------------------------------------------------------
#   tests/kubernetes/images.sh conformance-images K8S_VERSION [REGISTRY]   # e.g. conformance-images 1.34.4 10.80.0.1:5000
#       Prints an OCI layout holding the images of the upstream e2e suite that keelson-local's conformance run
#       uses, under the names `conformance-repo-list REGISTRY` makes the suite ask for; pushes them to REGISTRY
#       when given. Names and tags are read from the kubernetes module's test/utils/image/manifest.go:
#         e2e-test-images/agnhost   agnhost from tests/kubernetes/build-e2e.sh at /agnhost (entrypoint, default
#                                   argument `pause`), /uploads, porter's /localhost.{crt,key}, on a Debian root with sh, bash, dig, curl, nc,
#                                   ip, iptables (upstream's is Alpine with the same tools)
#         e2e-test-images/jessie-dnsutils   the same Debian root (dig), command /bin/sh
#         e2e-test-images/busybox   upstream busybox of the tag's release built static from source
#                                   (build_busybox), a link per applet in /bin; command sh
#         e2e-test-images/httpd (both tags), e2e-test-images/nginx (both tags)   stand-ins: busybox's httpd
#                                   serving /usr/local/apache2/htdocs (httpd) or /usr/share/nginx/html (nginx)
#                                   on port 80, an index.html in each
#         pause                     tests/kubernetes/images/pause at the manifest's pause tag
#         e2e-test-images/kitten, nautilus   the agnhost image plus the module's test/images/{kitten,nautilus}/html
#                                   files at /, command test-webserver (upstream's recipe on our agnhost)
#         e2e-test-images/nonewprivs   the module's test/images/nonewprivs built static, setuid root, command nnp
#         e2e-test-images/sample-apiserver   k8s.io/sample-apiserver at the Kubernetes version's staging tag
#                                   (v0.MINOR.PATCH), static, entrypoint /sample-apiserver
#         etcd                      etcd built from its Go module at the manifest's tag's version (3.6.4-0 →
#                                   v3.6.4), /usr/local/bin/etcd (the aggregator test's sidecar)
#       The Debian roots come from Debian's archive; busybox from its release tarball (sha256-pinned). Cached as $KEELSON_LOCAL_CACHE/images/conformance-KEY (KEY: the versions, agnhost's
#       sha256, the Debian root's recipe, this block).
#   tests/kubernetes/images.sh conformance-repo-list REGISTRY FILE           # e.g. ... 10.80.0.1:5000 repo-list.yaml
#       Writes FILE, the registry list for the suite's KUBE_TEST_REPO_LIST: every registry of the suite's
#       manifest moved into REGISTRY (promoterE2eRegistry → REGISTRY/e2e-test-images, gcRegistry → REGISTRY,
#       …), except invalidRegistry and the two authenticated ones, which tests expect to fail; prints FILE.

# Upstream busybox, the release the suite's busybox image tag names (1.37.0-1 → 1.37.0), built static
# with its defconfig (tc off: it does not build against current kernel headers) from the release
# tarball, verified by its sha256 (Debian's pool serves it as the package's orig tarball). Not
# Debian's busybox-static: its ash drops environment names that are not shell names (`data-1`),
# which upstream's keeps and the envFrom tests read back. ARGS: the manifest's spec line, a work
# directory, where to put the binary.
BUSYBOX_SOURCES=(
  "1.37.0 3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4"
)
build_busybox() {
  local tag version want="" line v sum
  read -r _ _ tag <<<"$1"
  version=${tag%-*}
  for line in "${BUSYBOX_SOURCES[@]}"; do
    read -r v sum <<<"$line"
    [ "$v" = "$version" ] && want=$sum
  done
  [ -n "$want" ] || die "no pinned busybox source for the suite's busybox $tag (pin its release tarball's sha256 in BUSYBOX_SOURCES)"
  mkdir -p "$2"
  local tarball="$2/busybox_$version.orig.tar.bz2"
  log "busybox: building $version from source"
  curl -fsSL --retry 3 -o "$tarball" "http://deb.debian.org/debian/pool/main/b/busybox/busybox_$version.orig.tar.bz2" ||
    die "downloading busybox $version's source failed"
  [ "$(sha256sum <"$tarball" | cut -d' ' -f1)" = "$want" ] || die "busybox $version's source does not have the pinned sha256 $want"
  tar -xjf "$tarball" -C "$2" || die "unpacking busybox $version failed"
  (cd "$2/busybox-$version" && make defconfig >/dev/null &&
    sed -i 's/^# CONFIG_STATIC is not set/CONFIG_STATIC=y/; s/^CONFIG_TC=y/# CONFIG_TC is not set/' .config &&
    make -j"$(nproc)" >build.log 2>&1) || die "building busybox $version failed: $(tail -5 "$2/busybox-$version/build.log" 2>/dev/null)"
  install -m 755 "$2/busybox-$version/busybox" "$3"
}
CONFORMANCE_DEBIAN_EXTRA=bind9-dnsutils,curl,netcat-openbsd,procps,bash
# The manifest's (test/utils/image/manifest.go) registry keys and where each lives in the local registry.
CONFORMANCE_REGISTRIES=(
  "promoterE2eRegistry e2e-test-images"
  "gcRegistry ."
  "gcEtcdRegistry ."
  "buildImageRegistry build-image"
  "sigStorageRegistry sig-storage"
  "dockerLibraryRegistry library"
  "cloudProviderGcpRegistry cloud-provider-gcp"
)
# The images built: manifest ImageID and the recipe below.
CONFORMANCE_IMAGES=(Agnhost JessieDnsutils BusyBox Httpd HttpdNew Nginx NginxNew Pause Kitten Nautilus Nonewprivs APIServer Etcd)

# conformance_manifest MANIFEST_GO ID: prints "REGISTRY_KEY NAME TAG" of ImageID ID.
conformance_manifest() {
  local line
  line=$(sed -n "s/^[[:space:]]*configs\[$2\] = Config{list\.\([A-Za-z0-9]*\), \"\([^\"]*\)\", \"\([^\"]*\)\"}.*/\1 \2 \3/p" "$1")
  [ -n "$line" ] || die "$1 has no configs[$2] = Config{list.…, \"NAME\", \"TAG\"} line"
  echo "${line,}" # the Go field name, as the YAML key (PromoterE2eRegistry → promoterE2eRegistry)
}

# conformance_prefix KEY: KEY's path in the local registry ("" for the root).
conformance_prefix() {
  local entry
  for entry in "${CONFORMANCE_REGISTRIES[@]}"; do
    if [ "${entry%% *}" = "$1" ]; then
      [ "${entry#* }" = . ] && echo "" || echo "${entry#* }/"
      return
    fi
  done
  die "no local place for the suite's registry $1 (CONFORMANCE_REGISTRIES)"
}

# conformance_image REF USER ENTRYPOINT CMD LAYER...: ENTRYPOINT and CMD are space-separated words ("" for none).
conformance_image() {
  local ref=$1 user=$2 entrypoint=$3 cmd=$4 layer word
  shift 4
  log "assembling $ref"
  umoci new --image "$layout:$ref"
  for layer in "$@"; do
    umoci raw add-layer --image "$layout:$ref" --history.created "$CREATED" \
      --history.created_by "keelson images.sh: $layer" "$layers/$layer.tar"
  done
  local -a opts=(--config.env "$IMAGE_PATH_ENV" --config.workingdir /)
  [ -z "$user" ] || opts+=(--config.user "$user")
  for word in $entrypoint; do opts+=(--config.entrypoint "$word"); done
  for word in $cmd; do opts+=(--config.cmd "$word"); done
  umoci config --image "$layout:$ref" --no-history --created "$CREATED" --architecture "$arch" --os linux \
    --author keelson "${opts[@]}"
}

cmd_conformance_images() {
  if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage; fi
  local k8s=${1#v} registry=${2:-} e2e_bin manifest base_root key out tmp stage layers start id
  [[ $k8s =~ ^1\.[0-9]+\.[0-9]+$ ]] || die "'$1' is not a Kubernetes version (1.MINOR.PATCH)"
  WHY="build the conformance images" need go umoci jq tar flock find apt-get dpkg-deb
  arch=$(go env GOARCH)
  manifest=$(cd / && go mod download -json "k8s.io/kubernetes@v$k8s" | jq -r '.Dir // empty')/test/utils/image/manifest.go
  [ -f "$manifest" ] || die "the kubernetes module v$k8s has no test/utils/image/manifest.go"
  local -A spec=()
  for id in "${CONFORMANCE_IMAGES[@]}"; do spec[$id]=$(conformance_manifest "$manifest" "$id"); done
  base_root=$(DEBIAN_PACKAGES="$DEBIAN_PACKAGES,$CONFORMANCE_DEBIAN_EXTRA" ensure_debian_base)
  e2e_bin=$("$here/build-e2e.sh" "$k8s" | tail -n1) || die "building the e2e suite of v$k8s (tests/kubernetes/build-e2e.sh) failed"
  [ -x "$e2e_bin/agnhost" ] || die "tests/kubernetes/build-e2e.sh printed '$e2e_bin', which has no agnhost"
  local etcd_version sample_version etcd_bin
  read -r _ _ etcd_version <<<"${spec[Etcd]}"
  etcd_version=${etcd_version%-*} # 3.6.4-0 → 3.6.4
  etcd_bin=$(ensure_etcd "$etcd_version")
  sample_version=v0.${k8s#1.} # the staging modules' tag of Kubernetes 1.MINOR.PATCH
  key=$({ echo "conformance $k8s $arch $sample_version"; for id in "${CONFORMANCE_IMAGES[@]}"; do echo "$id ${spec[$id]}"; done
    sha256sum <"$etcd_bin/etcd"
    sha256sum <"$e2e_bin/agnhost"; echo "$base_root"
    sed -n '/^# --- BEGIN conformance images/,/^# --- END conformance images/p' "$self"
    declare -f claim_cache_entry stage_static_base finish_layout build_go_program; } | sha256sum | cut -c1-16)
  if claim_cache_entry conformance "$key"; then
    layout="$tmp/oci"
    layers="$tmp/work/layers"
    stage="$tmp/work/stage"
    mkdir -p "$layers" "$stage/agnhost/uploads" "$stage/busybox/bin" "$stage/pause" "$tmp/work/deb"
    log "conformance images of Kubernetes v$k8s: ${CONFORMANCE_IMAGES[*]}"

    stage_static_base "$stage/static-base"
    owned_layer_tar "$stage/static-base" "$layers/static-base.tar"
    install -m 755 "$e2e_bin/agnhost" "$stage/agnhost/agnhost"
    ln -s agnhost "$stage/agnhost/agnhost-2"
    # porter's TLS pair at / (upstream's Dockerfile adds it there; porter serves its https ports with it).
    install -m 644 "${manifest%/utils/image/manifest.go}/images/agnhost/porter/localhost.crt" \
      "${manifest%/utils/image/manifest.go}/images/agnhost/porter/localhost.key" "$stage/agnhost/" ||
      die "the kubernetes module has no test/images/agnhost/porter/localhost.{crt,key}"
    owned_layer_tar "$stage/agnhost" "$layers/agnhost.tar"
    layer_tar "$base_root" "$layers/debian-conformance.tar"

    build_busybox "${spec[BusyBox]}" "$tmp/work/busybox" "$stage/busybox/bin/busybox"
    local applet
    for applet in $("$stage/busybox/bin/busybox" --list); do
      [ "$applet" = busybox ] || ln -s busybox "$stage/busybox/bin/$applet"
    done
    if ! [ -L "$stage/busybox/bin/sh" ] || ! [ -L "$stage/busybox/bin/httpd" ]; then die "busybox has no sh or httpd applet"; fi
    # What the suite reads from the shell, checked here: a name that is not a shell name reaches
    # `sh -c env` (the envFrom tests), and ash's own error text (the read-only root test).
    [ "$(env -i 'data-1=ok' '#@!data-1=ok' PATH="$stage/busybox/bin" "$stage/busybox/bin/sh" -c env | grep -c 'data-1=ok$')" = 2 ] ||
      die "the busybox image's sh drops environment names like data-1"
    [ "$(PATH="$stage/busybox/bin" "$stage/busybox/bin/sh" -c 'echo x >/proc/nonexistent/file' 2>&1)" = "$stage/busybox/bin/sh: can't create /proc/nonexistent/file: nonexistent directory" ] ||
      die "the busybox image's sh does not speak ash's error messages"
    owned_layer_tar "$stage/busybox" "$layers/busybox.tar"
    mkdir -p "$stage/httpd/usr/local/apache2/htdocs" "$stage/nginx/usr/share/nginx/html"
    echo '<html><body><h1>It works!</h1></body></html>' >"$stage/httpd/usr/local/apache2/htdocs/index.html"
    echo '<html><body><h1>Welcome to nginx!</h1></body></html>' >"$stage/nginx/usr/share/nginx/html/index.html"
    owned_layer_tar "$stage/httpd" "$layers/httpd.tar"
    owned_layer_tar "$stage/nginx" "$layers/nginx.tar"

    local pause_tag
    read -r _ _ pause_tag <<<"${spec[Pause]}"
    build_go_program pause "$stage/pause/pause" "-X main.version=$pause_tag"
    owned_layer_tar "$stage/pause" "$layers/pause.tar"

    local images_src=${manifest%/utils/image/manifest.go}/images pic
    for pic in kitten nautilus; do
      mkdir -p "$stage/$pic"
      install -m 644 "$images_src/$pic/html/$pic.jpg" "$images_src/$pic/html/data.json" "$stage/$pic/" ||
        die "the kubernetes module has no test/images/$pic/html/{$pic.jpg,data.json}"
      owned_layer_tar "$stage/$pic" "$layers/$pic.tar"
    done
    log "nonewprivs: building k8s.io/kubernetes/test/images/nonewprivs"
    mkdir -p "$stage/nonewprivs/usr/local/bin"
    (cd "$e2e_bin/../module" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$stage/nonewprivs/usr/local/bin/nnp" \
      k8s.io/kubernetes/test/images/nonewprivs) >&2 || die "building nonewprivs (in $e2e_bin/../module) failed"
    chmod 4755 "$stage/nonewprivs/usr/local/bin/nnp"
    owned_layer_tar "$stage/nonewprivs" "$layers/nonewprivs.tar"
    log "sample-apiserver: go install k8s.io/sample-apiserver@$sample_version"
    mkdir -p "$stage/sample-apiserver"
    (cd / && CGO_ENABLED=0 GOBIN="$tmp/work/gobin" GOFLAGS=-trimpath go install -ldflags "-s -w" "k8s.io/sample-apiserver@$sample_version") >&2 ||
      die "building k8s.io/sample-apiserver@$sample_version failed (does the Go module proxy serve it?)"
    install -m 755 "$tmp/work/gobin/sample-apiserver" "$stage/sample-apiserver/sample-apiserver"
    owned_layer_tar "$stage/sample-apiserver" "$layers/sample-apiserver.tar"
    mkdir -p "$stage/etcd/usr/local/bin"
    install -m 755 "$etcd_bin/etcd" "$stage/etcd/usr/local/bin/etcd"
    owned_layer_tar "$stage/etcd" "$layers/etcd.tar"

    umoci init --layout "$layout"
    local ref rkey name tag
    for id in "${CONFORMANCE_IMAGES[@]}"; do
      read -r rkey name tag <<<"${spec[$id]}"
      ref="$(conformance_prefix "$rkey")$name:$tag"
      case $id in
        Agnhost) conformance_image "$ref" "" /agnhost pause debian-conformance agnhost ;;
        JessieDnsutils) conformance_image "$ref" "" "" /bin/sh debian-conformance ;;
        BusyBox) conformance_image "$ref" "" "" sh static-base busybox ;;
        Httpd | HttpdNew) conformance_image "$ref" "" "" "/bin/httpd -f -p 80 -h /usr/local/apache2/htdocs" static-base busybox httpd ;;
        Nginx | NginxNew) conformance_image "$ref" "" "" "/bin/httpd -f -p 80 -h /usr/share/nginx/html" static-base busybox nginx ;;
        Pause) conformance_image "$ref" 65535:65535 /pause "" pause ;;
        Kitten) conformance_image "$ref" "" /agnhost test-webserver debian-conformance agnhost kitten ;;
        Nautilus) conformance_image "$ref" "" /agnhost test-webserver debian-conformance agnhost nautilus ;;
        Nonewprivs) conformance_image "$ref" "" "" nnp static-base nonewprivs ;;
        APIServer) conformance_image "$ref" "" /sample-apiserver "" static-base sample-apiserver ;;
        Etcd) conformance_image "$ref" "" "" "/usr/local/bin/etcd" static-base etcd ;;
        *) die "no recipe for the conformance image $id" ;;
      esac
    done
    finish_layout "$tmp" "$out" "conformance images" "$start" >/dev/null
  fi
  [ -z "$registry" ] || cmd_push "$out/oci" "$registry"
  echo "$out/oci"
}

cmd_conformance_repo_list() {
  [ $# -eq 2 ] || usage
  local registry=${1%/} file=$2 entry prefix
  [[ $registry =~ ^[^/[:space:]]+(/[^[:space:]]+)?$ ]] || die "'$1' is not a registry address (HOST[:PORT][/NAMESPACE])"
  {
    echo "# KUBE_TEST_REPO_LIST for the e2e suite: its images from the local registry (tests/kubernetes/images.sh)"
    for entry in "${CONFORMANCE_REGISTRIES[@]}"; do
      prefix=${entry#* }
      [ "$prefix" = . ] && prefix="" || prefix="/$prefix"
      echo "${entry%% *}: $registry$prefix"
    done
  } >"$file.tmp"
  mv "$file.tmp" "$file"
  echo "$file"
}

if [ "${1:-}" = conformance-images ]; then
  shift
  cmd_conformance_images "$@"
  exit 0
fi
if [ "${1:-}" = conformance-repo-list ]; then
  shift
  cmd_conformance_repo_list "$@"
  exit 0
fi
# --- END conformance images --------------------------------------------------------------------------------

# --- BEGIN other architectures (a mixed-architecture cluster's workers) -----------------------------------
#   GOARCH=arm64 tests/kubernetes/images.sh build-node K8S_VERSION PAUSE_VERSION   # e.g. build-node 1.34.4 3.10.1
#       Prints an OCI layout holding what a worker of $GOARCH pulls from the registry, made as `build` makes
#       them but for that architecture: kube-proxy:vK8S (Kubernetes from `GOARCH=… build.sh`), pause:PAUSE
#       and keelson-test/echo:1. Cached as $KEELSON_LOCAL_CACHE/images/node-ARCH-KEY. Programs of another
#       architecture run here through qemu-user's binfmt_misc entry — except kube-proxy's Debian root,
#       which is this host's: qemu-user has no nftables/netfilter netlink, so $GOARCH's iptables, nft and
#       conntrack cannot program the kernel; the host's run natively beside the $GOARCH kube-proxy (and
#       go-runner) that exec them. The only harness-made difference from a real $GOARCH image.
#   tests/kubernetes/images.sh index LAYOUT LAYOUT...
#       Prints an OCI layout in which every tag that the first LAYOUT and a later one both hold is an
#       image index with one image per platform (each image config's os/architecture), as registries
#       serve multi-platform images to a mixed-architecture cluster. Push it after the first LAYOUT
#       (`push` copies every platform). Cached as images/index-KEY (KEY: the layouts' index.json).
cmd_build_node() {
  [ $# -eq 2 ] || usage
  local k8s=${1#v} pause=${2#v} k8s_bin key base_root name
  [[ $k8s =~ ^1\.[0-9]+\.[0-9]+$ ]] || die "'$1' is not a Kubernetes version (1.MINOR.PATCH)"
  [[ $pause =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]] || die "'$2' is not a pause version (e.g. 3.10.1)"
  arch=$(go env GOARCH)
  k8s_bin=$("$here/build.sh" "$k8s" | tail -n1) || die "building Kubernetes v$k8s for $arch (GOARCH=$arch tests/kubernetes/build.sh) failed"
  [ -x "$k8s_bin/kube-proxy" ] || die "$k8s_bin has no kube-proxy"
  key=$({
    echo "node $arch $k8s $pause"
    (cd "$k8s_bin" && sha256sum kube-proxy)
    sha256sum <"$self"
    (cd "$src" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -c1-16)
  if ! claim_cache_entry "node-$arch" "$key"; then echo "$out/oci"; return; fi
  WHY="build the $arch node images" need go umoci jq tar flock find
  layout="$tmp/oci"
  layers="$tmp/work/layers"
  local stage="$tmp/work/stage"
  mkdir -p "$layers" "$stage"
  log "building the $arch node images (kube-proxy v$k8s, pause $pause, echo) into $out"
  # The host's Debian root (see the usage above): iptables must run natively to reach the kernel.
  base_root=$(arch=$(go env GOHOSTARCH) && ensure_debian_base)
  stage_static_base "$stage/static-base"
  owned_layer_tar "$stage/static-base" "$layers/static-base.tar"
  mkdir -p "$stage/go-runner" "$stage/pause" "$stage/echo" "$stage/kube-proxy/usr/local/bin"
  build_go_program go-runner "$stage/go-runner/go-runner"
  build_go_program pause "$stage/pause/pause" "-X main.version=$pause"
  build_go_program echo "$stage/echo/echo"
  install -m 755 "$k8s_bin/kube-proxy" "$stage/kube-proxy/usr/local/bin/kube-proxy"
  for name in go-runner pause echo kube-proxy; do owned_layer_tar "$stage/$name" "$layers/$name.tar"; done
  layer_tar "$base_root" "$layers/debian-$DEBIAN_SUITE.tar"
  umoci init --layout "$layout"
  image "kube-proxy:v$k8s" /go-runner "" "debian-$DEBIAN_SUITE" go-runner kube-proxy
  image "pause:$pause" /pause 65535:65535 pause
  image "keelson-test/echo:1" /echo 65534:65534 static-base echo
  finish_layout "$tmp" "$out" "the $arch node images" "$start"
}

# blob_of LAYOUT DIGEST: the path of a blob.
blob_of() { echo "$1/blobs/${2%%:*}/${2#*:}"; }

cmd_index() {
  [ $# -ge 2 ] || usage
  local l key ref first=${1%/}
  for l in "$@"; do [ -f "${l%/}/index.json" ] || die "'$l' is not an OCI image layout"; done
  WHY="make multi-platform image indexes" need jq sha256sum flock
  key=$({ sha256sum <"$self"; for l in "$@"; do sha256sum <"${l%/}/index.json"; done; } | sha256sum | cut -c1-16)
  if ! claim_cache_entry index "$key"; then echo "$out/oci"; return; fi
  local layout="$tmp/oci"
  mkdir -p "$layout/blobs/sha256"
  printf '{"imageLayoutVersion":"1.0.0"}\n' >"$layout/oci-layout"
  # Every blob of every layout (hard links: the layouts are in the same cache).
  for l in "$@"; do
    cp -al -n "${l%/}/blobs/sha256/." "$layout/blobs/sha256/" 2>/dev/null || cp -rn "${l%/}/blobs/sha256/." "$layout/blobs/sha256/" ||
      die "copying the blobs of $l failed"
  done
  local -a refs tagged=()
  mapfile -t refs < <(for l in "${@:2}"; do jq -r '.manifests[].annotations["org.opencontainers.image.ref.name"] // empty' "${l%/}/index.json"; done | LC_ALL=C sort -u)
  for ref in "${refs[@]}"; do
    local -a platforms=()
    local desc config arch os manifests="[]"
    for l in "$@"; do
      l=${l%/}
      desc=$(jq -c --arg r "$ref" '[.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $r)][0] // empty' "$l/index.json")
      [ -n "$desc" ] || continue
      [ "$(jq -r .mediaType <<<"$desc")" = application/vnd.oci.image.manifest.v1+json ] || die "$l: $ref is not a single image (an index already?)"
      config=$(jq -r .config.digest "$(blob_of "$l" "$(jq -r .digest <<<"$desc")")")
      arch=$(jq -r .architecture "$(blob_of "$l" "$config")")
      os=$(jq -r .os "$(blob_of "$l" "$config")")
      case " ${platforms[*]} " in *" $os/$arch "*) die "$ref: two images for $os/$arch (in $l and an earlier layout)" ;; esac
      platforms+=("$os/$arch")
      manifests=$(jq -c --argjson d "$desc" --arg a "$arch" --arg o "$os" \
        '. + [{mediaType: $d.mediaType, digest: $d.digest, size: $d.size, platform: {architecture: $a, os: $o}}]' <<<"$manifests")
    done
    # Only tags of the first layout that another one holds too become indexes.
    [ "$(jq length <<<"$manifests")" -ge 2 ] || continue
    jq -e --arg r "$ref" 'any(.manifests[]; .annotations["org.opencontainers.image.ref.name"] == $r)' "$first/index.json" >/dev/null || continue
    local index digest size
    index=$(jq -cn --argjson m "$manifests" '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json", manifests: $m}')
    digest=$(printf '%s' "$index" | sha256sum | cut -d' ' -f1)
    printf '%s' "$index" >"$layout/blobs/sha256/$digest"
    size=$(stat -c %s "$layout/blobs/sha256/$digest")
    tagged+=("$(jq -cn --arg d "sha256:$digest" --argjson s "$size" --arg r "$ref" \
      '{mediaType: "application/vnd.oci.image.index.v1+json", digest: $d, size: $s, annotations: {"org.opencontainers.image.ref.name": $r}}')")
    log "index $ref: $(jq -r '[.[].platform | .os + "/" + .architecture] | join(", ")' <<<"$manifests")"
  done
  [ "${#tagged[@]}" -gt 0 ] || die "no tag is held by the first layout and a later one: nothing to index"
  printf '%s\n' "${tagged[@]}" | jq -s '{schemaVersion: 2, manifests: .}' >"$layout/index.json"
  echo "indexes of ${#tagged[@]} tags" >"$tmp/build-info"
  touch "$tmp/.complete"
  rm -rf "$out"
  mv "$tmp" "$out"
  trap - EXIT
  echo "$out/oci"
}

if [ "${1:-}" = build-node ]; then
  shift
  cmd_build_node "$@"
  exit 0
fi
if [ "${1:-}" = index ]; then
  shift
  cmd_index "$@"
  exit 0
fi
# --- END other architectures -------------------------------------------------------------------------------

case ${1:-} in
  build) shift; cmd_build "$@" ;;
  etcd) shift; [ $# -eq 1 ] || usage; arch=$(go env GOARCH); ensure_etcd "${1#v}" ;;
  push) shift; cmd_push "$@" ;;
  *) usage ;;
esac
