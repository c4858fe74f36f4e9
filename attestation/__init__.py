"""attestation."""
