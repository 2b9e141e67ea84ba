"""Rendering: the files a host gets (units, environment, engine and gateway configs) and what they emit."""
