"""Engine releases: their venvs, locks per host platform, flag catalogs, the host platforms they install on."""
