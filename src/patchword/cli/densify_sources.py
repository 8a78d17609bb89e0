"""The image sources of ``patchword densify`` (:mod:`patchword.cli.densify`): their flags, the synthetic
generator config those flags set, and the ordered image list of the source given.

Exactly one source: ``--images DIR``, ``--data-root ROOT`` (a LAPS/SEPS layout), ``--karpathy JSON`` (a
Karpathy ``dataset_*.json``) or ``--synthetic SPLIT``. An option only other sources read is refused naming
it (:func:`patchword.densify.sources.check_source_options`), two sources by argparse.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = [
    "RUN_SYNTHETIC_FLAGS",
    "STATS_SYNTHETIC_FLAGS",
    "add_source_arguments",
    "image_list",
    "synthetic_config",
]


def add_source_arguments(p: argparse.ArgumentParser) -> None:
    """The ``images (one of)`` group of the run parser."""
    src = p.add_argument_group("images (one of)")
    one = src.add_mutually_exclusive_group(required=True)
    one.add_argument(
        "--images", type=Path, metavar="DIR", help="every image below DIR, sorted by relative path"
    )
    one.add_argument("--data-root", type=Path, metavar="ROOT", help="LAPS/SEPS layout: {split}_ids.txt, ...")
    one.add_argument(
        "--karpathy",
        type=Path,
        metavar="JSON",
        help="Karpathy dataset_*.json (data.dataset=karpathy): the split's images in the loader's order",
    )
    one.add_argument("--synthetic", metavar="SPLIT", help="the synthetic scenes of SPLIT (train, dev, test)")
    src.add_argument(
        "--split",
        help="with --data-root (train, dev, test, testall) or --karpathy (train, val or dev, test, restval)",
    )
    src.add_argument(
        "--image-root",
        type=Path,
        metavar="DIR",
        help="with --data-root: image folder (default ROOT); with --karpathy (required): data.image_root",
    )
    # SUPPRESS: only a flag given is in the arguments (with another source it is refused, not ignored)
    src.add_argument(
        "--synthetic-seed",
        type=int,
        default=argparse.SUPPRESS,
        help="with --synthetic: generator seed (default 0)",
    )
    src.add_argument("--synthetic-num-images", type=int, help="with --synthetic: images of the split")
    src.add_argument(
        "--synthetic-image-size",
        type=int,
        default=argparse.SUPPRESS,
        help="with --synthetic: image side (default 64)",
    )


# The flags that set the synthetic generator's config, by what they set ("num_images": num_<split>). The
# generator's errors name its own field (ConfigError.key: "num_test", "image_size"), which the user never
# typed; the error is reported with the flag instead, as the run config reports it with its data.* key.
RUN_SYNTHETIC_FLAGS = {
    "split": "--synthetic",
    "seed": "--synthetic-seed",
    "num_images": "--synthetic-num-images",
    "image_size": "--synthetic-image-size",
}
STATS_SYNTHETIC_FLAGS = {
    "split": "--synthetic-split",
    "seed": "--synthetic-seed",
    "num_images": "--synthetic-num-images",
}


def synthetic_config(
    seed: int,
    split: str,
    num_images: int | None,
    image_size: int = 64,
    flags: dict[str, str] = RUN_SYNTHETIC_FLAGS,
):
    """The generator config of ``split`` from the ``--synthetic-*`` flags (named by ``flags``).

    Raises:
        ConfigError: a value the generator refuses, keyed by the flag that set it.
    """
    from patchword.data.synthetic import SPLITS, SyntheticConfig
    from patchword.errors import ConfigError

    if split not in SPLITS:
        raise ConfigError(
            flags["split"], f"unknown synthetic split {split!r}; expected one of {', '.join(SPLITS)}"
        )
    if seed < 0:  # numpy's SeedSequence refuses it, later and without a name
        raise ConfigError(flags["seed"], f"must be >= 0, got {seed}")
    sizes = {} if num_images is None else {f"num_{split}": num_images}
    try:
        return SyntheticConfig(seed=seed, image_size=image_size, **sizes)
    except ConfigError as err:
        field = "num_images" if err.key == f"num_{split}" else err.key
        raise ConfigError(flags.get(field, flags["split"]), err.detail) from err


def image_list(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """The ordered :class:`~patchword.densify.sources.ImageList` of the source the arguments give.

    Raises:
        ConfigError: an option of another source.
        SystemExit: (``parser.error``, exit 2) a source without the options it needs.
    """
    from patchword.densify import sources

    sources.check_source_options(vars(args))
    if args.images is not None:
        return sources.images_from_folder(args.images)
    if args.data_root is not None:
        if not args.split:
            parser.error("--data-root needs --split")
        return sources.images_from_laps(args.data_root, args.split, args.image_root)
    if args.karpathy is not None:
        if not args.split:
            parser.error("--karpathy needs --split (the json's split: train, val or dev, test, restval)")
        if args.image_root is None:  # no default: the json sits apart from its images (data.image_root)
            parser.error(
                "--karpathy needs --image-root (the folder of its images, the run's data.image_root)"
            )
        return sources.images_from_karpathy(args.karpathy, args.split, args.image_root)
    seed, size = getattr(args, "synthetic_seed", 0), getattr(args, "synthetic_image_size", 64)
    config = synthetic_config(seed, args.synthetic, args.synthetic_num_images, size)
    return sources.images_from_synthetic(args.synthetic, config)
