#!/usr/bin/env bash
# Installs what loadmaster needs on a fresh Debian machine: system packages (libvirt for the
# binding, PostgreSQL for the multi-process tests, Chromium for the report check, QEMU, a
# guest kernel and busybox for the real-guest tests) and a virtual environment in .venv
# with the pinned Python dependencies. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
want_system="${1:-full}"   # "full" for tests, "minimal" for the demo
# Each slow step is announced before it starts: a first run is quiet for half a minute
# otherwise (pip's own output is kept quiet).
say() { echo "setup: $*" >&2; }

need=()
command -v pkg-config >/dev/null || need+=(pkg-config)
pkg-config --exists libvirt 2>/dev/null || need+=(libvirt-dev)
if [ "$want_system" = full ]; then
  ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || need+=(postgresql)
  command -v chromium >/dev/null || need+=(chromium)
  [ -x /usr/sbin/libvirtd ] || need+=(libvirt-daemon)  # the agent kill -9 test runs its own libvirtd
  # The real-guest tests (tests/realvm): private libvirtd instances with the QEMU driver,
  # TCG guests booting a distribution kernel straight into a busybox initramfs.
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  [ -e /usr/lib/x86_64-linux-gnu/libvirt/connection-driver/libvirt_driver_qemu.so ] \
    || need+=(libvirt-daemon-driver-qemu)
  command -v virsh >/dev/null || need+=(libvirt-clients)
  ls /boot/vmlinuz-*-cloud-amd64 >/dev/null 2>&1 || need+=(linux-image-cloud-amd64)
  # The static build: the guest initramfs has no libc (it replaces a dynamic busybox).
  dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' \
    || need+=(busybox-static)
  command -v cpio >/dev/null || need+=(cpio)
  # Guests booting from a disk with a NIC: the storage pool makes qcow2 overlays with
  # qemu-img, the guest image's root is an ext4 made with mkfs.ext4 -d, and libvirt's
  # network driver writes dnsmasq state and iptables rules for every network it starts.
  command -v qemu-img >/dev/null || need+=(qemu-utils)
  [ -x /usr/sbin/mkfs.ext4 ] || need+=(e2fsprogs)
  [ -x /usr/sbin/dnsmasq ] || need+=(dnsmasq-base)
  [ -x /usr/sbin/iptables ] || need+=(iptables)
  # NIC limits where the kernel cannot take libvirt's: the agent shapes taps with tc.
  [ -x /usr/sbin/tc ] && [ -x /usr/sbin/ip ] || need+=(iproute2)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    say "installing system packages with apt-get: ${need[*]} (a minute or more)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "setup: missing system packages (${need[*]}); run as root or install them" >&2
    exit 1
  fi
fi

if [ "$want_system" = full ] && [ "$(id -u)" = 0 ]; then
  # libvirtd's QEMU driver will not load until the user and groups it runs guests as exist.
  getent group kvm >/dev/null || groupadd -r kvm
  getent group libvirt-qemu >/dev/null || groupadd -r libvirt-qemu
  getent passwd libvirt-qemu >/dev/null || useradd -r -g kvm -s /usr/sbin/nologin libvirt-qemu
fi

if [ ! -x .venv/bin/python ]; then
  say "creating the virtual environment .venv"
  python3 -m venv .venv
fi
stamp=.venv/.loadmaster-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  say "installing loadmaster and its pinned dependencies into .venv with pip (about 30 s the first time)"
  .venv/bin/pip install -q --upgrade pip 2>&1 | grep -v WARNING || true
  .venv/bin/pip install -q -e ".[dev,libvirt]" 2>&1 | grep -v WARNING || true
  .venv/bin/python -c "import loadmaster, libvirt, sqlalchemy, fastapi" 
  touch "$stamp"
  say "installed"
fi
