"""The synthetic-scenes cache directory gets the permissions ``mkdir`` gives (0777 less the umask), as
every directory a user keeps: ``tempfile.mkdtemp``'s private 0700, kept through the rename, locked the
other users of a shared ``PATCHWORD_CACHE`` out of a dataset they would then fail to read or regenerate."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from patchword.data.synthetic import SyntheticConfig
from patchword.data.synthetic.dataset import SyntheticScenes


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_cache_directory_mode_follows_the_umask(tmp_path: Path) -> None:
    config = SyntheticConfig(seed=9, num_train=6, num_dev=4, num_test=4)
    SyntheticScenes.load_or_generate(config, tmp_path)
    target = tmp_path / f"synthetic-{config.cache_key()}"
    assert stat.S_IMODE(target.stat().st_mode) == 0o777 & ~_umask()
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no staging folder left behind
