"""``python -m tests.fakes.hub``: the local Hub in its own process (see the package docstring)."""

import sys

from tests.fakes.hub.server import main

sys.exit(main())
