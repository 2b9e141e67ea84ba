"""Pinned drivers on each host: ``pyinfra INVENTORY deploys/drivers.py`` (also a step of kimi.py).

kimi-deploy's own deploy (deploy_drivers in kimi_pyinfra/deploys/drivers.py), as installed.
"""

from kimi_pyinfra.deploys.drivers import deploy_drivers

deploy_drivers()
