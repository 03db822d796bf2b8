#!/usr/bin/env bash
# Builds the tiny guest the real-QEMU tests boot: the distribution's cloud kernel, a ~1 MB
# busybox initramfs that loads the virtio drivers (balloon, so libvirt's memory stats and
# setMemory are real; block; net) and powers off on an ACPI power-button press (so a
# graceful shutdown works), and a bootable disk image: a busybox root on ext4 in qcow2
# (~3 MB). When the guest's first disk (/dev/vda) holds a root with /sbin/init, the
# initramfs switches to it; without one (no disk, or a blank one) the guest runs from the
# initramfs alone. Either way its console says "lm-guest: up" once its init runs. Kernel
# command line options give it work to measure: lm.fill=MiB (memory), lm.write (disk
# throughput), lm.ip=ADDRESS/PREFIX (network services).
#
#   scripts/guest-image.sh [OUT_DIR]    (default: .guest in the clone; prints OUT_DIR)
#
# OUT_DIR receives vmlinuz, initrd.img and images/busybox.qcow2 (OUT_DIR/images is an
# image directory for the agent's --image-dir: the image "busybox"). Rebuilt only when
# this script or the kernel is newer than them, so a clean clone (CI) builds it once, in
# about 1.5 s. Needs linux-image-cloud-amd64, busybox-static, cpio, e2fsprogs and
# qemu-utils (scripts/setup.sh full).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/.guest}"
export PATH="$PATH:/usr/sbin:/sbin"

kernel=$(ls /boot/vmlinuz-*-cloud-amd64 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$kernel" ]; then
  echo "guest-image: no /boot/vmlinuz-*-cloud-amd64 (install linux-image-cloud-amd64)" >&2
  exit 1
fi
version=${kernel#/boot/vmlinuz-}
modules=/lib/modules/$version/kernel
busybox=/bin/busybox
# ldd fails on a static binary; that failure is the answer wanted.
if ! (ldd "$busybox" 2>&1 || true) | grep -q 'not a dynamic executable'; then
  echo "guest-image: $busybox is not static (install busybox-static)" >&2
  exit 1
fi
for tool in mkfs.ext4 qemu-img; do
  if ! command -v "$tool" >/dev/null; then
    echo "guest-image: no $tool (install e2fsprogs and qemu-utils)" >&2
    exit 1
  fi
done

mkdir -p "$out/images"
disk="$out/images/busybox.qcow2"
# Two test processes may build at once (a second pytest, or xdist workers): one builds, the
# other waits on the lock and then finds the image fresh.
exec 9>"$out/.build.lock"
flock 9
fresh() { [ -s "$1" ] && [ "$1" -nt "$0" ] && [ "$1" -nt "$kernel" ]; }
if fresh "$out/initrd.img" && fresh "$disk"; then
  echo "$out"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tree=$work/initramfs
rootfs=$work/rootfs
mkdir -p "$tree"/{bin,dev,proc,sys,newroot,lib/modules} "$rootfs"/{bin,sbin,dev,proc,sys,tmp,data}
cp "$busybox" "$tree/bin/busybox"
cp "$busybox" "$rootfs/bin/busybox"
# Each module needs the ones before it; button and evdev give the power button as an
# input device.
order="drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_legacy_dev
       drivers/virtio/virtio_pci_modern_dev drivers/virtio/virtio_pci
       drivers/virtio/virtio_balloon drivers/block/virtio_blk net/core/failover
       drivers/net/net_failover drivers/net/virtio_net drivers/acpi/button
       drivers/input/evdev"
for m in $order; do
  cp "$modules/$m.ko" "$tree/lib/modules/"
done

# Stage one, the initramfs: the drivers, then the disk's root if it has one.
cat >"$tree/init" <<'STAGE1'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci \
         virtio_balloon virtio_blk failover net_failover virtio_net button evdev; do
  insmod /lib/modules/$m.ko || echo "lm-guest: insmod $m failed"
done
if [ -b /dev/vda ] && mount -t ext4 /dev/vda /newroot 2>/dev/null; then
  if [ -x /newroot/sbin/init ]; then
    echo "lm-guest: root on /dev/vda"
    for fs in dev proc sys; do mount --move /$fs /newroot/$fs; done
    exec switch_root /newroot /sbin/init
  fi
  umount /newroot
fi
exec /stage2
STAGE1

# Stage two, the guest itself: the disk root's /sbin/init, or the initramfs's /stage2.
cat >"$tree/stage2" <<'STAGE2'
#!/bin/busybox sh
/bin/busybox --install -s /bin 2>/dev/null
# Power off when the power button is pressed (libvirt's graceful shutdown sends it).
for dev in /sys/class/input/event*; do
  if grep -q "Power Button" "$dev/device/name" 2>/dev/null; then
    (dd if=/dev/input/${dev##*/} bs=24 count=1 >/dev/null 2>&1; echo "lm-guest: power off"; poweroff -f) &
  fi
done
# lm.fill=MiB on the kernel command line: hold that much memory, to give the guest load.
fill=$(sed -n 's/.*lm\.fill=\([0-9]*\).*/\1/p' /proc/cmdline)
if [ -n "$fill" ]; then
  mkdir -p /dev/shm && mount -t tmpfs -o size=${fill}M shm /dev/shm
  dd if=/dev/zero of=/dev/shm/fill bs=1M count="$fill" 2>/dev/null
fi
for nic in /sys/class/net/eth*; do
  [ -e "$nic/address" ] && echo "lm-guest: ${nic##*/} $(cat "$nic/address")"
done
# lm.ip=ADDRESS/PREFIX: eth0 gets it, and two TCP services measure the network from the
# host: port 5001 reads all it is sent and answers the byte count, port 5002 sends 1.5 MiB.
address=$(sed -n 's/.*lm\.ip=\([0-9./]*\).*/\1/p' /proc/cmdline)
if [ -n "$address" ]; then
  ip addr add "$address" dev eth0 && ip link set eth0 up
  nc -ll -p 5001 -e wc -c &
  nc -ll -p 5002 -e sh -c 'dd if=/dev/zero bs=64k count=24 2>/dev/null' &
fi
# lm.write on a disk root: write 2 MiB to the disk (synced) every second, printing when
# each round started and ended (guest uptime, s): "lm-guest: write N 2048 KiB START END".
if grep -q 'lm\.write' /proc/cmdline && [ -d /data ]; then
  (
    n=0
    while true; do
      n=$((n + 1))
      start=$(cut -d' ' -f1 /proc/uptime)
      dd if=/dev/zero of=/data/dd bs=64k count=32 conv=fsync 2>/dev/null
      echo "lm-guest: write $n 2048 KiB $start $(cut -d' ' -f1 /proc/uptime)"
      sleep 1
    done
  ) &
fi
echo "lm-guest: up"
while true; do sleep 3600; done
STAGE2
chmod +x "$tree/init" "$tree/stage2"
cp "$tree/stage2" "$rootfs/sbin/init"

(cd "$tree" && find . | cpio -o -H newc --quiet | gzip -9) >"$work/initrd.img"
# No loop mount (so no root needed): mkfs fills the file system from the directory.
mkfs.ext4 -q -d "$rootfs" "$work/root.ext4" 32M >/dev/null
qemu-img convert -O qcow2 "$work/root.ext4" "$work/busybox.qcow2"
cp "$kernel" "$work/vmlinuz"
for f in vmlinuz initrd.img; do mv "$work/$f" "$out/$f"; done
mv "$work/busybox.qcow2" "$disk"
echo "$out"
