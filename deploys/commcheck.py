"""Run the communication check alone: ``pyinfra inventories/prod.py deploys/commcheck.py``.

kimi-deploy's own deploy (deploy_commcheck in kimi_pyinfra/deploys/commcheck.py), as installed.
"""

from kimi_pyinfra.deploys.commcheck import deploy_commcheck

deploy_commcheck()
