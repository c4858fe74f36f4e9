"""Affidavit: the ``affidavit`` command line, assembled above the parts (:mod:`affidavit.cli`)."""
