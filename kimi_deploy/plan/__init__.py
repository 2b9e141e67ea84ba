"""The plan: recipe x inventory -> each host's place in its topology and the units it runs."""
