#!/bin/sh
# Stand-in nvidia-fabricmanager-start.sh of the local test cluster, installed by the stand-in
# nvidia-fabricmanager package as /usr/bin/nvidia-fabricmanager-start.sh and run by its unit with
# --mode precheck, then --mode start. Like NVIDIA's script it tells an NVLink 5 board (B200, B300:
# its NVSwitches are managed through a ConnectX bridge whose VPD carries SW_MNG) from earlier
# NVSwitch systems, and on an NVLink 5 board starts only when the NVLink subnet manager can run:
# nvlsm installed (/opt/nvidia/nvlsm/sbin/nvlsm and its configuration), ibstat (infiniband-diags)
# on the PATH and the ib_umad module loaded. Sources: NVIDIA/gpu-driver-container, commit 06a208ca,
# ubuntu24.04/nvidia-driver:169-191 (NVLink 5 detection; waits for mlx5_core and ib_umad) and
# :636-648 (the script's --mode start with the nvlsm configuration), ubuntu24.04/install.sh:67-69
# (nvlsm infiniband-diags installed with the fabric manager); aws/aws-parallelcluster-cookbook,
# commit 02106c37, cookbooks/aws-parallelcluster-platform/resources/nvidia_nvlsm/partial/
# _nvidia_nvlsm_common.rb (nvlsm is /opt/nvidia/nvlsm/sbin/nvlsm; the InfiniBand module listed in
# /etc/modules-load.d for every boot) and _nvidia_nvlsm_debian.rb (infiniband-diags). The hardware is the host's
# /etc/kimi-fake-accelerators.json ("fabric": nvlink5, nvswitch or none); a module counts as
# loaded when /sys/module has it or the cluster's stand-in modprobe recorded it in
# /run/kimi-standin-modules (the hosts are containers, which load no kernel module).
set -u
mode=start
fm_config=/usr/share/nvidia/nvswitch/fabricmanager.cfg
nvlsm_config=/usr/share/nvidia/nvlsm/nvlsm.conf
while [ $# -gt 0 ]; do
    case "$1" in
        --mode) mode=$2; shift 2 ;;
        --fm-config-file) fm_config=$2; shift 2 ;;
        --nvlsm-config-file) nvlsm_config=$2; shift 2 ;;
        --fm-pid-file|--nvlsm-pid-file) shift 2 ;;
        *) echo "nvidia-fabricmanager-start.sh: unknown option $1" >&2; exit 1 ;;
    esac
done
loaded() {
    [ -d "/sys/module/$1" ] || [ -e "/run/kimi-standin-modules/$1" ]
}
if grep -q '"fabric": "nvlink5"' /etc/kimi-fake-accelerators.json 2>/dev/null; then
    echo "Detected NVL5 system"
    missing=""
    [ -x /opt/nvidia/nvlsm/sbin/nvlsm ] || missing="$missing, nvlsm (no /opt/nvidia/nvlsm/sbin/nvlsm)"
    [ -r "$nvlsm_config" ] || missing="$missing, nvlsm's configuration $nvlsm_config"
    command -v ibstat >/dev/null 2>&1 || missing="$missing, ibstat (infiniband-diags)"
    loaded ib_umad || missing="$missing, the ib_umad kernel module"
    if [ -n "$missing" ]; then
        echo "NVLink subnet manager cannot start: missing ${missing#, }" >&2
        exit 1
    fi
else
    echo "Detected Pre-NVL5 system"
fi
case "$mode" in
    precheck) exit 0 ;;
    start) exec /usr/bin/nv-fabricmanager -c "$fm_config" ;;
    *) echo "nvidia-fabricmanager-start.sh: unknown mode $mode" >&2; exit 1 ;;
esac
