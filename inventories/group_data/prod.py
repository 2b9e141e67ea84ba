"""Data for every host of inventories/prod.py (the group named after the file)."""

ssh_user = "ops"
# ops is not root: every operation and probe runs through sudo (pyinfra's global argument; the
# user needs passwordless sudo on the hosts, or run pyinfra with --sudo --use-sudo-password)
_sudo = True
kimi_recipe = "recipes/kimi-k3.1-pro.yaml"
