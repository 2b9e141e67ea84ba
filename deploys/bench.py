"""Benchmark the served endpoint as clients use it: ``pyinfra INVENTORY deploys/bench.py -y``.

kimi-deploy's own deploy (deploy_bench in kimi_pyinfra/deploys/bench.py), as installed.
"""

from kimi_pyinfra.deploys.bench import deploy_bench

deploy_bench()
