"""kimi-deploy's deploys, as pyinfra ``@deploy`` functions: each ``deploys/<name>.py`` a user runs
(``pyinfra INVENTORY deploys/kimi.py``, written by ``kimi-deploy init``) calls one of them."""
