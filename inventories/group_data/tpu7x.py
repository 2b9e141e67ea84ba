"""TPU 7x hosts: the slice's data-center network interface."""

kimi_socket_ifname = "ens8"
