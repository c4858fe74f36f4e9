"""measurements."""
