"""The local demo cluster made by ``kimi-deploy cluster up``: its hosts, read from its state file.

Hosts are real (systemd-nspawn machines with their own address and sshd); SSH checks their host
keys strictly. The cluster's package index, Hub and apt repository stand in for PyPI,
huggingface.co and NVIDIA's CUDA repository.
"""

import json
import os
from pathlib import Path

_state_file = Path(os.environ.get("KIMI_CLUSTER_DIR", "/var/lib/kimi-cluster")) / "state.json"
if not _state_file.is_file():
    raise RuntimeError(f"{_state_file} not found: start the demo cluster with `kimi-deploy cluster up`")
_state = json.loads(_state_file.read_text(encoding="utf-8"))

_common = {
    "ssh_user": "root",
    "ssh_key": _state["ssh_key"],
    "ssh_known_hosts_file": _state["known_hosts"],
    "ssh_strict_host_key_checking": "yes",
    "kimi_recipe": "recipes/demo.yaml",
    "kimi_pip_index_url": _state["services"]["index"]["url"],
    "kimi_hf_endpoint": _state["services"]["hub"]["url"],
}
# The cluster's fault knobs, for the drills a real cluster cannot safely be put through
# (deploys/drill.py: engine-garbage, accelerator-lost, fabric-refused, accelerator-xid).
if _state.get("drill_faults"):
    _common["kimi_drill_faults"] = _state["drill_faults"]
# The cluster's twin of NVIDIA's CUDA apt repository, when it serves one.
if "apt" in _state["services"]:
    _common["kimi_nvidia_repo_url"] = _state["services"]["apt"]["url"]

_hosts = [(h["name"], {"ssh_hostname": h["address"], **_common}) for h in _state["hosts"]]

# The demo recipe's two topologies: vLLM on the first two hosts, SGLang across the next two.
demo_vllm = _hosts[:2]
demo_sglang = _hosts[2:4]
