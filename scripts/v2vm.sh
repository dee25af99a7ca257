#!/usr/bin/env bash
# Runs Warren's privileged tests inside a QEMU virtual machine whose kernel
# has a pure cgroup v2 hierarchy (cgroup2 alone at /sys/fs/cgroup, every
# controller on it): the cgroup v2 limit code the hybrid build machine never
# exercises. QEMU runs with TCG (software emulation): this machine's /dev/kvm
# cannot run stock guest kernels.
#
#   scripts/v2vm.sh [options] [LANE...]      LANEs: cgroup spawner native (default: all)
#
#   --src DIR       tree to build the test binaries from (default: this repo);
#                   the native and spawner lanes use DIR/bin/warren-{agent,spawner}
#                   and run `make -C DIR build` when they are missing
#   --run REGEX     only the tests matching REGEX (go test -run), in every lane
#   --timeout SECS  hard limit on the VM's whole run (default: the lanes' sum + 180)
#   --kernel PKG    Debian kernel package, e.g. linux-image-6.1.0-56-amd64
#                   (default: V2VM_KERNEL, else what linux-image-amd64 depends on)
#   --exec CMD      also run CMD (sh -c, in DIR, as root) in the guest, as lane "exec"
#                   (e.g. --exec 'cat /sys/fs/cgroup/cgroup.controllers'); with no
#                   LANE given, only that
#   --keep          keep the job directory (console log, binaries)
#   -q              do not stream the console; print only the summary
#
# What it does: installs qemu-system-x86 and cpio when missing; downloads the
# kernel package with `apt-get download` (never installing it) and keeps its
# vmlinuz and the few modules the guest needs in $V2VM_CACHE
# (/var/cache/warren-v2vm); builds an initramfs with a small static Go init
# (scripts/v2vm/init) and those modules; builds each lane's test binary
# (go test -c, CGO_ENABLED=0); boots the VM with the host's / shared read-only
# over virtio-9p (so the guest has /usr, python3, /bin/sh), the job directory
# read-write and the source tree read-only at its host path; runs the lanes
# with WARREN_TEST_PRIVILEGED=1 and -test.v; parses the console and exits 1
# if a test failed or skipped, a lane did not exit 0 or the VM did not finish.
# QEMU never outlives the script.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Everything runs from main, which bash reads whole before it starts: an edit
# of this file while a run is under way cannot derail that run.
main() {

repo=$(cd "$here/.." && pwd)
export PATH=/usr/local/go/bin:$PATH
export GOFLAGS=${GOFLAGS:--buildvcs=false}

log() { printf 'v2vm: %s\n' "$*" >&2; }
die() { log "$*"; exit 2; }

src=$repo run_re="" total_timeout="" kernel_pkg=${V2VM_KERNEL:-} keep=0 quiet=0 exec_cmd=""
lanes=()
while [ $# -gt 0 ]; do
  case "$1" in
    --src) src=$(cd "$2" && pwd); shift 2 ;;
    --run) run_re=$2; shift 2 ;;
    --timeout) total_timeout=$2; shift 2 ;;
    --kernel) kernel_pkg=$2; shift 2 ;;
    --exec) exec_cmd=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -q) quiet=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) lanes+=("$1"); shift ;;
  esac
done
if [ ${#lanes[@]} -eq 0 ] && [ -z "$exec_cmd" ]; then lanes=(cgroup spawner native); fi

# Lanes: package, per-lane timeout (seconds, under TCG), needs the agent and spawner.
declare -A lane_pkg=([cgroup]=./internal/cgroup [spawner]=./internal/spawner [native]=./internal/backend/native)
declare -A lane_timeout=([cgroup]=600 [spawner]=600 [native]=1800)
declare -A lane_bins=([cgroup]=0 [spawner]=1 [native]=1)
for l in "${lanes[@]}"; do
  [ -n "${lane_pkg[$l]:-}" ] || die "unknown lane $l (known: ${!lane_pkg[*]})"
done
[ -z "$exec_cmd" ] || case "$exec_cmd" in *$'\n'*) die "--exec takes one line" ;; esac

[ "$(id -u)" -eq 0 ] || die "run as root (apt-get, and the guest's tests need a root-owned job directory)"

# --- host tools -------------------------------------------------------------
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v cpio >/dev/null || need+=(cpio)
command -v xz >/dev/null || need+=(xz-utils) # newer kernels' modules are .ko.xz
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v go >/dev/null || die "no Go toolchain (run scripts/setup.sh)"

# --- kernel -----------------------------------------------------------------
# The guest kernel is Debian's current bookworm kernel: the package the
# linux-image-amd64 metapackage depends on (e.g. linux-image-6.1.0-56-amd64),
# or the one named by --kernel / V2VM_KERNEL. The version is printed and
# kept in the cache's directory name; set V2VM_KERNEL to pin it.
cache=${V2VM_CACHE:-/var/cache/warren-v2vm}
resolve_kernel() {
  apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}
if [ -z "$kernel_pkg" ]; then
  kernel_pkg=$(resolve_kernel)
  if [ -z "$kernel_pkg" ]; then
    apt-get update -qq
    kernel_pkg=$(resolve_kernel)
  fi
  [ -n "$kernel_pkg" ] || die "cannot resolve linux-image-amd64's kernel package (apt-cache depends linux-image-amd64)"
fi
# Modules the guest loads, with their dependencies: 9p for the shared
# directories, virtio-pci under it, overlay for the sandboxes' roots, veth
# and the nftables expressions of the sandbox network (internal/netplumb;
# crc32c_generic is what libcrc32c asks the crypto API for, not a "depends"),
# loop and btrfs for disk limits (internal/diskquota's image; btrfs checksums
# with crc32c too).
want_modules=(virtio_pci 9pnet_virtio 9p overlay veth crc32c_generic nf_tables nft_chain_nat nft_redir
  nft_reject_inet nft_ct nft_fib_inet nft_connlimit nft_socket nft_limit nft_log nfnetlink_log loop btrfs)

# The cache is per kernel package and module list.
kdir=$cache/$kernel_pkg-$(printf '%s\n' "${want_modules[@]}" | sha256sum | cut -c1-8)
if [ ! -f "$kdir/ready" ]; then
  log "fetching $kernel_pkg into $kdir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download "$kernel_pkg" >/dev/null 2>&1) || {
    apt-get update -qq
    (cd "$tmp" && apt-get download "$kernel_pkg" >/dev/null)
  }
  dpkg-deb -x "$tmp"/"$kernel_pkg"_*.deb "$tmp/x"
  kver=$(ls "$tmp/x/lib/modules")
  rm -rf "$kdir"
  mkdir -p "$kdir/modules"
  cp "$tmp/x/boot/vmlinuz-$kver" "$kdir/vmlinuz"
  cp "$tmp/x/boot/config-$kver" "$kdir/config"
  dpkg-deb -f "$tmp"/"$kernel_pkg"_*.deb Version >"$kdir/version"
  # Resolve dependencies from each module's modinfo "depends=" (the package
  # ships no modules.dep): dependencies first.
  # Newer Debian kernels ship modules compressed (.ko.xz, .ko.zst): they are
  # kept decompressed, which every kernel loads.
  declare -A kopath=() seen=()
  while IFS= read -r p; do
    n=${p##*/}; n=${n%%.ko*}; kopath[${n//-/_}]=$p
  done < <(find "$tmp/x/lib/modules/$kver/kernel" -name '*.ko' -o -name '*.ko.xz' -o -name '*.ko.zst' -o -name '*.ko.gz')
  kocat() {
    case "$1" in
      *.xz) xz -dc "$1" ;; *.zst) zstd -qdc "$1" ;; *.gz) gzip -dc "$1" ;; *) cat "$1" ;;
    esac
  }
  order=()
  add_module() {
    local n=${1//-/_} d
    [ -z "${seen[$n]:-}" ] || return 0
    seen[$n]=1
    if [ -z "${kopath[$n]:-}" ]; then
      grep -q "/$n.ko\$\|/${n//_/-}.ko\$" "$tmp/x/lib/modules/$kver/modules.builtin" && return 0
      die "module $n is neither built in nor shipped by $kernel_pkg"
    fi
    for d in $(kocat "${kopath[$n]}" | tr '\0' '\n' | sed -n 's/^depends=//p' | head -1 | tr ',' ' '); do
      add_module "$d"
    done
    order+=("$n")
  }
  for m in "${want_modules[@]}"; do add_module "$m"; done
  for n in "${order[@]}"; do kocat "${kopath[$n]}" >"$kdir/modules/$n.ko"; echo "$n"; done >"$kdir/modules.order"
  rm -rf "$tmp"
  trap - EXIT
  touch "$kdir/ready"
fi
log "kernel $kernel_pkg $(cat "$kdir/version") (modules: $(tr '\n' ' ' <"$kdir/modules.order"))"

# --- job directory ----------------------------------------------------------
# Job directories of runs that were SIGKILLed (so could not clean up) go after a day.
find /var/tmp -maxdepth 1 -name 'warren-v2vm.*' -type d -mtime +0 -exec rm -rf {} + 2>/dev/null || true
job=$(mktemp -d /var/tmp/warren-v2vm.XXXXXX)
qpid=""
cleanup() {
  if [ -n "$qpid" ] && kill -0 "$qpid" 2>/dev/null; then
    kill -TERM "$qpid" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$qpid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$qpid" 2>/dev/null || true
    wait "$qpid" 2>/dev/null || true
  fi
  [ -z "${tailpid:-}" ] || kill "$tailpid" 2>/dev/null || true
  if [ "$keep" = 1 ]; then log "job directory kept: $job"; else rm -rf "$job"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$job/initramfs/dev" "$job/initramfs/proc" "$job/initramfs/newroot" "$job/initramfs/modules.d" "$job/bin"

t_build=$(date +%s%N)
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -o "$job/initramfs/init" ./scripts/v2vm/init)
for n in $(cat "$kdir/modules.order"); do
  cp "$kdir/modules/$n.ko" "$job/initramfs/modules.d/"
  echo "/modules.d/$n.ko"
done >"$job/initramfs/modules"
mknod -m 600 "$job/initramfs/dev/console" c 5 1
(cd "$job/initramfs" && find . -print0 | cpio --null -o -H newc --owner=0:0 --quiet) >"$job/initramfs.cpio"

needs_bins=0
for l in "${lanes[@]}"; do [ "${lane_bins[$l]}" = 0 ] || needs_bins=1; done
if [ "$needs_bins" = 1 ] && { [ ! -x "$src/bin/warren-agent" ] || [ ! -x "$src/bin/warren-spawner" ]; }; then
  log "building the agent and spawner: make -C $src build"
  make -C "$src" build >"$job/make-build.log" 2>&1 || { tail -30 "$job/make-build.log" >&2; die "make build failed"; }
fi
sum_timeout=0
: >"$job/plan"
for l in "${lanes[@]}"; do
  (cd "$src" && CGO_ENABLED=0 go test -c -o "$job/bin/$l.test" "${lane_pkg[$l]}")
  args="-test.v -test.count=1 -test.timeout=$((lane_timeout[$l] - 30))s"
  [ -z "$run_re" ] || args="$args -test.run '$run_re'"
  echo "$l ${lane_timeout[$l]} $src/${lane_pkg[$l]#./} exec /run/v2vm/bin/$l.test $args" >>"$job/plan"
  sum_timeout=$((sum_timeout + lane_timeout[$l]))
done
if [ -n "$exec_cmd" ]; then
  echo "exec 600 $src $exec_cmd" >>"$job/plan"
  sum_timeout=$((sum_timeout + 600))
  lanes+=(exec)
fi
cat >"$job/env" <<EOF
WARREN_TEST_PRIVILEGED=1
WARREN_TEST_CGROUP_V2=1
WARREN_AGENT=$src/bin/warren-agent
WARREN_SPAWNER=$src/bin/warren-spawner
GOFLAGS=$GOFLAGS
GOCACHE=/tmp/gocache
EOF
echo "$src" >"$job/src"
log "built the initramfs and ${#lanes[@]} test binaries in $((($(date +%s%N) - t_build) / 1000000))ms"
total_timeout=${total_timeout:-$((sum_timeout + 180))}

# --- boot -------------------------------------------------------------------
# cgroup_no_v1=all: no controller can be bound to a v1 hierarchy, so all of
# them are on the cgroup2 mount (the init mounts no v1 hierarchy anyway).
console=$job/console.log
ninep=security_model=none,multidevs=remap
qemu=(qemu-system-x86_64 -M pc -accel tcg,thread=multi -cpu max -smp "${V2VM_SMP:-2}" -m "${V2VM_MEM:-2G}"
  -nodefaults -no-reboot -display none -nic none
  -chardev "file,id=con,path=$console" -serial chardev:con
  -kernel "$kdir/vmlinuz" -initrd "$job/initramfs.cpio"
  -append "console=ttyS0 loglevel=3 panic=-1 cgroup_no_v1=all tsc=reliable"
  -fsdev "local,id=hostroot,path=/,readonly=on,$ninep" -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot
  -fsdev "local,id=v2vmjob,path=$job,$ninep" -device virtio-9p-pci,fsdev=v2vmjob,mount_tag=v2vmjob
  -fsdev "local,id=v2vmsrc,path=$src,readonly=on,$ninep" -device virtio-9p-pci,fsdev=v2vmsrc,mount_tag=v2vmsrc)
log "booting (lanes: ${lanes[*]}; hard limit ${total_timeout}s)"
: >"$console"
t0=$(date +%s)
# setpriv --pdeathsig: QEMU dies with this script even if it is SIGKILLed.
setpriv --pdeathsig KILL -- "${qemu[@]}" </dev/null >"$job/qemu.out" 2>&1 &
qpid=$!
if [ "$quiet" = 0 ]; then
  tail -n +1 -f --pid="$qpid" "$console" | tr -d '\r' &
  tailpid=$!
fi
timed_out=0
while kill -0 "$qpid" 2>/dev/null; do
  if [ $(($(date +%s) - t0)) -ge "$total_timeout" ]; then
    log "hard limit of ${total_timeout}s reached: killing QEMU"
    timed_out=1
    break
  fi
  sleep 1
done
if [ "$timed_out" = 1 ]; then
  kill -TERM "$qpid" 2>/dev/null || true; sleep 2; kill -KILL "$qpid" 2>/dev/null || true
fi
qrc=0; wait "$qpid" 2>/dev/null || qrc=$?
qpid=""
[ -z "${tailpid:-}" ] || { sleep 0.3; kill "$tailpid" 2>/dev/null || true; wait "$tailpid" 2>/dev/null || true; tailpid=""; }
elapsed=$(($(date +%s) - t0))
if [ -s "$job/qemu.out" ]; then log "qemu said:"; sed 's/^/  /' "$job/qemu.out" >&2; fi

# --- verdict ----------------------------------------------------------------
tr -d '\r' <"$console" >"$job/console.txt"
[ "$keep" = 1 ] || cp "$job/console.txt" "${V2VM_LOG:-/var/tmp/warren-v2vm-last.log}"
if [ "$quiet" = 1 ]; then
  # Only the failing tests' output (from "=== RUN   T" to "--- FAIL: T"),
  # and the init's complaints; the whole console is in the log file.
  awk '
    FNR == NR { if (match($0, /^--- FAIL: [^ ]+/)) failed[substr($0, 11, RLENGTH - 10)] = 1; next }
    /^=== V2VM (BOOT|PLAN) FAILED|^=== V2VM LANE .* TIMEOUT/ { print }
    /^=== RUN   [^\/]+$/ { name = substr($0, 11); on = (name in failed) }
    on { print }
    /^--- FAIL: / { on = 0 }' "$job/console.txt" "$job/console.txt"
fi
awk -v lanes="${lanes[*]}" -v elapsed="$elapsed" -v qrc="$qrc" -v timed_out="$timed_out" '
  BEGIN { n = split(lanes, want, " ") }
  /^=== V2VM INIT up=/ { sub(/^=== V2VM INIT up=/, ""); boot = $1 }
  /^=== V2VM LANE [^ ]+ START/ { cur = $4; next }
  /^=== V2VM LANE [^ ]+ EXIT / { code[$4] = $6; secs[$4] = $7; cur = ""; next }
  /^=== V2VM DONE/ { done = 1 }
  /^=== V2VM kernel / { sub(/^=== V2VM /, ""); print "v2vm: " $0 > "/dev/stderr" }
  /^=== V2VM (BOOT|PLAN) FAILED/ { print "v2vm: " $0 > "/dev/stderr" }
  cur != "" && match($0, /^ *--- (PASS|FAIL|SKIP): [^ ]+/) {
    split(substr($0, RSTART, RLENGTH), w, " ")
    res = w[2]; sub(/:$/, "", res); name = w[3]
    top = (index(name, "/") == 0)
    if (top) cnt[cur, res]++
    if (res != "PASS") bad[cur] = bad[cur] "    " res " " name "\n"
  }
  END {
    printf "\nv2vm: pure cgroup v2 VM: booted to init in %s, whole run %ss\n", (boot == "" ? "?" : boot), elapsed
    fail = 0
    for (i = 1; i <= n; i++) {
      l = want[i]
      p = cnt[l, "PASS"] + 0; f = cnt[l, "FAIL"] + 0; s = cnt[l, "SKIP"] + 0
      P += p; F += f; S += s
      st = (l in code) ? "exit " code[l] " in " secs[l] "s" : "did not finish"
      printf "v2vm: lane %-8s %3d passed, %d failed, %d skipped; %s\n", l, p, f, s, st
      if (bad[l] != "") printf "%s", bad[l]
      if (!(l in code) || code[l] != 0 || f > 0 || s > 0) fail = 1
      if ((l in code) && code[l] == 0 && p == 0 && l != "exec") { print "v2vm: lane " l " ran no test"; fail = 1 }
    }
    if (!done) { print "v2vm: the VM did not finish its plan" (timed_out ? " (hard limit reached)" : " (qemu exit " qrc ")"); fail = 1 }
    printf "v2vm: %d passed, %d failed, %d skipped\n", P, F, S
    exit fail
  }' "$job/console.txt"
}

main "$@"
