"""Run the communication check alone: ``pyinfra inventories/prod.py deploys/commcheck.py``.

kimi-deploy's own deploy (deploy_commcheck in kimi_pyinfra/deploys/commcheck.py), as installed.
"""

try:
    from kimi_pyinfra.deploys.commcheck import deploy_commcheck
except ModuleNotFoundError as exc:  # a pyinfra of another installation, without kimi-deploy
    if exc.name not in ("kimi_pyinfra", "kimi_pyinfra.deploys"):
        raise
    raise SystemExit(
        "deploys/commcheck.py: this pyinfra has no kimi-deploy: run `kimi-deploy converge INVENTORY --deploy commcheck`"
        " (the pyinfra installed beside kimi-deploy), or that installation's pyinfra"
    ) from None

deploy_commcheck()
