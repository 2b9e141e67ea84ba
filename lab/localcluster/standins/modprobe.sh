#!/bin/sh
# Stand-in modprobe of the local test cluster, installed as /usr/local/sbin/modprobe (ahead of any
# /usr/sbin/modprobe on root's PATH) by localcluster/fake_kernel.py. The hosts are containers
# (systemd-nspawn drops CAP_SYS_MODULE), so no module loads there; the modules of hardware they only
# pretend to have are recorded instead, in /run/kimi-standin-modules/<name>, where the stand-in
# daemons look for them (/run is emptied at every boot, as a reboot unloads a module). As kmod's
# modprobe(8): a name is one module, "-" and "_" being the same; with -a every argument is one, else
# the first is and the rest are its parameters; an unknown module is "not found", status 1.
set -u
KNOWN="ib_umad ib_core mlx5_core mlx5_ib"
STATE=/run/kimi-standin-modules
all=0
quiet=0
names=""
while [ $# -gt 0 ]; do
    case "$1" in
        -a|--all) all=1 ;;
        -q|--quiet) quiet=1 ;;
        -*) echo "modprobe: stand-in of the local test cluster: option $1 is not supported" >&2; exit 1 ;;
        *) names="$names $1"; [ "$all" = 1 ] || break ;;
    esac
    shift
done
status=0
for name in $names; do
    name=$(printf '%s' "$name" | tr - _)
    case " $KNOWN " in
        *" $name "*) mkdir -p "$STATE" && : > "$STATE/$name" ;;
        *)
            [ "$quiet" = 1 ] || echo "modprobe: FATAL: Module $name not found in directory /lib/modules/$(uname -r)" >&2
            status=1
            ;;
    esac
done
exit $status
