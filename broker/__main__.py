"""``python -m holdfast.broker``: the same as ``holdfast-broker``."""

import sys

from holdfast.broker.cli import main

sys.exit(main())
