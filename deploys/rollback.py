"""Undo the latest converge: ``pyinfra inventories/prod.py deploys/rollback.py``.

kimi-deploy's own deploy (deploy_rollback in kimi_pyinfra/deploys/rollback.py), as installed.
"""

try:
    from kimi_pyinfra.deploys.rollback import deploy_rollback
except ModuleNotFoundError as exc:  # a pyinfra of another installation, without kimi-deploy
    if exc.name not in ("kimi_pyinfra", "kimi_pyinfra.deploys"):
        raise
    raise SystemExit(
        "deploys/rollback.py: this pyinfra has no kimi-deploy: run `kimi-deploy converge INVENTORY --deploy rollback`"
        " (the pyinfra installed beside kimi-deploy), or that installation's pyinfra"
    ) from None

deploy_rollback()
