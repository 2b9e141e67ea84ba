"""Engines' compile caches as artifacts: keyed by what invalidates them, made once, fanned out."""
