"""Undo the latest converge: ``pyinfra inventories/prod.py deploys/rollback.py``.

kimi-deploy's own deploy (deploy_rollback in kimi_pyinfra/deploys/rollback.py), as installed.
"""

from kimi_pyinfra.deploys.rollback import deploy_rollback

deploy_rollback()
