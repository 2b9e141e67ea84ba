#!/bin/sh
# Stand-in nvlsm (the NVLink subnet manager) of the local test cluster, installed by the stand-in
# nvlsm package as /opt/nvidia/nvlsm/sbin/nvlsm. There is no NVLink fabric here: it only answers
# its version; the fabric manager's stand-in start script checks that it is installed.
case "${1:-}" in
    -V|--version) echo "nvlsm @VERSION@ (stand-in of the kimi-deploy local test cluster)"; exit 0 ;;
esac
echo "nvlsm: stand-in of the local test cluster: no NVLink fabric to manage" >&2
exit 1
