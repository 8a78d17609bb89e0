"""``python -m patchword.bench ...`` (the fresh-process memory probe runs this way)."""

from patchword.bench.cli import main

raise SystemExit(main())
