"""Write a synthetic split as real files: PNG images plus the LAPS / SEPS text layout.

The export is what a user with a folder of images has, so everything downstream of it (the ``laps``
loader, ``patchword eval`` with ``data.dataset=laps``, ``patchword index build``) runs on real files:

``OUT/``
    ``images/<image id>.png``  the rendered scenes, lossless;
    ``{split}_caps.txt``       one caption per line (five per image, image-major);
    ``{split}_ids.txt``        the image id of each caption line;
    ``id_mapping.json``        image id -> file name relative to ``OUT/images``;
    ``{split}.jsonl``          one dense caption per image in image order, SEPS format
    (``{"text", "model_id", "metadata": {"image_id", "file", "length"}}``, ``file`` relative to
    ``OUT/images`` as ``patchword densify`` writes it);
    ``export.json``            what was exported (generator config, split, counts).

PNG is lossless and the synthetic images are already at the model's input size, so reading a file back
with :func:`patchword.data.transforms.test_transform` gives exactly the tensor the in-memory pipeline
normalises (tested): metrics on the export equal metrics on the in-memory split.

The directory appears atomically: files are written into a temporary sibling that is renamed into place
at the end, so an interrupted export leaves no half-written ``OUT``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from patchword.data.synthetic import SPLITS, SyntheticConfig, generate_split
from patchword.errors import ConfigError, RunExistsError, describe_os_error
from patchword.fileio import probe_writable, staging_dir
from patchword.progress import progress_bar

__all__ = ["ExportSummary", "export_synthetic_split", "DENSE_MODEL_ID"]

logger = logging.getLogger(__name__)

#: ``model_id`` of the exported dense captions (they come from the generator, not from an MLLM).
DENSE_MODEL_ID = "patchword-synthetic"
IMAGES_DIR = "images"


@dataclass(frozen=True)
class ExportSummary:
    """What :func:`export_synthetic_split` wrote.

    Attributes:
        out_dir: the export directory.
        split: the split name.
        num_images, num_captions: counts.
        image_size: side of the square PNG images in pixels.
        files: the layout files by role (``caps``, ``ids``, ``id_mapping``, ``dense``, ``images``).
    """

    out_dir: Path
    split: str
    num_images: int
    num_captions: int
    image_size: int
    files: dict[str, Path]

    def describe(self, region_run: str | os.PathLike[str] | None = None) -> str:
        """What ``patchword data export synthetic`` prints: what was written and how to use it.

        ``region_run``: the run whose scenes were exported, when it reads region features
        (``model.image_encoder=precomp``): it can neither index nor evaluate image files, so instead of the
        commands that would fail for it the text says so.
        """
        images, dense = self.files["images"], self.files["dense"]
        text_files = ", ".join(self.files[key].name for key in ("caps", "ids", "id_mapping"))
        lines = [
            f"exported {self.num_images} images and {self.num_captions} captions of the synthetic "
            f"{self.split} split to {self.out_dir}",
            f"  images:   {images}/ ({self.image_size}x{self.image_size} PNG)",
            f"  captions: {text_files}",
            f"  dense:    {dense.name} (one line per image, image order)",
        ]
        if region_run is not None:
            reads = f"{region_run} reads region features (model.image_encoder=precomp), not images"
            return "\n".join([*lines, f"{reads}: it cannot index or evaluate these files"])
        return "\n".join(
            [
                *lines,
                "index them:",
                f"  patchword index build RUN_DIR --images {images} --dense {dense} --out INDEX_DIR",
                "evaluate a run on these files (laps loader):",
                "  patchword eval RUN_DIR " + " ".join(self.eval_overrides()),
            ]
        )

    def eval_overrides(self) -> list[str]:
        """Dotted overrides that evaluate a synthetic run on this export with the ``laps`` loader.

        The test role reads the exported split (an evaluation reads that role only: pointing the training
        and dev roles at it too would record the split as the run's training split, ``split_use``);
        ``data.image_size`` keeps the PNGs at their native size.
        """
        out, split = self.out_dir, self.split
        dense = self.files["dense"]
        return [
            "data.dataset=laps",
            f"data.root={out}",
            f"data.image_root={self.files['images']}",
            f"data.test_split={split}",
            f"data.dense_test={dense}",
            f"data.image_size={self.image_size}",
        ]


def _check_target(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise RunExistsError(
            f"{out_dir} already exists and is not empty; choose another --out (nothing written)"
        )


def _write_png(path: Path, pixels: np.ndarray) -> None:
    # compress_level 6: PNG's default; the images are tiny and flat, so this costs little.
    Image.fromarray(pixels).save(path, format="PNG", compress_level=6)


def _write_text(path: Path, lines: list[str]) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)


def export_synthetic_split(
    out_dir: str | os.PathLike[str],
    split: str = "test",
    *,
    config: SyntheticConfig | None = None,
    workers: int = 4,
    progress: bool | None = None,
) -> ExportSummary:
    """Render one synthetic split and write it as PNG files plus the LAPS / SEPS layout.

    Args:
        out_dir: the export directory; it must not exist or be empty (nothing is overwritten).
        split: ``train``, ``dev`` or ``test``.
        config: the generator config (default :class:`SyntheticConfig`; use
            :meth:`DataConfig.synthetic_config` to export the scenes of a run).
        workers: threads encoding PNG files (zlib releases the GIL).
        progress: progress bar (default: only on a terminal).

    Returns:
        :class:`ExportSummary`.

    Raises:
        ConfigError: unknown split.
        RunExistsError: ``out_dir`` exists and is not empty.
        ConfigError: ``out_dir`` cannot be created (a read-only folder, a file on the way), before any work.
    """
    if split not in SPLITS:
        raise ConfigError("--split", f"must be one of {', '.join(SPLITS)}, got {split!r}")
    config = config or SyntheticConfig()
    out_dir = Path(out_dir)
    _check_target(out_dir)
    try:  # before rendering, and so that the error names --out, not the staging folder beside it
        probe_writable(out_dir.parent)
    except OSError as err:
        raise ConfigError("--out", f"{out_dir} cannot be created: {describe_os_error(err)}") from err
    scene_split = generate_split(config, split)
    ids = scene_split.image_ids
    names = [f"{image_id}.png" for image_id in ids]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # staging_dir: the renamed directory gets mkdir's permissions (umask), not mkdtemp's private 0700.
    tmp = Path(staging_dir(out_dir, "tmp"))
    try:
        images_dir = tmp / IMAGES_DIR
        images_dir.mkdir()
        with (
            progress_bar(len(ids), f"export {split} images", progress, unit="img") as bar,
            ThreadPoolExecutor(max(1, workers)) as pool,
        ):
            jobs = [
                pool.submit(_write_png, images_dir / name, scene_split.images[i])
                for i, name in enumerate(names)
            ]
            for job in jobs:
                job.result()
                bar.update(1)
        _write_text(tmp / f"{split}_caps.txt", scene_split.captions)
        _write_text(tmp / f"{split}_ids.txt", [ids[int(i)] for i in scene_split.txt2img])
        mapping = dict(zip(ids, names, strict=True))
        (tmp / "id_mapping.json").write_text(json.dumps(mapping, indent=1), encoding="utf-8")
        dense_lines = [
            json.dumps(
                {
                    "text": text,
                    "model_id": DENSE_MODEL_ID,
                    "metadata": {"image_id": image_id, "file": name, "length": len(text)},
                },
                ensure_ascii=False,
            )
            for image_id, name, text in zip(ids, names, scene_split.dense_captions, strict=True)
        ]
        _write_text(tmp / f"{split}.jsonl", dense_lines)
        record = {
            "source": "patchword synthetic scenes",
            "split": split,
            "num_images": len(ids),
            "num_captions": len(scene_split.captions),
            "config": dataclasses.asdict(config),
        }
        (tmp / "export.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
        _check_target(out_dir)  # someone may have created it meanwhile
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked): the rename needs the name free
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    files = {
        "images": out_dir / IMAGES_DIR,
        "caps": out_dir / f"{split}_caps.txt",
        "ids": out_dir / f"{split}_ids.txt",
        "id_mapping": out_dir / "id_mapping.json",
        "dense": out_dir / f"{split}.jsonl",
    }
    logger.info("exported %d %s images to %s", len(ids), split, out_dir)
    return ExportSummary(out_dir, split, len(ids), len(scene_split.captions), config.image_size, files)
