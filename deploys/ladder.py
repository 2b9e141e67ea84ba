"""Print the context ladder's proofs of every host, changing nothing: ``pyinfra INVENTORY deploys/ladder.py``.

kimi-deploy's own deploy (deploy_ladder in kimi_pyinfra/deploys/ladder.py), as installed.
"""

try:
    from kimi_pyinfra.deploys.ladder import deploy_ladder
except ModuleNotFoundError as exc:  # a pyinfra of another installation, without kimi-deploy
    if exc.name not in ("kimi_pyinfra", "kimi_pyinfra.deploys"):
        raise
    raise SystemExit(
        "deploys/ladder.py: this pyinfra has no kimi-deploy: run `kimi-deploy converge INVENTORY --deploy ladder`"
        " (the pyinfra installed beside kimi-deploy), or that installation's pyinfra"
    ) from None

deploy_ladder()
