"""Report the hardware of every host, changing nothing: ``pyinfra INVENTORY deploys/report.py``.

kimi-deploy's own deploy (deploy_report in kimi_pyinfra/deploys/report.py), as installed.
"""

try:
    from kimi_pyinfra.deploys.report import deploy_report
except ModuleNotFoundError as exc:  # a pyinfra of another installation, without kimi-deploy
    if exc.name not in ("kimi_pyinfra", "kimi_pyinfra.deploys"):
        raise
    raise SystemExit(
        "deploys/report.py: this pyinfra has no kimi-deploy: run `kimi-deploy converge INVENTORY --deploy report`"
        " (the pyinfra installed beside kimi-deploy), or that installation's pyinfra"
    ) from None

deploy_report()
