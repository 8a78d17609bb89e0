"""``python -m patchword.bench ...`` (the fresh-process memory probe runs this way)."""

from patchword.cli.bench import main

raise SystemExit(main())
