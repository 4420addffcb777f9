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
#
# Two harness patches, for another architecture only (its binaries run here under qemu-user): containerd
# asks the kernel whether it filters system calls with prctl(PR_SET_SECCOMP), which qemu-user answers
# EINVAL for every guest (it keeps seccomp from its guests), so containerd decides the kernel has no
# seccomp and refuses every pod sandbox, which the kubelet always asks to run under RuntimeDefault
# ("seccomp is not supported"). The patched check asks the same kernel through a file qemu passes
# through, /proc/sys/kernel/seccomp/actions_avail (present when the kernel has CONFIG_SECCOMP_FILTER);
# the profile is applied by the machine's runc, which runs natively. Test: tests/tests/arm64.rs (a
# pod on the arm64 node: its sandbox fails without the patch).
#
# And one substitution, for the same reason: the archive's containerd-shim-runc-v2 is this host's
# build. The shim makes itself its containers' child subreaper (prctl PR_SET_CHILD_SUBREAPER, so it
# reaps them and reports their exits), which qemu-user refuses ("invalid argument"): every sandbox
# fails to start. Natively, like the machine's runc, it works; containerd and the kubelet stay the
# other architecture's, emulated.
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
host_arch=$(env -u GOARCH go env GOARCH)
foreign=false
# Another architecture's build carries the patches below: keyed by this script, so a changed patch
# is a new build.
[ "$arch" = "$host_arch" ] || { foreign=true; out="$out-linux-$arch-qemu-$(sha256sum <"${BASH_SOURCE[0]}" | cut -c1-12)"; }
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
if $foreign; then
  # The patch above: a copy of the module with the seccomp check replaced, used through `replace`.
  go mod download -json "$m@v$version" > download.json
  src=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' download.json)
  [ -d "$src" ] || { echo "build-containerd.sh: no module directory for $m@v$version" >&2; exit 1; }
  cp -r "$src" containerd-src
  chmod -R u+w containerd-src
  f=containerd-src/pkg/seccomp/seccomp_linux.go
  grep -q 'enabled = unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, 0, 0, 0) != unix.EINVAL' "$f" ||
    { echo "build-containerd.sh: $f no longer has the check the qemu-user patch replaces; look at it again" >&2; exit 1; }
  sed -i -e 's|enabled = unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, 0, 0, 0) != unix.EINVAL|_, err := os.Stat("/proc/sys/kernel/seccomp/actions_avail"); enabled = err == nil|' \
    -e 's|^\t"golang.org/x/sys/unix"$|\t"os"|' "$f"
  # The default seccomp profile lists the system calls of containerd's own architecture; the
  # containers' programs are run by qemu-user, a program of this host's, whose calls a profile for
  # the other architecture alone kills (the pause process exits 127 at once). So the profile also
  # names this host's architectures and the calls only they have, as Docker's profile does for the
  # qemu-user containers it runs.
  [ "$host_arch" = amd64 ] || { echo "build-containerd.sh: the qemu-user seccomp patch knows amd64 hosts only (this one: $host_arch)" >&2; exit 1; }
  f=containerd-src/contrib/seccomp/seccomp_default.go
  grep -q '^		Architectures: arches(),$' "$f" && grep -q '^	// include by kernel version$' "$f" ||
    { echo "build-containerd.sh: $f no longer has the lines the qemu-user patch extends; look at it again" >&2; exit 1; }
  sed -i -e 's|^		Architectures: arches(),$|		Architectures: append(arches(), specs.ArchX86_64, specs.ArchX86, specs.ArchX32),|' \
    -e 's|^	// include by kernel version$|	s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{Names: []string{"arch_prctl", "modify_ldt"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{}})\n&|' "$f"
  printf 'replace %s => ./containerd-src\n' "$m" >> go.mod
fi
go mod tidy -e >/dev/null 2>tidy.log || { cat tidy.log >&2; exit 1; }
ldflags="-s -w -X $m/version.Version=v$version -X $m/version.Revision=keelson-local -X $m/version.Package=$m"
tags="no_btrfs no_devmapper no_zfs no_aufs"
if $foreign; then
  # The second harness difference (see above): the shim is this host's build.
  go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$out/bin/" "$m/cmd/containerd" "$m/cmd/ctr"
  GOARCH=$host_arch go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$out/bin/" "$m/cmd/containerd-shim-runc-v2"
else
  go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$out/bin/" "$m/cmd/containerd" "$m/cmd/containerd-shim-runc-v2" "$m/cmd/ctr"
fi
"$out/bin/containerd" --version >&2
# Deterministic archive: fixed owner, mode and time.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$out" -cf - bin | gzip -n > "$archive.tmp"
mv "$archive.tmp" "$archive"
echo "built containerd v$version in $(( $(date +%s) - start )) s" > "$out/build-info"
touch "$out/.complete"
echo "$archive"
