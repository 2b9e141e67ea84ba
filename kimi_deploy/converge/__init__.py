"""A host's converge: what it makes true, its steps decided from the probe, drift, rollback, drills."""
