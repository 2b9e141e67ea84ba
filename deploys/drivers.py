"""Pinned drivers on each host: ``pyinfra INVENTORY deploys/drivers.py`` (also a step of kimi.py).

kimi-deploy's own deploy (deploy_drivers in kimi_pyinfra/deploys/drivers.py), as installed.
"""

try:
    from kimi_pyinfra.deploys.drivers import deploy_drivers
except ModuleNotFoundError as exc:  # a pyinfra of another installation, without kimi-deploy
    if exc.name not in ("kimi_pyinfra", "kimi_pyinfra.deploys"):
        raise
    raise SystemExit(
        "deploys/drivers.py: this pyinfra has no kimi-deploy: run `kimi-deploy converge INVENTORY --deploy drivers`"
        " (the pyinfra installed beside kimi-deploy), or that installation's pyinfra"
    ) from None

deploy_drivers()
