"""egress_proxy."""
