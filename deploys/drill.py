"""Fault drills: ``pyinfra INVENTORY deploys/drill.py -y --data kimi_drill=NAME --limit HOST``.

kimi-deploy's own deploy (deploy_drill in kimi_pyinfra/deploys/drill.py), as installed.
"""

from kimi_pyinfra.deploys.drill import deploy_drill

deploy_drill()
