"""What a host program run from inside an operation (a ``FunctionCommand``) runs with."""

from __future__ import annotations

from typing import Any

from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.context import host


def connector_arguments() -> dict[str, Any]:
    """The connector arguments of the operation being made (``_sudo``, ``_su_user``, ...), for a
    command it runs itself when it runs: as pyinfra runs a shell command the operation yields."""
    given: dict[str, Any] = dict(host.current_op_global_arguments or {})
    return {key: given[key] for key in CONNECTOR_ARGUMENT_KEYS if key in given}
