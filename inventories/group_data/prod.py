"""Data for every host of inventories/prod.py (the group named after the file)."""

ssh_user = "ops"
kimi_recipe = "recipes/kimi-k3.1-pro.yaml"
