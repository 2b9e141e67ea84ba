"""The flag catalog extractor (``tools/extract_flag_catalog.py``), one module per stage: engine
profiles, wheel access, name resolution, constant evaluation, dataclass hints, argument
semantics, and the abstract interpreter over parser-building functions."""
