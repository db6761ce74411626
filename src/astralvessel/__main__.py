"""``python -m astralvessel``: the same as the ``astralvessel`` command."""

import sys

from .cli import main

sys.exit(main())
