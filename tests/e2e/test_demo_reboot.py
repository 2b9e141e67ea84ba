"""A host of a multi-host instance reboots: the demo's SGLang instance spans kimi-h3 (its leader,
which serves the API) and kimi-h4 (its worker). Every unit the deploy starts is enabled, so the
rebooted host starts its engine by itself: a worker waits for its leader's rendezvous port, a
leader serves once its workers meet it. The instance answers again with no converge, and the next
converge finds each unit running the release it was verified with: no step.

The stand-in engine models the rendezvous, not the loss of a collective: whether a real engine
exits when a peer reboots under it (and is then started again by the units' ``Restart=on-failure``)
is not held here. A real engine's own reboot is: tests/e2e/test_demo_real.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

from harness.interrupted import rebooted
from tests.e2e.demo import address, chat, pyinfra, ssh

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

PROMPT = "Reply with exactly the word READY and nothing else."


@pytest.fixture(scope="module")
def converged(demo_cluster: None) -> None:
    run = pyinfra()
    assert run.code == 0, run.log[-3000:]


def _serves() -> bool:
    """The instance answers through its leader's API, and its worker met the leader on this boot."""
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
        answer = chat(f"http://{address('kimi-h3')}:30000", PROMPT)["choices"][0]["message"]["content"]
        joined = ssh("kimi-h4", "journalctl -b -u kimi-sglang --no-pager -o cat | grep -c 'ready: worker' || true")
        return answer == "READY" and int(joined or 0) > 0
    return False


@pytest.mark.parametrize("host", ["kimi-h4", "kimi-h3"])
def test_a_rebooted_host_of_a_multi_host_instance_serves_again_by_itself_and_the_next_converge_changes_nothing(
    converged: None, host: str
) -> None:
    took = rebooted(lambda command: ssh(host, command), _serves)
    assert took is not None, f"the instance did not serve within 300 s of {host}'s reboot"
    print(f"{host} rebooted: the SGLang instance served again {took:.0f} s after the reboot began")
    assert ssh(host, "systemctl is-active kimi-sglang") == "active"
    noop = pyinfra()
    assert noop.code == 0, noop.log[-3000:]
    assert noop.changed() == {}, noop.changed()
