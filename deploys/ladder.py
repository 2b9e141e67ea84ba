"""Print the context ladder's proofs of every host, changing nothing: ``pyinfra INVENTORY deploys/ladder.py``.

kimi-deploy's own deploy (deploy_ladder in kimi_pyinfra/deploys/ladder.py), as installed.
"""

from kimi_pyinfra.deploys.ladder import deploy_ladder

deploy_ladder()
