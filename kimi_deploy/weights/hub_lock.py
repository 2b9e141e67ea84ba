"""Making a lock from the Hub's metadata (huggingface_hub), without downloading any file."""

from __future__ import annotations

import re
from collections.abc import Mapping

from kimi_deploy.errors import ConfigError
from kimi_deploy.hostside.boundary_names import BadName, check_name
from kimi_deploy.hostside.hub_access import GATED_ERROR, HUB, gated_line, token_line
from kimi_deploy.recipe import Checkpoint
from kimi_deploy.weights.hub_token import controller_token
from kimi_deploy.weights.lockfile import Lock, LockedFile, read_config

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def remote_tokenizer(config: Mapping[str, object]) -> bool:
    """Whether the Hub's model info ``config`` (config.json's fields, and tokenizer_config.json's
    under ``tokenizer_config``) names a tokenizer class of the checkpoint's own: an ``auto_map``
    with an ``AutoTokenizer``, which transformers loads only with ``trust_remote_code``."""
    tokenizer = config.get("tokenizer_config")
    maps = [config.get("auto_map"), tokenizer.get("auto_map") if isinstance(tokenizer, Mapping) else None]
    return any(isinstance(m, Mapping) and m.get("AutoTokenizer") for m in maps)


def make_lock(
    checkpoint: Checkpoint,
    recipe_file: str,
    endpoint: str | None = None,
    environ: Mapping[str, str] | None = None,
    field: str = "model",
) -> Lock:
    """List every file of ``checkpoint``'s pinned revision (the recipe's ``field``: the model, a
    draft) with its size and digest, with config.json's ``architectures`` and ``model_type`` as the
    Hub shows them in the revision's model info, and whether its tokenizer is remote code
    (``remote_tokenizer``).

    Every name of the listing is checked by ``hostside.boundary_names.check_name``: a listing with
    a name that could leave the revision folder (``..``, ``/etc/passwd``, ...) makes no lock.
    The token, if any, comes from the environment or huggingface_hub's token file, never argv
    (huggingface_hub reads them; the command line turns its telemetry and Xet off before). A
    listing the Hub refuses for a gated repository, or for a token it no longer takes, is said in
    the lines the hosts' sync uses (``hostside.hub_access``); ``environ`` (the controller's) tells
    whether a token was sent.
    """
    if not _COMMIT.match(checkpoint.revision):
        raise ConfigError(
            recipe_file, f"{field}.revision", f"a lock needs a 40-hex commit, found {checkpoint.revision!r}"
        )
    # huggingface_hub's HTTP client (its dependency): a Hub that cannot be reached raises its
    # transport errors, which are not OSError
    from httpx2 import TransportError  # noqa: PLC0415
    from huggingface_hub import HfApi  # noqa: PLC0415 - heavy import, only for this command
    from huggingface_hub.errors import HfHubHTTPError  # noqa: PLC0415
    from huggingface_hub.hf_api import RepoFile  # noqa: PLC0415
    from huggingface_hub.utils import logging as hub_logging  # noqa: PLC0415

    # the client's own line per retry ("Retrying in 8s [Retry 4/5]") stays out: a Hub that cannot
    # be reached is said once, in the error below
    hub_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    api = HfApi(endpoint=endpoint)
    pinned = f"{checkpoint.repo}@{checkpoint.revision}"
    where = endpoint or "the Hub"

    def _said(exc: HfHubHTTPError) -> str:
        status = exc.response.status_code if exc.response is not None else None
        if type(exc).__name__ == GATED_ERROR:
            return gated_line(checkpoint.repo, endpoint or HUB, status)
        if status == 401 and controller_token(environ or {}) is not None:
            return token_line(endpoint or HUB, None)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"

    try:
        entries = list(api.list_repo_tree(checkpoint.repo, revision=checkpoint.revision, recursive=True))
    except HfHubHTTPError as exc:
        raise ConfigError(recipe_file, field, f"{where}: {pinned}: {_said(exc)}") from None
    except (OSError, TransportError) as exc:
        raise ConfigError(recipe_file, field, f"{where} unreachable: {exc}") from None
    files: dict[str, LockedFile] = {}
    for entry in entries:
        if not isinstance(entry, RepoFile):
            continue
        try:
            # Each name becomes a path the hosts write and delete as root.
            check_name(entry.path)
        except BadName as exc:
            raise ConfigError(recipe_file, field, f"{where}: {pinned}: {exc}") from None
        if entry.lfs is not None:
            files[entry.path] = LockedFile(entry.lfs.size, f"sha256:{entry.lfs.sha256}")
        else:
            files[entry.path] = LockedFile(entry.size, f"gitblob:{entry.blob_id}")
    shards = [p for p in files if p.endswith(".safetensors")]
    if len(shards) != checkpoint.shards:
        raise ConfigError(
            recipe_file,
            f"{field}.shards",
            f"{pinned} has {len(shards)} shards, expected {checkpoint.shards}",
        )
    architectures: tuple[str, ...] = ()
    model_type: str | None = None
    remote: bool | None = None
    if "config.json" in files:
        # config.json's architectures and model_type, as the Hub shows them in the revision's model info
        try:
            shown_config = api.model_info(checkpoint.repo, revision=checkpoint.revision, expand=["config"]).config or {}
        except HfHubHTTPError as exc:
            raise ConfigError(recipe_file, field, f"{where}: {pinned}: {_said(exc)}") from None
        except (OSError, TransportError) as exc:
            raise ConfigError(recipe_file, field, f"{where} unreachable: {exc}") from None
        fields = {k: shown_config[k] for k in ("architectures", "model_type") if k in shown_config}
        architectures, model_type, _ = read_config(f"{where}: {pinned}: config.json", fields)
        # recorded where it is so: a lock without it is a tokenizer transformers ships (or one
        # made before it was recorded)
        remote = remote_tokenizer(shown_config) or None
    return Lock(
        repo=checkpoint.repo,
        revision=checkpoint.revision,
        files=files,
        architectures=architectures,
        model_type=model_type,
        tokenizer_remote_code=remote,
    )
