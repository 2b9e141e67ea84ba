"""Benchmark the served endpoint as clients use it: ``pyinfra INVENTORY deploys/bench.py -y``.

kimi-deploy's own deploy (deploy_bench in kimi_pyinfra/deploys/bench.py), as installed.
"""

try:
    from kimi_pyinfra.deploys.bench import deploy_bench
except ModuleNotFoundError as exc:  # a pyinfra of another installation, without kimi-deploy
    if exc.name not in ("kimi_pyinfra", "kimi_pyinfra.deploys"):
        raise
    raise SystemExit(
        "deploys/bench.py: this pyinfra has no kimi-deploy: run `kimi-deploy converge INVENTORY --deploy bench`"
        " (the pyinfra installed beside kimi-deploy), or that installation's pyinfra"
    ) from None

deploy_bench()
