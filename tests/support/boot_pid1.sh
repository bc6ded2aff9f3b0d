#!/bin/bash
# Boots the distribution's systemd as PID 1 of private namespaces over an overlay of the host
# root. Started by systemd.py; two stages in one file so the mount sequence reads top
# to bottom.
#
#   boot_pid1.sh launch WORKDIR PAYLOAD CONSOLE TARGET CGROUP_PROCS...
#       joins the private cgroups (one cgroup.procs file per hierarchy), then becomes `unshare`,
#       whose forked child (PID 1 of the new PID namespace) runs the "pid1" stage.
#   boot_pid1.sh pid1 WORKDIR PAYLOAD CONSOLE TARGET [BIND_SRC BIND_DST]...
#       builds the root file system and execs systemd.
#
# Every mount is made in the private mount namespace, so all of them vanish with it: the
# harness has only cgroups and processes to clean up.
set -euo pipefail

stage=$1; shift
if [ "$stage" = launch ]; then
  workdir=$1 payload=$2 console=$3 target=$4; shift 4
  cgroup_procs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do cgroup_procs+=("$1"); shift; done
  [ $# -gt 0 ] && shift  # the "--" before the bind pairs
  for procs in "${cgroup_procs[@]}"; do echo $$ >"$procs"; done
  # --net: only loopback inside, so the unit's port cannot collide with anything on the host.
  # If the test process dies without cleaning up (SIGKILL), --pdeathsig kills unshare and
  # --kill-child then kills PID 1, which ends every process of the machine.
  exec setpriv --pdeathsig KILL -- unshare --pid --fork --mount --uts --ipc --net --cgroup \
    --propagation private --kill-child -- \
    /bin/bash "$0" pid1 "$workdir" "$payload" "$console" "$target" "$@"
fi

[ "$stage" = pid1 ] || { echo "unknown stage $stage" >&2; exit 2; }
workdir=$1 payload=$2 console=$3 target=$4; shift 4

# The overlay's upper and work dirs live on a tmpfs: nothing is written to the host's disk.
# redirect_dir=on: systemd renames StateDirectory= into /var/lib/private for DynamicUser=,
# which an overlay without redirect_dir refuses with EXDEV.
mount -n -t tmpfs -o mode=0755 cuzkd-live "$workdir"
mkdir "$workdir/upper" "$workdir/work" "$workdir/root"
mount -n -t overlay overlay \
  -o "lowerdir=/,upperdir=$workdir/upper,workdir=$workdir/work,redirect_dir=on" "$workdir/root"
root=$workdir/root
cp -a "$payload/." "$root/"
# Paths of the host hidden from the machine: removing them from the overlay leaves the host's.
if [ -f "$root/.cuzkd-live-absent" ]; then
  while IFS= read -r path; do rm -rf -- "$root$path"; done < "$root/.cuzkd-live-absent"
  rm -f -- "$root/.cuzkd-live-absent"
fi
while [ $# -ge 2 ]; do
  mkdir -p "$root$2"
  mount -n --bind "$1" "$root$2"
  mount -n -o remount,bind,ro "$root$2"
  shift 2
done

# /proc with /proc/sys read-only (else systemd-sysctl would write the host's sysctls);
# sysfs read-only (udev units then skip themselves).
mount -n -t proc proc "$root/proc"
mount -n --bind "$root/proc/sys" "$root/proc/sys"
mount -n -o remount,bind,ro "$root/proc/sys"
mount -n -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"

# Fresh cgroup mounts: the cgroup namespace makes the private cgroup their root.
cg=$root/sys/fs/cgroup
mount -n -t tmpfs -o mode=0755,nosuid,nodev,noexec cgroup-root "$cg"
while IFS=: read -r _id controllers _path; do
  if [ -z "$controllers" ]; then
    mkdir "$cg/unified"; mount -n -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$cg/unified"
  elif [ "$controllers" = name=systemd ]; then
    mkdir "$cg/systemd"; mount -n -t cgroup -o none,name=systemd,nosuid,nodev,noexec cgroup "$cg/systemd"
  else
    mkdir "$cg/$controllers"; mount -n -t cgroup -o "$controllers,nosuid,nodev,noexec" cgroup "$cg/$controllers"
  fi
done </proc/self/cgroup

# An nspawn-style /dev: a few host nodes, a private devpts, the console bound to a log file.
dev=$root/dev
mount -n -t tmpfs -o mode=0755,nosuid,strictatime cuzkd-live-dev "$dev"
for node in null zero full random urandom tty; do
  touch "$dev/$node"; mount -n --bind "/dev/$node" "$dev/$node"
done
mkdir "$dev/pts" "$dev/shm"
mount -n -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$dev/pts"
ln -s pts/ptmx "$dev/ptmx"
mount -n -t tmpfs -o mode=1777,nosuid,nodev shm "$dev/shm"
ln -s /proc/self/fd "$dev/fd"
ln -s /proc/self/fd/0 "$dev/stdin"; ln -s /proc/self/fd/1 "$dev/stdout"; ln -s /proc/self/fd/2 "$dev/stderr"
touch "$dev/console"; mount -n --bind "$console" "$dev/console"
mount -n -t tmpfs -o mode=0755,nosuid,nodev run "$root/run"
mount -n -t tmpfs -o mode=1777,nosuid,nodev tmp "$root/tmp"

hostname cuzkd-live
cd "$root"
mkdir -p .oldroot
pivot_root . .oldroot
umount -l /.oldroot
rmdir /.oldroot
exec env -i container=cuzkd-live PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  /lib/systemd/systemd --system --unit="$target" </dev/console >/dev/console 2>&1
