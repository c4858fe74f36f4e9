"""``python -m affidavit``: the same command line as the ``affidavit`` script."""

import sys

from affidavit.cli import main

sys.exit(main())
