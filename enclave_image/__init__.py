"""enclave_image."""
