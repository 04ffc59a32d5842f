"""``python -m holdfast.pool`` runs ``holdfast-pool``."""

from holdfast.pool.cli import main

raise SystemExit(main())
