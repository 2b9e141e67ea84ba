"""An example production inventory: WHERE to serve. Groups are the recipe's topology and pool groups.

Each topology in recipes/kimi-k3.1-pro.yaml names an inventory group holding all its hosts, and
one group per pool (and router). A host belongs to exactly one topology. Hosts fill a pool's
instances in the order listed here; the first host of an instance leads it. ``kimi_address`` is
the address peers use (the cluster network), ``ssh_hostname`` the one pyinfra connects to.
Data shared by a group lives in group_data/<group>.py.
"""

# One HGX B300 (8 GPUs): the single-node topology.
b300 = [
    ("b300-01", {"ssh_hostname": "10.20.0.11", "kimi_address": "10.21.0.11"}),
]

# Ten GB300 compute trays (4 GPUs each) and a CPU host for the router: the gb300-pd topology.
gb300_prefill = [
    (f"gb300-p{i:02d}", {"ssh_hostname": f"10.40.0.{10 + i}", "kimi_address": f"10.41.0.{10 + i}"}) for i in range(1, 7)
]
gb300_decode = [
    (f"gb300-d{i:02d}", {"ssh_hostname": f"10.40.0.{30 + i}", "kimi_address": f"10.41.0.{30 + i}"}) for i in range(1, 5)
]
gb300_router = [
    ("gb300-rt01", {"ssh_hostname": "10.40.0.50", "kimi_address": "10.41.0.50"}),
]
gb300 = [name for name, _ in gb300_prefill + gb300_decode + gb300_router]

# A TPU 7x slice of 8 hosts with 4 chips each: the tpu7x topology (SGLang).
tpu7x = [(f"tpu7x-w{i}", {"ssh_hostname": f"10.60.0.{10 + i}", "kimi_address": f"10.61.0.{10 + i}"}) for i in range(8)]

# TokenSpeed on one B300 host and on two H200 hosts.
ts_b300 = [
    ("b300-02", {"ssh_hostname": "10.20.0.12", "kimi_address": "10.21.0.12"}),
]
ts_h200 = [
    ("h200-01", {"ssh_hostname": "10.30.0.11", "kimi_address": "10.31.0.11"}),
    ("h200-02", {"ssh_hostname": "10.30.0.12", "kimi_address": "10.31.0.12"}),
]
