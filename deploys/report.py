"""Report the hardware of every host, changing nothing: ``pyinfra INVENTORY deploys/report.py``.

kimi-deploy's own deploy (deploy_report in kimi_pyinfra/deploys/report.py), as installed.
"""

from kimi_pyinfra.deploys.report import deploy_report

deploy_report()
