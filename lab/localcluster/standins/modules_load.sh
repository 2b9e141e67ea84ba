#!/bin/sh
# Stand-in of systemd-modules-load for the local test cluster (localcluster/fake_kernel.py): the
# real service is skipped in a container (ConditionCapability=CAP_SYS_MODULE), so at boot this loads
# what modules-load.d(5) lists, through the stand-in modprobe: one module name a line, "#" and ";"
# starting a comment, files of /etc, /run and /usr/lib/modules-load.d with the .conf suffix.
set -u
cat /etc/modules-load.d/*.conf /run/modules-load.d/*.conf /usr/lib/modules-load.d/*.conf 2>/dev/null \
    | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' | grep -v '^[#;]' | grep -v '^$' \
    | xargs -r /usr/local/sbin/modprobe -q -a || true
