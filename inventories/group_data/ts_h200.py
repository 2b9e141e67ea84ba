"""H200 hosts: bootstrap over the cluster interface, NCCL over eight InfiniBand ports."""

kimi_socket_ifname = "ens1f0"
kimi_rdma_devices = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"]
