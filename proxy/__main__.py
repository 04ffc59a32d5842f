"""``python -m holdfast.proxy``: the same as ``holdfast-proxy``."""

import sys

from holdfast.proxy.cli import main

sys.exit(main())
