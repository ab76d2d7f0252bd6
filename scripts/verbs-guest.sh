#!/usr/bin/env bash
# Runs one command inside an emulated QEMU guest that has a real libfabric
# `verbs` device: the Linux kernel's soft-RoCE driver (rdma_rxe) on a dummy
# network interface. The command's output is streamed back as it runs and
# its exit code becomes this script's exit code.
#
#   bash scripts/verbs-guest.sh [--timeout SECS] [--verbose] -- COMMAND [ARGS...]
#
# The guest sees this machine's root filesystem read-only (virtio-9p) with a
# throw-away tmpfs overlay on top, so host binaries, libraries and the work
# tree are all there and writes vanish with the guest. COMMAND runs as root
# in the current working directory, its standard input /dev/null; /proc,
# /sys, /dev and /run are the guest's own (so the working directory must
# not be under them); /tmp is the host's, through the overlay. --verbose
# reports each step's time on stderr.
#
# In the guest: interface rxed0 (dummy) holds 169.254.77.1/16, the rxe
# device rxe0 sits on it, `ulimit -l` is unlimited, and the environment has
#   NETIO_VERBS_GUEST=1  NETIO_VERBS_ADDR=169.254.77.1  NETIO_VERBS_DOMAIN=rxe0
#   FI_UNIVERSE_SIZE=64  (verbs;ofi_rxm fails on rxe above 127; kept if set)
#   NETIO_CONFORMANCE_TIME_SCALE=4  (the conformance suite's watchdog allows
#     a call four times as long: emulation is slow; kept if set)
# plus PATH, HOME, LANG, LC_ALL and every NETIO_*, FI_*, RUST* and CARGO_*
# variable of the caller.
#
# Exit code: COMMAND's; 124 when --timeout (default 900 s, boot included)
# ran out and the guest was killed; 125 when the guest could not be set up
# (boot, modules, rxe device, working directory); 2 for a usage error.
#
# Software emulation only (TCG): no KVM, so it runs on any x86-64 Linux host,
# including one that is itself a virtual machine, at roughly 1/15 of native
# speed. Build on the host, run the binaries in the guest.
#
# Cache: ${NETIO_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/netio-verbs-guest}
# keeps Debian's kernel, the modules it needs and the initramfs; it is
# rebuilt when missing (delete it to move to a newer kernel). One guest runs
# at a time (a lock in the cache). NETIO_GUEST_MEMORY (default 2G) and
# NETIO_GUEST_CPUS (default 2) size the guest. NETIO_GUEST_APPEND adds guest
# kernel parameters: the guest's clock source is the emulated HPET (every
# clock read a system call and a device read), and
# NETIO_GUEST_APPEND="clocksource=tsc tsc=reliable" gives it a host-like
# TSC clock instead (the test command keeps the default).
set -euo pipefail

prog=verbs-guest
say() { echo "$prog: $*" >&2; }
die() { echo "$prog: error: $*" >&2; exit 125; }
# Prints the comment block at the top of this file.
usage() {
    sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2
    exit "${1:-2}"
}

TIMEOUT=900
VERBOSE=0
while [ $# -gt 0 ]; do
    case "$1" in
    --timeout)
        [ $# -ge 2 ] || usage
        TIMEOUT="$2"
        shift 2
        ;;
    --timeout=*)
        TIMEOUT="${1#--timeout=}"
        shift
        ;;
    -v | --verbose)
        VERBOSE=1
        shift
        ;;
    -h | --help) usage 0 ;;
    --)
        shift
        break
        ;;
    -*) usage ;;
    *) break ;;
    esac
done
[ $# -ge 1 ] || usage
case "$TIMEOUT" in
'' | *[!0-9]*) usage ;;
esac
[ "$TIMEOUT" -gt 0 ] || usage

START_NS="$(date +%s%N)"
elapsed() {
    local ms=$((($(date +%s%N) - START_NS) / 1000000))
    printf '%d.%03d' $((ms / 1000)) $((ms % 1000))
}
note() { if [ "$VERBOSE" = 1 ]; then say "[$(elapsed) s] $*"; fi; }

# The guest mounts its own filesystems over these, so a working directory
# under them would not be the host's directory. (/tmp is the host's, seen
# through the overlay: a clone there works.)
CWD="$(pwd -P)"
case "$CWD/" in
/proc/* | /sys/* | /dev/* | /run/*)
    die "the working directory $CWD is under /proc, /sys, /dev or /run, which the guest replaces with its own; cd elsewhere"
    ;;
esac

# --- host packages --------------------------------------------------------
# The guest runs the host's own user space, so the RDMA and libfabric tools
# must be installed here; qemu, busybox, cpio and kmod build and run the guest.
PACKAGES=(qemu-system-x86 busybox-static cpio kmod iproute2 libfabric1
    libfabric-bin ibverbs-providers rdma-core librdmacm1 perftest)
missing_packages() {
    local p
    for p in "${PACKAGES[@]}"; do
        if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" != installed ]; then
            echo "$p"
        fi
    done
}
mapfile -t missing < <(missing_packages)
if [ "${#missing[@]}" -gt 0 ]; then
    [ "$(id -u)" = 0 ] ||
        die "missing packages: ${missing[*]} (run as root, or: apt-get install ${missing[*]})"
    say "installing ${missing[*]}"
    log="$(mktemp)"
    apt-get update >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; die "apt-get update failed"; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "${missing[@]}" >"$log" 2>&1 ||
        { cat "$log" >&2; rm -f "$log"; die "apt-get install ${missing[*]} failed"; }
    rm -f "$log"
    mapfile -t missing < <(missing_packages)
    [ "${#missing[@]}" = 0 ] || die "still not installed: ${missing[*]}"
fi
for tool in qemu-system-x86_64 depmod modprobe cpio gzip flock timeout; do
    command -v "$tool" >/dev/null || die "$tool not found after installing the packages"
done
[ -x /bin/busybox ] || die "/bin/busybox not found (package busybox-static)"
note "host packages present"

# --- cache and lock -------------------------------------------------------
CACHE="${NETIO_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/netio-verbs-guest}"
mkdir -p "$CACHE" || die "cannot create the cache folder $CACHE"
# fd 9 holds the lock until this script and the guest it started are gone.
exec 9>>"$CACHE/lock"
if ! flock -n 9; then
    say "waiting for another guest to finish (lock $CACHE/lock)"
    flock 9
fi

# Kernel modules the guest loads (dependencies are added from modules.dep):
# virtio PCI and 9p for the shared folders, overlayfs for the writable root,
# dummy for the interface under rxe, rdma_rxe itself with crc32_generic
# (the "crc32" hash for its ICRC: without it `rdma link add` fails with
# ENOENT, and the guest cannot load modules on demand), and the user-space
# verbs and RDMA CM interfaces (/dev/infiniband/uverbs*, rdma_cm).
MODULES=(virtio_pci 9pnet_virtio 9p overlay dummy crc32_generic rdma_rxe ib_uverbs rdma_ucm)

# Picks (or builds) $KDIR: the kernel image, the modules above with their
# dependencies, and their load order. The newest complete build in the cache
# is used as it is; apt is asked only when there is none.
modset="$(printf '%s\n' "${MODULES[@]}" | sha256sum | cut -c1-12)"
KDIR="$(find "$CACHE" -maxdepth 2 -path "$CACHE/kernel-*-$modset/ready" 2>/dev/null |
    sed 's|/ready$||' | sort -V | tail -n 1)"
if [ -z "$KDIR" ]; then
    kpkg() {
        apt-cache depends linux-image-amd64 2>/dev/null |
            sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n 1
    }
    KPKG="$(kpkg)"
    if [ -z "$KPKG" ]; then
        apt-get update -qq >&2 || die "apt-get update failed"
        KPKG="$(kpkg)"
    fi
    [ -n "$KPKG" ] || die "apt-cache offers no linux-image-amd64 kernel"
    KVER="${KPKG#linux-image-}"
    say "building the guest kernel folder for $KVER in $CACHE (once)"
    mkdir -p "$CACHE/debs"
    deb="$(find "$CACHE/debs" -maxdepth 1 -name "${KPKG}_*_amd64.deb" | sort -V | tail -n 1)"
    if [ -z "$deb" ]; then
        # apt-get download writes into the current directory; its warning
        # about an unsandboxed download as root is harmless.
        (cd "$CACHE/debs" && apt-get download "$KPKG") >"$CACHE/debs/download.log" 2>&1 ||
            { cat "$CACHE/debs/download.log" >&2; die "apt-get download $KPKG failed"; }
        deb="$(find "$CACHE/debs" -maxdepth 1 -name "${KPKG}_*_amd64.deb" | sort -V | tail -n 1)"
        [ -n "$deb" ] || die "apt-get download $KPKG left no .deb in $CACHE/debs"
    fi
    x="$CACHE/extract.tmp"
    rm -rf "$x" "$CACHE/kernel.tmp"
    dpkg-deb -x "$deb" "$x" || die "dpkg-deb -x $deb failed"
    [ -f "$x/boot/vmlinuz-$KVER" ] || die "$deb holds no /boot/vmlinuz-$KVER"
    # The package ships no modules.dep: make it, then let modprobe list
    # each module's dependencies in load order.
    depmod -b "$x" "$KVER" || die "depmod -b $x $KVER failed"
    mkdir -p "$CACHE/kernel.tmp/modules"
    for m in "${MODULES[@]}"; do
        modprobe -d "$x" -S "$KVER" --show-depends "$m" ||
            die "module $m not found in $KPKG"
    done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' >"$CACHE/kernel.tmp/ko-paths"
    while read -r ko; do
        cp "$ko" "$CACHE/kernel.tmp/modules/"
        basename "$ko"
    done <"$CACHE/kernel.tmp/ko-paths" >"$CACHE/kernel.tmp/modules/load-order"
    rm "$CACHE/kernel.tmp/ko-paths"
    cp "$x/boot/vmlinuz-$KVER" "$CACHE/kernel.tmp/vmlinuz"
    echo "$KVER" >"$CACHE/kernel.tmp/version"
    touch "$CACHE/kernel.tmp/ready"
    KDIR="$CACHE/kernel-$KVER-$modset"
    # Builds for other module sets are not used any more.
    rm -rf "$CACHE"/kernel-*/ "$x"
    mv "$CACHE/kernel.tmp" "$KDIR"
fi
note "kernel $(cat "$KDIR/version"), modules: $(tr '\n' ' ' <"$KDIR/modules/load-order")"

# --- initramfs ------------------------------------------------------------
# /init: load the modules, mount the host's root (9p, read-only) under a
# tmpfs overlay, give it its own /proc /sys /dev /run, set up the rxe
# device, run the command in a chroot with its output in the shared folder,
# record the exit code, power off. Errors before the command are written to
# /xfer/guest-error (the host reports them, exit 125).
IFS= read -r -d '' INIT <<'EOF' || true
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
fail() {
    echo "verbs-guest init: $*"
    [ -d /xfer/. ] && echo "$*" >>/xfer/guest-error
    sync
    poweroff -f
    sleep 5
    reboot -f
}
while read -r ko; do
    args=
    # dummy makes an interface dummy0 by default; only rxed0 is wanted.
    [ "$ko" = dummy.ko ] && args=numdummies=0
    insmod "/modules/$ko" $args || fail "insmod $ko failed"
done </modules/load-order
mkdir -p /xfer /lower /rw /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 xfer /xfer ||
    fail "mounting the shared folder (9p tag xfer) failed"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,ro hostroot /lower ||
    fail "mounting the host root (9p tag hostroot) failed"
mount -t tmpfs -o mode=0755 rw /rw && mkdir /rw/upper /rw/work ||
    fail "tmpfs for the overlay failed"
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work,xino=off /newroot ||
    fail "overlay mount failed"
n=/newroot
mount -t proc proc $n/proc &&
    mount -t sysfs sysfs $n/sys &&
    mount -t devtmpfs devtmpfs $n/dev &&
    mkdir -p $n/dev/pts $n/dev/shm &&
    mount -t devpts -o newinstance,ptmxmode=0666 devpts $n/dev/pts &&
    mount -t tmpfs -o mode=1777 shm $n/dev/shm &&
    mount -t tmpfs -o mode=0755 run $n/run &&
    mkdir -p $n/run/lock ||
    fail "mounting /proc /sys /dev /run in the new root failed"
chroot $n /bin/sh -s </setup.sh >/xfer/setup.log 2>&1 ||
    fail "setting up the rxe device failed: $(cat /xfer/setup.log)"
cp /xfer/command.sh $n/run/verbs-guest-command.sh || fail "copying the command failed"
: >/xfer/started
chroot $n /bin/bash /run/verbs-guest-command.sh </dev/null >>/xfer/stdout 2>>/xfer/stderr
echo $? >/xfer/status.tmp
mv /xfer/status.tmp /xfer/status
sync
poweroff -f
sleep 5
reboot -f
EOF

# Runs inside the new root before the command: loopback up, the dummy
# interface with a link-local address (libfabric's verbs provider ignores an
# rxe device on lo), rxe0 on it, and a wait until its port is ACTIVE.
IFS= read -r -d '' SETUP <<'EOF' || true
set -ex
ip link set lo up
ip link add rxed0 type dummy
ip addr add 169.254.77.1/16 dev rxed0
ip link set rxed0 up
rdma link add rxe0 type rxe netdev rxed0
i=0
until rdma link show rxe0/1 | grep -q 'state ACTIVE'; do
    i=$((i + 1))
    if [ "$i" -gt 100 ]; then
        rdma link show
        echo "rxe0 port 1 not ACTIVE after 10 s"
        exit 1
    fi
    sleep 0.1
done
[ -c /dev/infiniband/uverbs0 ] || { echo "no /dev/infiniband/uverbs0"; exit 1; }
EOF

initrd_id="$( (printf '%s\n' "$INIT" "$SETUP"; cat "$KDIR/modules/load-order"; sha256sum /bin/busybox) |
    sha256sum | cut -c1-12)"
INITRD="$KDIR/initrd-$initrd_id.cpio.gz"
if [ ! -s "$INITRD" ]; then
    say "building the initramfs in $KDIR"
    r="$KDIR/initrd.tmp"
    rm -rf "$r" "$KDIR"/initrd-*.cpio.gz
    mkdir -p "$r/bin" "$r/proc" "$r/sys" "$r/dev"
    cp /bin/busybox "$r/bin/busybox"
    cp -r "$KDIR/modules" "$r/modules"
    printf '%s\n' "$INIT" >"$r/init"
    printf '%s\n' "$SETUP" >"$r/setup.sh"
    chmod 755 "$r/init"
    (cd "$r" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet | gzip -1) >"$INITRD.tmp" ||
        die "building the initramfs failed"
    mv "$INITRD.tmp" "$INITRD"
    rm -rf "$r"
fi
note "initramfs $INITRD"

# --- the command ----------------------------------------------------------
XFER="$(mktemp -d "${TMPDIR:-/tmp}/verbs-guest.XXXXXX")"
case "$XFER" in
*,*)
    rm -rf "$XFER"
    die "the temporary folder $XFER has a comma in its path, which qemu's options cannot take; set TMPDIR"
    ;;
esac
QEMU_PID=
TAIL_PIDS=()
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    if [ -n "$QEMU_PID" ]; then kill "$QEMU_PID" 2>/dev/null || true; fi
    if [ "${#TAIL_PIDS[@]}" -gt 0 ]; then kill "${TAIL_PIDS[@]}" 2>/dev/null || true; fi
    rm -rf "$XFER"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The command as a bash script: environment, working directory, argv (each
# word quoted with printf %q, so it arrives exactly as given here).
{
    echo "export PATH=$(printf '%q' "$PATH")"
    echo "export HOME=$(printf '%q' "${HOME:-/root}")"
    while IFS= read -r name; do
        echo "export $name=$(printf '%q' "${!name}")"
    done < <(compgen -e | grep -E '^(NETIO_|FI_|RUST|CARGO_|LANG$|LC_ALL$)' |
        grep -vE '^NETIO_(VERBS_(GUEST|ADDR|DOMAIN)|GUEST_CACHE)$' || true)
    # shellcheck disable=SC2016 # expanded in the guest
    echo 'export FI_UNIVERSE_SIZE="${FI_UNIVERSE_SIZE:-64}"'
    echo 'export NETIO_CONFORMANCE_TIME_SCALE="${NETIO_CONFORMANCE_TIME_SCALE:-4}"'
    echo 'export NETIO_VERBS_GUEST=1 NETIO_VERBS_ADDR=169.254.77.1 NETIO_VERBS_DOMAIN=rxe0'
    echo 'ulimit -l unlimited'
    echo "cd $(printf '%q' "$CWD") || { echo \"$prog: $(printf '%q' "$CWD") is not visible in the guest\" >&2; exit 125; }"
    printf 'exec'
    printf ' %q' "$@"
    printf '\n'
} >"$XFER/command.sh"
: >"$XFER/stdout"
: >"$XFER/stderr"

MEMORY="${NETIO_GUEST_MEMORY:-2G}"
CPUS="${NETIO_GUEST_CPUS:-2}"
# TCG only (never KVM: this must work inside a VM without nested
# virtualisation), no network card, no display; the serial console goes to
# a log file that is shown only when the guest fails (so neither firmware
# nor kernel messages mix with the command's output, and qemu leaves the
# terminal alone). The guest's CPUs run on host threads (multi-threaded TCG).
timeout -k 5 "$TIMEOUT" qemu-system-x86_64 \
    -nodefaults -accel tcg,thread=multi -machine q35 \
    -m "$MEMORY" -smp "$CPUS" \
    -display none -monitor none -serial "file:$XFER/console.log" \
    -nic none -no-reboot \
    -kernel "$KDIR/vmlinuz" -initrd "$INITRD" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1${NETIO_GUEST_APPEND:+ $NETIO_GUEST_APPEND}" \
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$XFER,mount_tag=xfer,security_model=none" \
    </dev/null >"$XFER/qemu.log" 2>&1 &
QEMU_PID=$!
note "qemu started (pid $QEMU_PID)"

# Stream the command's output while it runs; each tail exits after reading
# the rest of its file once the guest is gone.
tail -n +1 -s 0.2 --pid="$QEMU_PID" -f "$XFER/stdout" &
TAIL_PIDS+=($!)
tail -n +1 -s 0.2 --pid="$QEMU_PID" -f "$XFER/stderr" >&2 &
TAIL_PIDS+=($!)
if [ "$VERBOSE" = 1 ]; then
    (
        while kill -0 "$QEMU_PID" 2>/dev/null && [ ! -e "$XFER/started" ]; do sleep 0.1; done
        [ -e "$XFER/started" ] && say "[$(elapsed) s] guest ready, command started"
    ) &
fi

qemu_rc=0
wait "$QEMU_PID" || qemu_rc=$?
QEMU_PID=
wait "${TAIL_PIDS[@]}" 2>/dev/null || true
TAIL_PIDS=()
note "guest stopped (qemu exit $qemu_rc)"

if [ -s "$XFER/status" ]; then
    exit "$(cat "$XFER/status")"
fi
if [ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ]; then
    say "time limit of $TIMEOUT s reached: guest killed (exit 124)"
    exit 124
fi
if [ -s "$XFER/guest-error" ]; then
    say "guest set-up failed: $(cat "$XFER/guest-error")"
else
    say "the guest stopped without reporting an exit code (qemu exit $qemu_rc)"
    if [ -s "$XFER/qemu.log" ]; then sed 's/^/  qemu: /' "$XFER/qemu.log" >&2; fi
fi
if [ -s "$XFER/console.log" ]; then
    say "last lines of the guest console:"
    tail -n 30 "$XFER/console.log" | sed 's/^/  /' >&2
fi
exit 125
