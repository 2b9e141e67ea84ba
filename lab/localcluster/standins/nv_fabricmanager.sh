#!/bin/sh
# Stand-in nv-fabricmanager of the local test cluster, installed by the stand-in nvidia-fabricmanager
# package as /usr/bin/nv-fabricmanager. Like the real one it runs only against the driver version
# it was built for, and exits with an error otherwise, as it does on a host without NVSwitches; then it
# stays up (there is no fabric to manage).
set -u
VERSION="@VERSION@"
config=/usr/share/nvidia/nvswitch/fabricmanager.cfg
while [ $# -gt 0 ]; do
    case "$1" in
        -c|--config) config=$2; shift 2 ;;
        -v|--version) echo "Fabric Manager version is : $VERSION"; exit 0 ;;
        *) echo "nv-fabricmanager: unknown option $1" >&2; exit 1 ;;
    esac
done
if [ ! -r "$config" ]; then
    echo "failed to open fabric manager config file $config" >&2
    exit 1
fi
# A host without NVSwitches (a Grace Blackwell compute tray: the switch trays' NVOS runs the fabric
# manager) has nothing to manage; the real daemon says so and exits (NVIDIA/gpu-operator#610).
if grep -q '"fabric": "none"' /etc/kimi-fake-accelerators.json 2>/dev/null; then
    echo "request to query NVSwitch device information failed: WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]" >&2
    exit 1
fi
if ! driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1); then
    echo "fabric manager failed to initialize NVML: $driver" >&2
    exit 1
fi
driver=$(echo "$driver" | head -n 1)
if [ "$driver" != "$VERSION" ]; then
    echo "fabric manager NVIDIA GPU driver interface version $VERSION don't match with driver version $driver." \
        "Please update with matching NVIDIA driver package." >&2
    exit 1
fi
echo "Successfully configured all the available NVSwitches to route GPU NVLink traffic. NVLink Peer-to-Peer support" \
    "will be enabled once the GPUs are successfully registered with the NVLink fabric."
exec sleep infinity
