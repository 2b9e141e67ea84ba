"""Converge each host to the recipe: ``pyinfra inventories/prod.py deploys/kimi.py``.

kimi-deploy's own deploy (deploy_kimi in kimi_pyinfra/deploys/kimi.py), as installed.
"""

from kimi_pyinfra.deploys.kimi import deploy_kimi

deploy_kimi()
