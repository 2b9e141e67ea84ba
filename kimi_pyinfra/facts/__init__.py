"""pyinfra facts: read host state, one probe round-trip per host."""
