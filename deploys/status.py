"""Show what serves where and how to ask it, changing nothing: ``pyinfra INVENTORY deploys/status.py``.

kimi-deploy's own deploy (deploy_status in kimi_pyinfra/deploys/status.py), as installed.
"""

try:
    from kimi_pyinfra.deploys.status import deploy_status
except ModuleNotFoundError as exc:  # a pyinfra of another installation, without kimi-deploy
    if exc.name not in ("kimi_pyinfra", "kimi_pyinfra.deploys"):
        raise
    raise SystemExit(
        "deploys/status.py: this pyinfra has no kimi-deploy: run `kimi-deploy converge INVENTORY --deploy status`"
        " (the pyinfra installed beside kimi-deploy), or that installation's pyinfra"
    ) from None

deploy_status()
