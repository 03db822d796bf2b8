#!/usr/bin/env bash
# Builds the tiny guest the real-QEMU tests boot: the distribution's cloud kernel and a ~1 MB
# busybox initramfs that loads virtio_balloon (so libvirt's memory stats and setMemory are
# real) and powers off on an ACPI power-button press (so a graceful shutdown works).
#
#   scripts/guest-image.sh [OUT_DIR]    (default: .guest in the clone; prints OUT_DIR)
#
# OUT_DIR receives vmlinuz and initrd.img. Rebuilt only when this script or the kernel is
# newer than the image, so a clean clone (CI) builds it once, in about a second.
# Needs linux-image-cloud-amd64, busybox-static and cpio (scripts/setup.sh full).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/.guest}"

kernel=$(ls /boot/vmlinuz-*-cloud-amd64 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$kernel" ]; then
  echo "guest-image: no /boot/vmlinuz-*-cloud-amd64 (install linux-image-cloud-amd64)" >&2
  exit 1
fi
version=${kernel#/boot/vmlinuz-}
modules=/lib/modules/$version/kernel/drivers
busybox=/bin/busybox
# ldd fails on a static binary; that failure is the answer wanted.
if ! (ldd "$busybox" 2>&1 || true) | grep -q 'not a dynamic executable'; then
  echo "guest-image: $busybox is not static (install busybox-static)" >&2
  exit 1
fi

mkdir -p "$out"
# Two test processes may build at once (a second pytest, or xdist workers): one builds, the
# other waits on the lock and then finds the image fresh.
exec 9>"$out/.build.lock"
flock 9
if [ -s "$out/initrd.img" ] && [ "$out/initrd.img" -nt "$0" ] && [ "$out/initrd.img" -nt "$kernel" ]; then
  echo "$out"
  exit 0
fi

tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree"/{bin,dev,proc,sys,lib/modules}
cp "$busybox" "$tree/bin/busybox"
# Each virtio module needs the ones before it; button and evdev give the power button
# as an input device.
order="virtio/virtio_ring virtio/virtio virtio/virtio_pci_legacy_dev virtio/virtio_pci_modern_dev
       virtio/virtio_pci virtio/virtio_balloon acpi/button input/evdev"
for m in $order; do
  cp "$modules/$m.ko" "$tree/lib/modules/"
done

cat >"$tree/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci \
         virtio_balloon button evdev; do
  insmod /lib/modules/$m.ko || echo "lm-guest: insmod $m failed"
done
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
echo "lm-guest: up"
while true; do sleep 3600; done
EOF
chmod +x "$tree/init"

(cd "$tree" && find . | cpio -o -H newc --quiet | gzip -9) >"$out/initrd.img.$$"
cp "$kernel" "$out/vmlinuz.$$"
mv "$out/vmlinuz.$$" "$out/vmlinuz"
mv "$out/initrd.img.$$" "$out/initrd.img"
echo "$out"
