"""kimi-deploy's side of pyinfra: the command line, one run's context, and the plan as each host's
deploy sees it. The pure core (``kimi_deploy``) knows nothing of pyinfra; facts, operations and
deploys reach per-run state only through ``kimi_pyinfra.run_context.run_context``."""
