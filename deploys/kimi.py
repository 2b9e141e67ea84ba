"""Converge each host to the recipe: ``pyinfra inventories/prod.py deploys/kimi.py``.

kimi-deploy's own deploy (deploy_kimi in kimi_pyinfra/deploys/kimi.py), as installed.
"""

try:
    from kimi_pyinfra.deploys.kimi import deploy_kimi
except ModuleNotFoundError as exc:  # a pyinfra of another installation, without kimi-deploy
    if exc.name not in ("kimi_pyinfra", "kimi_pyinfra.deploys"):
        raise
    raise SystemExit(
        "deploys/kimi.py: this pyinfra has no kimi-deploy: run `kimi-deploy converge INVENTORY`"
        " (the pyinfra installed beside kimi-deploy), or that installation's pyinfra"
    ) from None

deploy_kimi()
