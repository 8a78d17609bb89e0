"""Where a run's data comes from and how its text is tokenised: the ``data`` section of a run config."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from patchword.errors import ConfigError

__all__ = ["DataConfig", "DEFAULT_BERT_VOCAB", "EVERY_DATASET_KEYS", "FILE_DATASETS", "PATH_KEYS", "READ_BY"]
__all__ += ["absolute_path", "local_path", "require_path"]

#: The BERT vocabulary of a ``data`` section whose ``bert_vocab`` is empty when no text backbone names one.
DEFAULT_BERT_VOCAB = "bert-base-uncased"

#: Datasets whose images are files (``data.dev_from_train`` and ``data.check_images`` apply).
FILE_DATASETS = ("laps", "karpathy")

#: The keys that name files or directories (``vocab_path``, ``bert_vocab``: or a shipped name, a hub id).
PATH_KEYS = ("root", "image_root", "dense_train", "dense_dev", "dense_test", "cache_dir")

_SYNTHETIC = ("synthetic", "synthetic_regions")
#: The ``data.*`` keys every dataset takes: read by all (split names, tokenizer and vocabulary, caption
#: length; ``dense``, a switch the model's settings are checked against), or about the machine rather than
#: the data (``num_workers``, ``cache_dir``: a config shared by several datasets may set them).
EVERY_DATASET_KEYS = (
    "dataset",
    "train_split",
    "dev_split",
    "test_split",
    "dense",
    "tokenizer",
    "bert_vocab",
    "max_caption_len",
    "size_augment",
    "vocab_path",
    "vocab_min_count",
    "word_split",
    "num_workers",
    "cache_dir",
)
#: The datasets that read each other ``data.*`` key (from the readers in :mod:`patchword.data.prepare` and
#: the generator's config, :meth:`DataConfig.synthetic_config`): set on another dataset to another value
#: than its default, a key would be recorded in the run's config.yaml and change nothing
#: (:meth:`DataConfig.refuse_unread_settings`).
READ_BY: dict[str, tuple[str, ...]] = {
    "root": ("laps", "karpathy", "precomp"),
    "image_root": FILE_DATASETS,
    "dense_train": FILE_DATASETS,
    "dense_dev": FILE_DATASETS,
    "dense_test": FILE_DATASETS,
    "captions_per_image": ("laps", "precomp"),  # files with one id or feature row per image
    "dev_from_train": FILE_DATASETS,
    "check_images": FILE_DATASETS,
    "skip_bad_images": FILE_DATASETS,
    "exif_orientation": FILE_DATASETS,
    "image_size": FILE_DATASETS,  # the scenes: synthetic_image_size; region features: no pixels
    "max_dense_len": ("synthetic", *FILE_DATASETS),  # region features have no dense text
    "synthetic_seed": _SYNTHETIC,
    "synthetic_image_size": _SYNTHETIC,  # synthetic_regions: the scenes its regions are drawn from
    "synthetic_scenes": _SYNTHETIC,
    "num_train": _SYNTHETIC,
    "num_dev": _SYNTHETIC,
    "num_test": _SYNTHETIC,
    "dense_omit_prob": _SYNTHETIC,
    "dense_wrong_attr_prob": _SYNTHETIC,
    "mmap": ("precomp",),
    "region_boxes": ("precomp",),
    "num_regions": ("synthetic_regions",),
    "region_dim": ("synthetic_regions",),
    "boxes_per_object": ("synthetic_regions",),
    "region_noise": ("synthetic_regions",),
}


@dataclass
class DataConfig:
    """Where the data comes from and how text is tokenised."""

    # synthetic | laps (LAPS/SEPS layout) | karpathy (dataset_*.json) | precomp (SCAN region features:
    # {split}_ims.npy + {split}_caps.txt) | synthetic_regions (the synthetic scenes as region features)
    dataset: Literal["synthetic", "laps", "karpathy", "precomp", "synthetic_regions"] = "synthetic"
    root: str = ""  # laps: dir of {split}_ids.txt, _caps.txt; karpathy: dataset_*.json; precomp: npy dir
    image_root: str = ""  # directory holding the image files (real datasets)
    dense_train: str = ""  # laps: dense-caption jsonl of the train split (image order)
    dense_dev: str = ""  # laps: dense-caption jsonl of the dev split
    dense_test: str = ""  # laps: dense-caption jsonl of the test split
    # laps / precomp: the captions of each image where the files give one id (or feature row) per image
    # (the official loaders hard-code 5), exactly: more or fewer are refused, since an ids or features file
    # of only part of the images, or a captions file cut short, would shift every caption onto another
    # image; as many distinct ids (or rows) as captions is one caption per image, so it needs 1 here.
    # Ids or rows repeated per caption group the captions themselves (any count per image). Other datasets
    # say which image each caption describes: set there, it is refused (runs.checks)
    captions_per_image: int = 5
    dev_from_train: int = 0  # real datasets: hold out this many training images (with their captions and
    # dense captions) as the dev split instead of reading dev_split; the SEPS release has no dev dense text
    check_images: bool = True  # real datasets: decode every image file completely before training or
    # evaluating (finds missing, empty, non-image, truncated and damaged files before anything is written)
    skip_bad_images: bool = False  # real datasets: leave the files check_images finds unusable out of the
    # split, with their captions and dense captions (logged with the count), instead of refusing the split
    exif_orientation: bool = False  # real datasets: turn each image upright as its EXIF orientation tag
    # says (phone photos stored sideways), as a browser shows it; off, the pixels are read as stored, as the
    # official loaders read the benchmark datasets (COCO has files with the tag, trained on as stored)
    train_split: str = "train"  # split names as the dataset spells them
    dev_split: str = "dev"
    test_split: str = "test"
    dense: bool = True  # feed dense (MLLM) captions to the matcher
    tokenizer: Literal["word", "bert"] = "word"  # word (vocabulary built from the training text) | bert
    # tokenizer=bert: a local dir / vocab file / hub id; "" = the text backbone's own (model.hf_text), which a
    # new run writes in its place into its config.yaml (this section alone, with no model: bert-base-uncased)
    bert_vocab: str = ""
    max_caption_len: int = 40  # tokens, specials included; the same in training and evaluation
    max_dense_len: int = 128  # tokens of a dense caption, specials included
    size_augment: bool | None = None  # the official train-time caption augmentation (tokenizer=bert: 20%
    # of the words masked, replaced or deleted; dense captions too, as SEPS does); None = on for bert
    image_size: int = 224  # real datasets: input resolution
    num_workers: int = 4  # image files: DataLoader worker processes decoding training batches, per training
    # process and at most its CPUs (0 = decode in the training process); in-memory and region data: none
    cache_dir: str = ""  # synthetic data cache ("" = $PATCHWORD_CACHE or ~/.cache/patchword)
    synthetic_seed: int = 0  # synthetic scenes: generator seed
    synthetic_image_size: int = 64  # synthetic scenes: image side in pixels
    # synthetic scenes: generator preset (SCENE_PRESETS): simple (1-4 objects, the first generator) |
    # cluttered (5-9 objects, captions name a subset, distractors sharing colour or shape)
    synthetic_scenes: Literal["simple", "cluttered"] = "simple"
    num_train: int = 10000  # synthetic scenes: training images (5 captions each)
    num_dev: int = 1000  # synthetic scenes: dev images
    num_test: int = 1000  # synthetic scenes: test images
    dense_omit_prob: float = 0.15  # synthetic dense captions: probability an object is left out
    dense_wrong_attr_prob: float = 0.1  # synthetic dense captions: probability of a wrong attribute
    vocab_path: str = ""  # tokenizer=word: a SCAN-format vocabulary json, or pretrained encoders (a directory
    # or shipped name, see model.tiny_pretrained) whose vocabulary to use ("" = build from the train text)
    vocab_min_count: int = 1  # tokenizer=word: keep words seen this often in training text (SCAN: 4)
    # tokenizer=word, a vocabulary built from the training text: how texts are cut into words, recorded in
    # its vocab.json (a data.vocab_path vocabulary keeps its own): alnum (letters and digits) | treebank
    # (nltk's, as SCAN) | unicode (alnum with NFC, combining marks kept in words, CJK one ideograph a word)
    word_split: Literal["alnum", "treebank", "unicode"] = "alnum"
    mmap: bool = True  # precomp: memory-map {split}_ims.npy instead of loading it
    region_boxes: bool = False  # precomp: append each region's normalised box from {split}_boxes.npy
    # (N_img, R, 4) to its feature, for a region encoder that encodes boxes (model.precomp.post.box_encoding)
    num_regions: int = 36  # synthetic_regions: regions per image
    region_dim: int = 256  # synthetic_regions: feature width
    boxes_per_object: int = 3  # synthetic_regions: regions per object
    region_noise: float = 0.3  # synthetic_regions: norm of the noise added to every region

    def __post_init__(self) -> None:
        if self.captions_per_image < 1:
            raise ConfigError("data.captions_per_image", f"must be at least 1, got {self.captions_per_image}")

    def check_values(self) -> None:
        """What can be checked of this section alone, before anything is read or written (``patchword data
        check`` and ``data export synthetic`` run it; training's config check checks the same ranges):
        the ranges of its numbers, the keys its dataset reads nothing of (:meth:`refuse_unread_keys`) and,
        for the synthetic scenes, the generator's values (:meth:`synthetic_config`: split sizes, at most
        :data:`~patchword.data.synthetic.config.MAX_SPLIT_IMAGES`).

        Raises:
            ConfigError: naming the ``data.*`` key.
        """
        from patchword._validation import check_at_least

        for key, low in (
            ("num_workers", 0),
            ("max_caption_len", 3),
            ("max_dense_len", 3),
            ("dev_from_train", 0),
            ("image_size", 1),
        ):
            check_at_least(f"data.{key}", getattr(self, key), low)
        self.refuse_unread_keys()
        if self.dataset in ("synthetic", "synthetic_regions"):
            self.synthetic_config()

    def refuse_unread_keys(self) -> None:
        """Keys that nothing would read for this dataset, yet a run's config would record, and settings that
        need another one.

        Raises:
            ConfigError: naming the key (``data.dev_from_train`` on the synthetic scenes, which have a dev
                split).
        """
        if self.dataset not in FILE_DATASETS:
            dense = (
                "brings its own dense text"
                if self.dataset == "synthetic"
                else "has region features, no dense text"
            )
            why = {
                "dev_from_train": "has a dev split",
                **{f"dense_{r}": dense for r in ("train", "dev", "test")},
            }
            for key, reason in {**why, "skip_bad_images": "has no image files"}.items():
                if getattr(self, key):
                    raise ConfigError(
                        f"data.{key}",
                        f"applies to image-file datasets (laps, karpathy); {self.dataset} {reason}",
                    )
        if self.vocab_path and self.vocab_min_count != 1:
            raise ConfigError(
                "data.vocab_min_count",
                "counts the training text's words to build a vocabulary; data.vocab_path brings its own "
                "(leave one of them out)",
            )
        if self.skip_bad_images and not self.check_images:
            raise ConfigError(
                "data.skip_bad_images",
                "needs data.check_images=true: the unusable files are found by decoding every image first",
            )

    def unread_settings(self, keys: Iterable[str] | None = None) -> list[str]:
        """The ``data.*`` keys (of ``keys``, dotted or bare; default all) that this section sets to another
        value than the default while its dataset reads them not (:data:`READ_BY`), in that table's order."""
        names = None if keys is None else {key.removeprefix("data.") for key in keys}
        return [
            key
            for key, readers in READ_BY.items()
            if (names is None or key in names)
            and self.dataset not in readers
            and getattr(self, key) != _DEFAULTS[key]
        ]

    def refuse_unread_settings(self, keys: Iterable[str] | None = None) -> None:
        """Refuse a key its dataset never reads (:meth:`unread_settings`) set to another value than its
        default: it would be recorded in the run's config.yaml and change nothing (``data.num_train=5`` on
        LAPS files). Compared with the dataclass default, so a config that writes every key out (a run's
        config.yaml) passes as long as it sets none.

        Run when the user sets the keys: at the first start of a run (its whole config) and on the overrides
        of an evaluation (``keys``: the keys they set); never on a saved run's config.yaml as such, which an
        older version may have written with such a key (it must still resume and evaluate).

        :meth:`refuse_unread_keys` comes first (it says why of a few keys, and every data load runs it).

        Raises:
            ConfigError: naming the first such key and the datasets that read it.
        """
        self.refuse_unread_keys()
        unread = self.unread_settings(keys)
        if unread:
            key = unread[0]
            raise ConfigError(
                f"data.{key}",
                f"is read by data.dataset={' or '.join(READ_BY[key])}, not {self.dataset}: set to "
                f"{getattr(self, key)!r} it would be recorded and change nothing; leave it out (or set "
                f"its default, {_DEFAULTS[key]!r})",
            )

    def refuse_unread_overrides(self, saved: DataConfig) -> None:
        """:meth:`refuse_unread_settings` on the keys whose value differs from ``saved``: those an
        evaluation's overrides set on a run whose config.yaml gave ``saved`` (whatever the form of the
        override: ``data.num_train=5`` or ``data={num_train: 5}``).

        Raises:
            ConfigError: naming the first such key and the datasets that read it.
        """
        fields = (f.name for f in dataclasses.fields(self))
        self.refuse_unread_settings([key for key in fields if getattr(self, key) != getattr(saved, key)])

    def check_word_split(self, vocabulary_split: str) -> None:
        """A ``data.word_split`` set against a ``data.vocab_path`` vocabulary that cuts words by
        ``vocabulary_split`` (the vocabulary keeps its own rule: the setting could not take effect; the
        default ``alnum`` stands for "the vocabulary's own").

        Raises:
            ConfigError: naming ``data.word_split``.
        """
        if self.word_split != "alnum" and self.word_split != vocabulary_split:
            raise ConfigError(
                "data.word_split",
                f"is {self.word_split}, but data.vocab_path's vocabulary cuts words by {vocabulary_split} "
                "(a vocabulary keeps its own rule): leave data.word_split out",
            )

    def bert_vocab_source(self, hf_text: str | None = None) -> str:
        """The BERT vocabulary this section reads: ``bert_vocab``; if empty, the text backbone's ``hf_text``
        (the run's ``model.hf_text``), else :data:`DEFAULT_BERT_VOCAB`."""
        return self.bert_vocab or hf_text or DEFAULT_BERT_VOCAB

    def home_expanded(self) -> DataConfig:
        """This section with a leading ``~`` of every path expanded to the home directory (the config check
        expands it, so the readers must too, or they look for a folder named ``~``)."""
        changes = {key: os.path.expanduser(getattr(self, key)) for key in PATH_KEYS if getattr(self, key)}
        return dataclasses.replace(self, **changes)

    def absolute_file_paths(self) -> DataConfig:
        """This section with every :data:`PATH_KEYS` key set made absolute (:func:`absolute_path`, against
        the working directory): the data files and directories, what a gallery's identity and an imported
        run record."""
        changes = {key: absolute_path(getattr(self, key)) for key in PATH_KEYS if getattr(self, key)}
        return dataclasses.replace(self, **changes)

    def absolute_paths(self) -> DataConfig:
        """:meth:`absolute_file_paths`, and ``vocab_path`` / ``bert_vocab`` absolute where they name a local
        file or directory rather than a shipped vocabulary or a hub id (:func:`local_path`). What a new run
        records, so that it resumes and evaluates from any directory; done again to a config so recorded, it
        changes nothing."""
        from patchword.pretrained import shipped_pretrained

        vocab_path = local_path(self.vocab_path, shipped_pretrained())
        return dataclasses.replace(
            self.absolute_file_paths(), vocab_path=vocab_path, bert_vocab=local_path(self.bert_vocab)
        )

    def require_files(self, roles: Iterable[str], *, dense=True, source=None, saved=None) -> None:
        """The files and directories this section names for the splits of ``roles`` exist
        (:func:`require_path`): ``root``, ``image_root`` and, with ``dense``, the dense-caption file each
        role reads (the dev role's held-out images with ``dev_from_train``: the train split's), where set.
        ``source``: the file the values come from (a run's config.yaml), which the message names, for the
        values equal to those of DataConfig ``saved`` where given (the others an evaluation's overrides set).

        Raises:
            MissingFileError: naming the key, its value and ``source``.
        """
        keys = []
        if self.dataset in (*FILE_DATASETS, "precomp"):
            keys.append(("root", "file" if self.dataset == "karpathy" else "directory"))
        if self.dataset in FILE_DATASETS:
            keys.append(("image_root", "directory"))
            dense_keys = (
                "dense_train" if r == "dev" and self.dev_from_train else f"dense_{r}" for r in roles
            )
            keys += [(key, "file") for key in dense_keys if dense]
        for key, kind in keys:
            value = getattr(self, key)
            if value:
                given = saved is not None and getattr(saved, key) != value
                require_path(value, f"data.{key}", kind, None if given else source)

    def synthetic_config(self):
        """The generator config of the synthetic scenes this section describes (synthetic datasets).

        Raises:
            ConfigError: a value the generator refuses, naming the ``data.*`` key that sets it
                (``data.num_test``), not the generator's own field (``num_test``).
        """
        from patchword.data.synthetic import SyntheticConfig
        from patchword.data.synthetic.config import DATA_KEYS, SCENE_PRESETS

        try:
            return SyntheticConfig(
                **SCENE_PRESETS[self.synthetic_scenes],
                seed=self.synthetic_seed,
                image_size=self.synthetic_image_size,
                num_train=self.num_train,
                num_dev=self.num_dev,
                num_test=self.num_test,
                dense_omit_prob=self.dense_omit_prob,
                dense_wrong_attr_prob=self.dense_wrong_attr_prob,
            )
        except ConfigError as err:
            raise ConfigError(DATA_KEYS.get(err.key, "data.synthetic_scenes"), err.detail) from err


def absolute_path(value: str) -> str:
    """``value`` absolute against the working directory, ``~`` expanded (``os.path.abspath``): a link named
    in ``value`` is kept (``data/f30k``, a link to a mounted disk, is recorded as the link), but ``..`` is
    removed by text (``mnt/../f30k`` is ``f30k`` even where ``mnt`` is a link) and the working directory is
    its real path."""
    return os.path.abspath(os.path.expanduser(value))


def local_path(value: str, names: Iterable[str] = ()) -> str:
    """``value`` absolute (:func:`absolute_path`) when it names a local file or directory and none of
    ``names`` (shipped names, which win over a local folder of the same name), else as it is (a hub id, a
    shipped name, a path that does not exist: the config check names it as given)."""
    if not value or value in names or not os.path.exists(os.path.expanduser(value)):
        return value
    return absolute_path(value)


def require_path(path: str, key: str, kind: str = "file", source: str | None = None) -> None:
    """``path``, the value of ``key``, is a ``kind`` (``file``, ``directory`` or ``path``: either).

    Raises:
        MissingFileError: ``KEY=PATH: no such KIND``, naming ``source`` (the file the value comes from, a
            run's config.yaml) and for a relative path from there the directory it was looked for in.
    """
    from patchword.errors import MissingFileError

    p = Path(path).expanduser()
    ok = p.is_dir() if kind == "directory" else p.is_file() if kind == "file" else p.exists()
    where = f"{key}={path}" + (f" ({source})" if source else "")
    if not ok and p.exists():  # there, but of the other kind
        raise MissingFileError(f"{where}: is a {'file' if p.is_file() else 'directory'}, not a {kind}")
    if not ok:
        # a run's relative path (made before config.yaml recorded them absolute): read from the working dir
        here = f" in {os.getcwd()} (run from the directory the run was created in)" if source else ""
        raise MissingFileError(f"{where}: no such {kind}{'' if p.is_absolute() else here}")


#: Each field's default (``DataConfig()`` has no required field).
_DEFAULTS = dataclasses.asdict(DataConfig())
