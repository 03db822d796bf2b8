#!/usr/bin/env bash
# Runs a private libvirtd with the QEMU driver, isolated from any other libvirtd on the machine,
# so that two of them can stand for two hosts on one machine (the real-guest tests).
#
#   scripts/private-libvirtd.sh NAME BASE_DIR SOCK_DIR MIGRATION_PORT_MIN
#
# Runs in the foreground as libvirtd itself (exec), so its caller can stop it by pid.
# A privileged libvirtd keeps its state in fixed places (/run/libvirt, /var/lib/libvirt,
# /etc/libvirt, ...) and puts guests in the cgroup /machine; two of them there would share both.
# So it runs in its own mount namespace, with those directories bind-mounted from BASE_DIR,
# and its own cgroup namespace rooted at a cgroup "lm-NAME" in every v1 hierarchy: the same
# guest name and id on both daemons (a migrated guest) never meet in one cgroup.
# Its socket is SOCK_DIR/libvirt-sock: qemu+unix:///system?socket=SOCK_DIR/libvirt-sock.
# virtlogd (needed by a guest with a serial file) runs in the same namespace; its pid is
# BASE_DIR/run/virtlogd.pid. Needs root.
set -euo pipefail
name=$1 base=$2 sock=$3 port_min=$4

if [ "$(id -u)" != 0 ]; then
  echo "private-libvirtd: needs root (a privileged libvirtd runs QEMU guests with cgroups)" >&2
  exit 1
fi
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
  # Only v1 or hybrid hierarchies (the CI machines) are handled below; a pure cgroup v2 host
  # would need the namespace built differently (no processes in inner cgroups).
  echo "private-libvirtd: /sys/fs/cgroup is pure cgroup v2, which this script does not handle" >&2
  exit 1
fi
# lib/dnsmasq: the network driver writes there for every network a guest's NIC joins.
mkdir -p "$base"/{etc,run,lib/dnsmasq,cache,log} "$sock"
: >"$base/cgroups"
mkdir -p /run/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt /etc/libvirt

# A host UUID of its own: libvirt refuses to migrate to "the same host" by this UUID.
host_uuid=$(cat /proc/sys/kernel/random/uuid)
cat >"$base/etc/libvirtd.conf" <<EOF
unix_sock_dir = "$sock"
unix_sock_rw_perms = "0700"
auth_unix_rw = "none"
auth_unix_ro = "none"
host_uuid = "$host_uuid"
log_outputs = "3:file:$base/log/libvirtd.log"
EOF
cat >"$base/etc/qemu.conf" <<EOF
user = "root"
group = "root"
security_driver = "none"
migration_port_min = $port_min
migration_port_max = $((port_min + 15))
EOF

# One cgroup per controller for this daemon and its guests, made the root of its namespace.
# Hierarchies are directories named after their controllers ("cpu,cpuacct" where they are
# mounted together); symlinks to them ("cpu") are skipped.
for hierarchy in /sys/fs/cgroup/*/; do
  hierarchy=${hierarchy%/}
  [ -e "$hierarchy/cgroup.procs" ] && [ ! -L "$hierarchy" ] || continue
  controller=${hierarchy##*/}
  # This process's cgroup in that hierarchy ("0::" is the cgroup2 one, mounted as "unified").
  current=$(awk -F: -v c="$controller" '
    c == "unified" && $1 == "0" { print $3 }
    $2 == c || $2 == "name=" c { print $3 }
  ' /proc/self/cgroup | head -n 1)
  group="$hierarchy${current%/}/lm-$name"
  mkdir -p "$group"
  if [ "$controller" = cpuset ]; then
    # A v1 cpuset takes no task until it has CPUs and memory nodes.
    cat "$(dirname "$group")/cpuset.cpus" >"$group/cpuset.cpus"
    cat "$(dirname "$group")/cpuset.mems" >"$group/cpuset.mems"
  fi
  echo $$ >"$group/cgroup.procs"
  echo "$group" >>"$base/cgroups"  # for whoever cleans up after the daemon
done

export LM_BASE=$base
exec unshare --mount --cgroup --propagation private bash -euc '
  # The cgroup hierarchies again, on a fresh tmpfs, now rooted at this namespace'"'"'s cgroups.
  controllers=$(for h in /sys/fs/cgroup/*/; do
    h=${h%/}; if [ -e "$h/cgroup.procs" ] && [ ! -L "$h" ]; then basename "$h"; fi; done)
  mount -t tmpfs -o mode=755 cgroup-root /sys/fs/cgroup
  for controller in $controllers; do
    mkdir -p "/sys/fs/cgroup/$controller"
    case $controller in
      unified) mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified ;;
      systemd) mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd ;;
      *) mount -t cgroup -o "$controller" cgroup "/sys/fs/cgroup/$controller" ;;
    esac
  done
  mount --bind "$LM_BASE/etc" /etc/libvirt
  mount --bind "$LM_BASE/run" /run/libvirt
  mount --bind "$LM_BASE/lib" /var/lib/libvirt
  mount --bind "$LM_BASE/cache" /var/cache/libvirt
  mount --bind "$LM_BASE/log" /var/log/libvirt
  virtlogd --daemon --pid-file "$LM_BASE/run/virtlogd.pid"
  exec libvirtd --config "$LM_BASE/etc/libvirtd.conf" --pid-file "$LM_BASE/run/libvirtd.pid"
'
