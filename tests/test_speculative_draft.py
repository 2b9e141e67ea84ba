"""A speculative draft is a checkpoint of its own, pinned like the model: locked, synced and verified
before the engine starts, fanned out, kept for a rollback and collected, in the release's pins,
and handed to vLLM as its verified folder (the production recipe's gb300-pd: Kimi K3's DSpark)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimi_deploy.converge import plan as converge
from kimi_deploy.converge.plan import converge_request
from kimi_deploy.converge.rollback import RollbackError, plan_rollback
from kimi_deploy.errors import ConfigError
from kimi_deploy.hostside import state_probe
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import Draft, Recipe
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.releases.host_paths import checkpoint_dir, model_dir
from kimi_deploy.releases.servability import check_remote_code, refusals
from kimi_deploy.weights.hub_lock import remote_tokenizer
from kimi_deploy.weights.lockfile import Lock, LockedFile, lock_path, read_lock
from tests.conftest import RECIPE, ROOT
from tests.host_converge import LOCK, host_converge, lock_stands_in
from tests.host_converge import probe_answer as probe
from tests.test_converge_steps import _plans, steps_of

DRAFT_REPO = "Inferact/Kimi-K3-DSpark"
DRAFT_REVISION = "cf6b8244620e7ea4b0651d214f28e89eac75bed6"
DRAFT_FIELD = "topologies.gb300-pd.speculative.draft"


def _draft(recipe: Recipe) -> Draft:
    spec = recipe.topologies["gb300-pd"].speculative
    assert spec is not None
    assert spec.draft is not None
    return spec.draft


def _edited(tmp_path: Path, edit: Any) -> Path:
    data = yaml.safe_load((ROOT / RECIPE).read_text(encoding="utf-8"))
    edit(data)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.fixture
def stood_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example recipe's converge: its model's lock played by ``LOCK``, its API key set."""
    lock_stands_in(monkeypatch, LOCK)
    monkeypatch.setenv("KIMI_API_KEY", "sk-kimi-d41c9a0e77b2")


def _one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    line = str(exc.value)
    assert "\n" not in line
    return line


def test_the_production_draft_is_kimi_k3s_dspark_pin(recipe: Recipe) -> None:
    draft = _draft(recipe)
    assert (draft.repo, draft.revision, draft.shards, draft.architecture) == (
        DRAFT_REPO,
        DRAFT_REVISION,
        1,
        "K3DSparkModel",
    )
    # the model card's files at the pin: .gitattributes, LICENSE, README.md, config.json, model.safetensors
    assert draft.size_bytes == 1519 + 3065 + 6316 + 1251 + 7124633450
    assert recipe.checkpoints("gb300-pd") == (("model", recipe.model), (DRAFT_FIELD, draft))
    assert recipe.checkpoints("single-node") == (("model", recipe.model),)


@pytest.mark.usefixtures("stood_in")
def test_engine_hosts_sync_and_verify_both_checkpoints_before_the_engine_starts(
    recipe: Recipe, prod: Inventory
) -> None:
    folders = [model_dir(recipe), checkpoint_dir(recipe, _draft(recipe))]
    assert folders[1] == f"/srv/models/Inferact--Kimi-K3-DSpark/{DRAFT_REVISION}"
    plans = _plans(recipe, prod)
    new = {h: probe(todo, installed=False, running=False) for h, (_, todo) in plans.items()}
    for host in ("gb300-p01", "gb300-d01"):
        todo = plans[host][1]
        assert [c.path for c in todo.checkpoints] == folders
        request = converge_request(todo)
        assert [w["dir"] for w in request["weights"]] == folders
        assert request["models"] == [f.rsplit("/", 1)[0] for f in folders]
        steps = steps_of(host, plans, new)
        assert [(w.sync["repo"], w.sync["revision"], w.sync["dir"]) for w in steps.weights] == [
            (recipe.model.repo, recipe.model.revision, folders[0]),
            (DRAFT_REPO, DRAFT_REVISION, folders[1]),
        ]
        # both are fanned out: the first host fetches each from the Hub, the others from a peer
        assert all(w.peers if host != "gb300-p01" else w.serves for w in steps.weights)
    # a host whose draft alone is damaged repairs it, and its engine restarts once it is whole
    converged = {h: probe(todo) for h, (_, todo) in plans.items()}
    todo = plans["gb300-p01"][1]
    damaged = {"exists": True, "missing": [], "unverified": ["model.safetensors"], "unreadable": [], "extra": []}
    found = converged["gb300-p01"] | {"weights": converged["gb300-p01"]["weights"] | {folders[1]: damaged}}
    steps = steps_of("gb300-p01", plans, {**converged, "gb300-p01": found})
    assert [w.current for w in steps.weights] == [converged["gb300-p01"]["weights"][folders[0]], damaged]
    assert "kimi-vllm" in steps.restarting
    # the router's host holds neither
    assert plans["gb300-rt01"][1].checkpoints == ()


@pytest.mark.usefixtures("stood_in")
def test_the_drafts_revision_is_a_pin_of_the_release_and_is_linked_in_it(recipe: Recipe, prod: Inventory) -> None:
    todo = host_converge(recipe, prod, "gb300-p01")
    record = todo.release.record
    assert record["pins"]["model.revision"] == recipe.model.revision
    assert record["pins"][f"{DRAFT_FIELD}.revision"] == DRAFT_REVISION
    assert record["checkpoints"]["draft"] == {"repo": DRAFT_REPO, "revision": DRAFT_REVISION}
    assert todo.release.links["draft"] == checkpoint_dir(recipe, _draft(recipe))
    # another draft revision is another release
    other = _draft(recipe).model_copy(update={"revision": "2" * 40})
    spec = recipe.topologies["gb300-pd"].speculative.model_copy(update={"draft": other})  # type: ignore[union-attr]
    topo = recipe.topologies["gb300-pd"].model_copy(update={"speculative": spec})
    moved = recipe.model_copy(update={"topologies": {**recipe.topologies, "gb300-pd": topo}})
    again = host_converge(moved, prod, "gb300-p01")
    assert again.release.dir != todo.release.dir
    assert again.release.record["pins"][f"{DRAFT_FIELD}.revision"] == "2" * 40


@pytest.mark.usefixtures("stood_in")
def test_collection_keeps_the_drafts_served_and_rollback_revisions(recipe: Recipe, prod: Inventory) -> None:
    plans = _plans(recipe, prod)
    probed = {h: probe(todo) for h, (_, todo) in plans.items()}
    parent = checkpoint_dir(recipe, _draft(recipe)).rsplit("/", 1)[0]
    older, previous = "0" * 40, "1" * 40
    draft = {"present": sorted([older, previous, DRAFT_REVISION]), "history": [older, previous, DRAFT_REVISION]}
    found = probed["gb300-d01"] | {"revisions": probed["gb300-d01"]["revisions"] | {parent: draft}}
    collect = {c.parent: c for c in steps_of("gb300-d01", plans, {**probed, "gb300-d01": found}).collect}
    assert (collect[parent].keep, collect[parent].remove) == ([previous, DRAFT_REVISION], [older])
    # the model's folder is collected apart, by its own history
    model = model_dir(recipe).rsplit("/", 1)[0]
    assert (collect[model].keep, collect[model].remove) == ([recipe.model.revision], [])


def test_the_probe_reads_each_checkpoints_history_from_the_release_records(tmp_path: Path) -> None:
    """The rollback copy of a draft is the draft revision of the latest other release it served."""
    log = []
    for n, (model, draft) in enumerate([("a" * 40, None), ("a" * 40, "1" * 40), ("b" * 40, "2" * 40)]):
        folder = tmp_path / f"releases/r{n}"
        folder.mkdir(parents=True)
        served = {"model": {"repo": "org/model", "revision": model}}
        if draft is not None:
            served["draft"] = {"repo": "org/draft", "revision": draft}
        # the first, older than the record's checkpoints, says its model's revision only
        record = {"model": "org/model", "revision": model} | ({"checkpoints": served} if n else {})
        (folder / "release.json").write_text(json.dumps(record))
        log.append([f"t{n}", str(folder), "serving", f"run-{n}"])
    assert state_probe._revisions(str(tmp_path / "org--model"), log)["history"] == ["a" * 40, "a" * 40, "b" * 40]
    assert state_probe._revisions(str(tmp_path / "org--draft"), log)["history"] == ["1" * 40, "2" * 40]


def test_a_rollback_target_whose_draft_revision_is_gone_is_refused_naming_it(tmp_path: Path) -> None:
    """The bad day after a collection or a disk loss: the release to go back to links a model that
    is whole and a draft whose folder lost its verification; the probe says the release is not
    whole and the rollback refuses it in one line naming the draft, before anything changes."""
    old, new = tmp_path / "releases/old", tmp_path / "releases/new"
    model, draft = tmp_path / "models/org--model/" / ("a" * 40), tmp_path / "models/org--draft" / ("1" * 40)
    (model / ".kimi").mkdir(parents=True)
    (model / ".kimi/verify-cache.json").write_text("{}")
    draft.mkdir(parents=True)  # its files and verification gone
    served = {
        "model": {"repo": "org/model", "revision": "a" * 40},
        "draft": {"repo": "org/draft", "revision": "1" * 40},
    }
    record = {
        "engine": "vllm",
        "engine_version": "0.33.0",
        "model": "org/model",
        "revision": "a" * 40,
        "checkpoints": served,
        "files": [],
    }
    for folder in (old, new):
        folder.mkdir(parents=True)
        (folder / "release.json").write_text(json.dumps(record))
    (old / "model").symlink_to(model)
    (old / "draft").symlink_to(draft)
    log = [["t1", str(old), "switched", "r1"], ["t2", str(old), "serving", "r1"], ["t3", str(new), "switched", "r2"]]
    found = state_probe._releases(log)["records"][str(old)]
    assert found is not None
    assert found["model"] is False
    with pytest.raises(RollbackError) as caught:
        plan_rollback("gb300-d01", str(new), log, {str(old): found}, "r2")
    assert f"or org/draft@{'1' * 12} is gone" in str(caught.value)
    assert "\n" not in str(caught.value)
    # with the draft verified again, the same target is whole
    (draft / ".kimi").mkdir()
    (draft / ".kimi/verify-cache.json").write_text("{}")
    assert state_probe._releases(log)["records"][str(old)]["model"] is True  # type: ignore[index]


@pytest.mark.usefixtures("stood_in")
def test_a_peer_that_did_not_answer_is_left_out_of_each_checkpoints_fan_out(recipe: Recipe, prod: Inventory) -> None:
    """A host of the topology unreachable when the run probed (its probe raised): neither the model's
    nor the draft's chain counts on it, and every other host still fetches and verifies both."""
    plans = _plans(recipe, prod)
    probed: dict[str, Any] = {h: probe(todo, installed=False, running=False) for h, (_, todo) in plans.items()}
    probed["gb300-p02"] = OSError("gb300-p02: Could not connect (timed out)")
    chained = set()
    for host in plans:
        if host == "gb300-p02" or not plans[host][1].checkpoints:
            continue
        steps = steps_of(host, plans, probed)
        assert [w.sync["repo"] for w in steps.weights] == [recipe.model.repo, DRAFT_REPO]
        for w in steps.weights:
            assert "gb300-p02" not in {p["host"] for p in w.peers}
            assert "gb300-p02" not in (w.serves or ())
            chained |= {w.sync["repo"]} if w.peers else set()
    # the others still fetch both checkpoints from one another
    assert chained == {recipe.model.repo, DRAFT_REPO}


def test_vllm_gets_the_drafts_verified_folder_and_the_catalog_takes_it(recipe: Recipe, prod: Inventory) -> None:
    # plan() checks every flag of the unit against vLLM 0.33.0's catalog, and the method against its registry
    host = plan(recipe, RECIPE, prod, "gb300-pd").for_host("gb300-d01")
    (unit,) = host.units
    argv = list(unit.argv)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {
        "model": f"/srv/models/Inferact--Kimi-K3-DSpark/{DRAFT_REVISION}",
        "method": "dspark",
        "num_speculative_tokens": 7,
    }
    # vLLM 0.33.0 registers the draft's architecture as well as the model's
    assert refusals(recipe, RECIPE, ["gb300-pd"]) == {}


def test_dspark_without_a_draft_is_refused_in_one_line(tmp_path: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        del data["topologies"]["gb300-pd"]["speculative"]["draft"]

    with pytest.raises(ConfigError) as exc:
        load_recipe(_edited(tmp_path, edit))
    assert _one_line(exc).endswith(
        "topologies.gb300-pd: speculative: method dspark drafts with a checkpoint of its own: pin it as draft "
        "(repo, revision, shards, size_bytes, architecture, license); without one the engine would draft with "
        "the served checkpoint"
    )


def test_a_missing_draft_lock_is_refused_as_the_models_is(
    recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The production recipe has no committed lock for the model nor the draft (neither revision
    is reachable from here): the converge refuses either in the same line, naming the command."""
    stand_in = Lock(recipe.model.repo, recipe.model.revision, {"config.json": LockedFile(2, "gitblob:" + "0" * 40)})
    monkeypatch.setattr(converge, "read_lock", lambda c: stand_in if c.repo == recipe.model.repo else read_lock(c))
    monkeypatch.setenv("KIMI_API_KEY", "sk-kimi-d41c9a0e77b2")
    assert not lock_path(_draft(recipe)).exists()
    with pytest.raises(ConfigError) as exc:
        host_converge(recipe, prod, "gb300-p01")
    assert _one_line(exc) == (
        f"recipes/locks/Inferact--Kimi-K3-DSpark@{DRAFT_REVISION}.json: no lock for "
        f"{DRAFT_REPO}@{DRAFT_REVISION}: run `kimi-deploy lock RECIPE`"
    )
    # a host without the draft (another topology) needs no draft lock
    assert [c.link for c in host_converge(recipe, prod, "b300-01").checkpoints] == ["model"]


def test_a_draft_the_engine_release_does_not_register_is_refused_in_one_line(tmp_path: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["topologies"]["gb300-pd"]["speculative"]["draft"]["architecture"] = "K3DSparkModelV9"

    path = _edited(tmp_path, edit)
    found = refusals(load_recipe(path), str(path), ["gb300-pd"], tmp_path)
    line = str(found["gb300-pd"])
    assert "\n" not in line
    assert line.startswith(f"{path}: {DRAFT_FIELD}: vllm 0.33.0 does not register K3DSparkModelV9 (registers ")


def test_a_draft_on_an_engine_that_takes_none_is_refused_in_one_line(tmp_path: Path, prod: Inventory) -> None:
    def edit(data: dict[str, Any]) -> None:
        # TokenSpeed's unit passes no draft checkpoint
        data["topologies"]["tokenspeed-single"]["speculative"] = data["topologies"]["gb300-pd"]["speculative"]

    path = _edited(tmp_path, edit)
    with pytest.raises(ConfigError) as exc:
        plan(load_recipe(path), str(path), prod, "tokenspeed-single")
    assert _one_line(exc).startswith(
        f"{path}: topologies.tokenspeed-single.speculative.draft: tokenspeed 0.1.1 takes no draft"
    )


def test_a_tokenizer_of_remote_code_needs_trust_remote_code(tmp_path: Path) -> None:
    assert remote_tokenizer({"tokenizer_config": {"auto_map": {"AutoTokenizer": ["tokenization_kimi.T", None]}}})
    assert remote_tokenizer({"auto_map": {"AutoTokenizer": ["tokenization_kimi.T", None]}})
    assert not remote_tokenizer({"auto_map": {"AutoConfig": "configuration_kimi.C"}, "tokenizer_config": {}})

    def edit(data: dict[str, Any]) -> None:
        data["model"]["trust_remote_code"] = False

    path = _edited(tmp_path, edit)
    recipe = load_recipe(path)
    lock = Lock(
        recipe.model.repo,
        recipe.model.revision,
        {"config.json": LockedFile(2, "gitblob:" + "0" * 40)},
        tokenizer_remote_code=True,
    )
    where = lock_path(recipe.model, tmp_path)
    where.parent.mkdir(parents=True)
    where.write_text(lock.to_json(), encoding="utf-8")
    assert read_lock(recipe.model, tmp_path).tokenizer_remote_code is True
    with pytest.raises(ConfigError) as exc:
        check_remote_code(recipe, str(path), tmp_path)
    assert _one_line(exc) == (
        f"{path}: model.trust_remote_code: moonshotai/Kimi-K3.1-Pro@{recipe.model.revision[:12]}'s tokenizer is "
        f"code of its own (auto_map AutoTokenizer, {where}): set trust_remote_code: true, the revision pinned, "
        "or serve another checkpoint"
    )
    # validate refuses it the same way
    with pytest.raises(ConfigError):
        refusals(recipe, str(path), ["gb300-pd"], tmp_path)
