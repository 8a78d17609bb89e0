"""``python -m patchword ...`` (and ``torchrun -m patchword ...``): the same command as ``patchword``."""

from patchword.cli import main

raise SystemExit(main())
