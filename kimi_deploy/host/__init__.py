"""Hosts: the programs the controller runs there, what their probes read, the profile and its gates."""
