"""GB300 trays: NCCL/Gloo bootstrap over the cluster bond, KV cache over four ConnectX-8 ports."""

kimi_socket_ifname = "bond0"
kimi_rdma_devices = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
