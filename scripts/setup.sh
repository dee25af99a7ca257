#!/usr/bin/env bash
# Installs everything Warren's build, run and tests need on a Debian/Ubuntu
# machine, as root. Idempotent: does nothing that is already done.
set -euo pipefail

GO_VERSION=1.26.8
# mmdebstrap and debian-archive-keyring: `warren image build-base` (Debian's
# keys, which Ubuntu's apt does not trust by itself).
# (The cgroup v2 test lane, scripts/v2vm.sh, installs QEMU and what else it
# needs itself, so that `make run` does not.)
# python3-pip: pip in the python language view of the host image (what the
# language names run on by default, like microsandbox's python image).
# slirp4netns: the user-space network stack the data path benchmark weighs
# (docs/network.md).
APT_PACKAGES=(ca-certificates curl unzip git make gcc libc6-dev python3 python3-pip nodejs iproute2 procps util-linux bubblewrap crun mmdebstrap debian-archive-keyring slirp4netns btrfs-progs python3-mypy python3-pyflakes)
# python3-mypy, python3-pyflakes: the Python SDK's type checking and its
# linter (it builds with its own backend: standard library only).
# btrfs-progs: mkfs.btrfs makes the image disk limits live on (--disk-pool).
# bubblewrap, crun, runc and podman: the runtimes `warren bench --compare`
# (and make bench) measure Warren against; runsc is built by `make runsc`.
APT_PACKAGES+=(runc podman)
# npm: in the node language view of the host image, and the MCP test drives
# /mcp with the official npm client. NodeSource's nodejs ships npm (and
# conflicts with Debian's npm package); Debian's nodejs does not.
command -v npm >/dev/null 2>&1 || APT_PACKAGES+=(npm)

log() { printf 'setup: %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  log "run as root (apt-get and the sandbox runtime need it)"
  exit 1
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Go: Debian's is too old. The toolchain is published as a module on the Go
# module proxy, which is reachable wherever `go mod download` works.
GO_ROOT=${GO_ROOT:-/usr/local/go}
have_go() {
  local v
  v=$("$GO_ROOT/bin/go" env GOVERSION 2>/dev/null) || return 1
  [ "$(printf '%s\n%s\n' "go${GO_VERSION}" "$v" | sort -V | head -1)" = "go${GO_VERSION}" ]
}
if ! have_go; then
  arch=$(dpkg --print-architecture)
  proxy=${GOPROXY:-https://proxy.golang.org}
  proxy=${proxy%%,*}
  case "$proxy" in direct|off) proxy=https://proxy.golang.org ;; esac
  url="$proxy/golang.org/toolchain/@v/v0.0.1-go${GO_VERSION}.linux-${arch}.zip"
  log "installing Go ${GO_VERSION} into ${GO_ROOT} from the module proxy"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  curl -fsSL --retry 3 -o "$tmp/go.zip" "$url"
  unzip -q "$tmp/go.zip" -d "$tmp"
  rm -rf "$GO_ROOT"
  mkdir -p "$(dirname "$GO_ROOT")"
  mv "$tmp/golang.org/toolchain@v0.0.1-go${GO_VERSION}.linux-${arch}" "$GO_ROOT"
  # Module zips carry no modes: restore the executables.
  chmod -R a+rX "$GO_ROOT"
  find "$GO_ROOT/bin" "$GO_ROOT/pkg/tool" -type f -exec chmod 755 {} +
  have_go || { log "Go install into $GO_ROOT failed"; exit 1; }
fi
export PATH=$GO_ROOT/bin:$PATH

cd "$(dirname "$0")/.."
go mod download
log "ready: $(go version)"
