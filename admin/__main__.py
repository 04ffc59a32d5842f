"""``python -m holdfast.admin`` runs the ``holdfast`` command."""

from holdfast.admin.cli import main

raise SystemExit(main())
