"""The control plane's ``.proto`` and the Python code generated from it (``generate``)."""
