"""Programs run ON the hosts with the host's python3: stdlib only, one round-trip each, JSON out."""
