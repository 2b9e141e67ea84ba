"""Fault drills: ``pyinfra INVENTORY deploys/drill.py -y --data kimi_drill=NAME --limit HOST``.

kimi-deploy's own deploy (deploy_drill in kimi_pyinfra/deploys/drill.py), as installed.
"""

try:
    from kimi_pyinfra.deploys.drill import deploy_drill
except ModuleNotFoundError as exc:  # a pyinfra of another installation, without kimi-deploy
    if exc.name not in ("kimi_pyinfra", "kimi_pyinfra.deploys"):
        raise
    raise SystemExit(
        "deploys/drill.py: this pyinfra has no kimi-deploy: run `kimi-deploy converge INVENTORY --deploy drill`"
        " (the pyinfra installed beside kimi-deploy), or that installation's pyinfra"
    ) from None

deploy_drill()
