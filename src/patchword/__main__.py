"""``python -m patchword ...`` (and ``torchrun -m patchword ...``): the same command as ``patchword``."""

from patchword.cli.console import console_main

raise SystemExit(console_main())
