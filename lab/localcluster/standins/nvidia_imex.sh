#!/bin/sh
# Stand-in nvidia-imex of the local test cluster, installed by the stand-in nvidia-imex package as
# /usr/bin/nvidia-imex. Like the real daemon it needs the driver it was built for and a node list
# (IMEX_NODE_CONFIG_FILE in its config, one IP address per line); then it stays up.
set -u
VERSION="@VERSION@"
config=/etc/nvidia-imex/config.cfg
while [ $# -gt 0 ]; do
    case "$1" in
        -c|--config) config=$2; shift 2 ;;
        -v|--version) echo "IMEX version is: $VERSION"; exit 0 ;;
        *) echo "nvidia-imex: unknown option $1" >&2; exit 1 ;;
    esac
done
if [ ! -r "$config" ]; then
    echo "IMEX failed to read config file $config" >&2
    exit 1
fi
nodes=$(sed -n 's/^IMEX_NODE_CONFIG_FILE=//p' "$config" | tail -n 1)
nodes=${nodes:-/etc/nvidia-imex/nodes_config.cfg}
if ! driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1); then
    echo "IMEX failed to initialize NVML: $driver" >&2
    exit 1
fi
driver=$(echo "$driver" | head -n 1)
if [ "$driver" != "$VERSION" ]; then
    echo "IMEX version $VERSION does not match driver version $driver" >&2
    exit 1
fi
count=$(grep -Ecv '^[[:space:]]*(#|$)' "$nodes" 2>/dev/null || true)
if [ "${count:-0}" -eq 0 ]; then
    echo "IMEX node config file $nodes lists no nodes" >&2
    exit 1
fi
bad=$(grep -Ev '^[[:space:]]*(#|$)' "$nodes" | grep -Evx '[[:space:]]*[0-9]{1,3}(\.[0-9]{1,3}){3}[[:space:]]*' || true)
if [ -n "$bad" ]; then
    echo "IMEX node config file $nodes: not an IP address: $bad" >&2
    exit 1
fi
echo "IMEX daemon started with $count nodes from $nodes"
exec sleep infinity
