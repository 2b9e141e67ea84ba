"""Weights: a revision's lock, the Hub, fan-out between hosts, collection of old revisions."""
