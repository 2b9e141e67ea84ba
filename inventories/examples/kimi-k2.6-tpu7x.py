"""An example inventory for recipes/examples/kimi-k2.6-tpu7x.yaml: one TPU7x host (4 chips).

Groups are the recipe's topology and pool groups; ``kimi_address`` is the address peers use,
``ssh_hostname`` the one pyinfra connects to (as in inventories/prod.py).
"""

tpu7x_k26_serve = [
    ("tpu7x-k26-w0", {"ssh_hostname": "10.62.0.10", "kimi_address": "10.63.0.10"}),
]
tpu7x_k26 = [name for name, _ in tpu7x_k26_serve]
