"""What tests/ and bench/ share to drive the local clusters and the gateway's nginx: clusters of
their own (``own_cluster``), the all-reduce demo recipe, nginx run on loopback. Not part of the
installed package; deploys, operations and facts never import it."""
