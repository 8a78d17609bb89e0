"""Keys a new hashing run refuses for settings that would not use them (``train.hashnet_alpha`` with
``train.loss=infonce``) and loss weights that train nothing: :func:`check_used_keys`, checked before
anything is written. A trained run's own config.yaml is not checked (runs saved before may hold such a
value, and their keys cannot change)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, NamedTuple

from patchword.config import flat_config
from patchword.errors import ConfigError
from patchword.hashing.config import HashRunConfig

__all__ = ["ReadBy", "USED_ONLY_WITH", "check_used_keys"]


class ReadBy(NamedTuple):
    """A setting whose ``values`` read a key (``other_than``: each value but ``values`` reads it), while
    each condition of ``also`` holds too (HashNet's scale: ``train.loss=hashnet`` and a codes' term)."""

    setting: str
    values: tuple[Any, ...]
    other_than: bool = False
    also: tuple[ReadBy, ...] = ()

    def failing(self, values: dict[str, Any]) -> list[ReadBy]:
        """The conditions (this one, then those of ``also``) that the flat config ``values`` miss."""
        own = [] if (values[self.setting] in self.values) != self.other_than else [self._replace(also=())]
        return own + [miss for cond in self.also for miss in cond.failing(values)]

    def spell(self) -> str:
        """``train.loss=hashnet``, ``train.optimizer=adam or train.optimizer=adamw``, ``a train.feature_weight
        other than 0``, ``train.loss=hashnet with a train.hash_weight other than 0``."""
        if self.other_than:
            own = f"a {self.setting} other than {' or '.join(str(v) for v in self.values)}"
        else:
            own = " or ".join(f"{self.setting}={value}" for value in self.values)
        return " with ".join([own, *(cond.spell() for cond in self.also)])


#: The codes' term is read only while its weight is not 0 (train.hash_weight=0 trains the features alone).
_CODES_TERM = ReadBy("train.hash_weight", (0,), other_than=True)

#: Keys only some settings read: key -> (the settings that read it, any one of them enough; what the key
#: is). Given while none of them reads it, the key was accepted and never used. ``train.temperature`` is
#: InfoNCE's: the codes' term of every loss but HashNet's, and the features' term (any loss) while its
#: weight is not 0. ``model.eval_batch_size`` sizes the blocks of the fused encoder's evaluation only (a
#: unimodal model encodes each sample alone).
USED_ONLY_WITH: dict[str, tuple[tuple[ReadBy, ...], str]] = {
    "train.hashnet_alpha": (
        (ReadBy("train.loss", ("hashnet",), also=(_CODES_TERM,)),),
        "the HashNet loss's scale",
    ),
    "train.betas": ((ReadBy("train.optimizer", ("adam", "adamw")),), "Adam's moment decay rates"),
    "train.temperature": (
        (
            ReadBy("train.loss", ("hashnet",), other_than=True),
            ReadBy("train.feature_weight", (0,), other_than=True),
        ),
        "the contrastive losses' temperature",
    ),
    "model.eval_batch_size": (
        (ReadBy("model.fusion", ("official_fused",)),),
        "the pairs of one evaluation block, which attend to each other",
    ),
}


def check_used_keys(cfg: HashRunConfig, given: Collection[str] = (), *, only_given: bool = False) -> None:
    """Each key of :data:`USED_ONLY_WITH` the user gave is one the chosen settings use:
    ``train.hashnet_alpha`` with ``train.loss=infonce`` or ``train.hash_weight=0``, ``train.betas`` with
    ``train.optimizer=sgd``, ``train.temperature`` with ``train.loss=hashnet`` and ``train.feature_weight=0``,
    ``model.eval_batch_size`` with ``model.fusion=unimodal`` were accepted and silently unused. Checked by a
    new run (``hash train``, :func:`train_hashing`), before anything is written; a trained run's own
    config.yaml (resumed or evaluated) is not, as runs saved before this check may hold such a value and
    their keys cannot change. A new run's loss weights must train something too (:func:`_check_weights`).

    Given: a key in ``given`` (the keys the command line set, at any value) or one whose value differs from
    its default (set by a config file or in code). A default is never refused: a config.yaml holds every key,
    and ``--config`` reads a run's back (``--config RUN/config.yaml train.optimizer=sgd`` keeps its betas).
    ``only_given``: the keys in ``given`` alone (the overrides of a trained run's evaluation: its own
    config.yaml's values are not the command's).

    Raises:
        ConfigError: naming the key, the settings that would ignore it and the values that use it; for
            weights that train nothing, ``train.hash_weight`` (both 0) or ``train.loss`` (hashnet's term
            dropped).
    """
    values, defaults = flat_config(cfg), flat_config(HashRunConfig())
    for key, (readers, what) in USED_ONLY_WITH.items():
        given_key = key in given or (not only_given and values[key] != defaults[key])
        missing = [r.failing(values) for r in readers]
        if given_key and all(missing):
            spell = " or ".join(r.spell() for r in readers)
            settings = dict.fromkeys(cond.setting for conds in missing for cond in conds)
            now = " with ".join(f"{setting}={values[setting]}" for setting in settings)
            fix = " or ".join(" with ".join(cond.spell() for cond in conds) for conds in missing)
            raise ConfigError(
                key, f"is used by {spell} only ({what}); {now} would ignore it: drop it or set {fix}"
            )
    if not only_given:  # after the keys: train.hashnet_alpha with train.hash_weight=0 is named as unused
        _check_weights(values)


def _check_weights(values: dict[str, Any]) -> None:
    """A new run's loss trains something: both weights 0 was a loss of 0 (no update, exit 0), and HashNet
    is the codes' term alone (its feature term is InfoNCE's), which ``train.hash_weight=0`` drops."""
    if values["train.hash_weight"] == 0 and values["train.feature_weight"] == 0:
        raise ConfigError(
            "train.hash_weight",
            "0 with train.feature_weight=0 too: the loss is 0 and nothing is trained; give either a weight",
        )
    if values["train.hash_weight"] == 0 and values["train.loss"] == "hashnet":
        raise ConfigError(
            "train.loss",
            "hashnet is the loss of the codes' term, which train.hash_weight=0 drops (the feature term is "
            "InfoNCE, as with train.loss=infonce): drop train.loss or give train.hash_weight > 0",
        )
