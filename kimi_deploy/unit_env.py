"""Environment every engine unit shares, whatever the engine: offline Hub, quiet telemetry, NICs."""

from __future__ import annotations

from kimi_deploy.placement import Placement


def common_env(placement: Placement) -> dict[str, str]:
    """Variables for an engine process on ``placement``'s host.

    Weights are local and verified before start, so the Hub client runs offline: an engine that
    tried to download at start would bypass the lock. The bootstrap interface and RDMA devices come
    from host data so NCCL and Gloo never guess (a wrong guess hangs at init).
    """
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "DO_NOT_TRACK": "1",
    }
    host_vars = placement.host.vars
    nvidia = placement.topology.accelerators.vendor == "nvidia"
    # Gloo is torch.distributed's: a TPU engine runs on JAX (sglang-jax installs no torch), whose
    # hosts meet through its coordinator (--dist-init-addr) and the TPU runtime.
    torch = placement.topology.accelerators.vendor != "tpu"
    if host_vars.kimi_socket_ifname and torch:
        env["GLOO_SOCKET_IFNAME"] = host_vars.kimi_socket_ifname
        if nvidia:
            env["NCCL_SOCKET_IFNAME"] = host_vars.kimi_socket_ifname
    if host_vars.kimi_rdma_devices and nvidia:
        env["NCCL_IB_HCA"] = ",".join(host_vars.kimi_rdma_devices)
    env.update(placement.topology.env)
    return env
