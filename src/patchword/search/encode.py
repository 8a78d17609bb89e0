"""Turning image files into index rows: decoding in threads, batched encoding, shard files.

:class:`ShardEncoder` decodes one batch ahead in a thread pool (Pillow releases the GIL while decoding)
while the model encodes the current batch. A file that fails to decode becomes a :class:`SkippedFile` with
its signature, never an exception. :func:`write_shard` writes one shard's arrays, each atomically. Each
image is turned upright as its EXIF orientation tag says, as a browser shows it (a user's phone photos:
``patchword serve`` draws the kept patches over what the browser shows).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from patchword.data.images import load_image
from patchword.data.tokenizers import BertCaptionTokenizer, NoWordsError, TextTokenizer, WordVocab, tokenize
from patchword.errors import DataError, MissingFileError, describe_os_error
from patchword.eval.engine.base import ScoringEngine
from patchword.matching.ops import length_mask
from patchword.runs import LoadedRun
from patchword.search.codecs import TokenCodec
from patchword.search.pruning import PrunedTokens, prune_patches
from patchword.search.scan import ImageFile, SkippedFile
from patchword.search.shards import save_npy_atomic, shard_files

__all__ = [
    "DenseCaptions",
    "EncodedShard",
    "ShardEncoder",
    "check_dense_words",
    "codec_sample",
    "dense_scores",
    "prune_shard",
    "read_dense_file",
    "word_split",
    "write_shard",
]


class DenseCaptions(dict[str, str]):
    """Dense captions keyed by image file (:func:`read_dense_file`) that know where each was read:
    ``place(file)`` is ``FILE:LINE`` of its line."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.lines: dict[str, int] = {}  # image file -> line number

    def place(self, file: str) -> str:
        return f"{self.path}:{self.lines[file]}"


def read_dense_file(path: str | os.PathLike[str]) -> DenseCaptions:
    """Dense captions keyed by image file: a SEPS-format JSONL whose ``metadata.file`` (or, failing
    that, ``metadata.image_id``) is the image's path relative to the indexed folder, as
    ``patchword densify`` and ``patchword data export`` write them.

    Raises:
        MissingFileError: no such file.
        DataError: a directory, a file that cannot be read or is not UTF-8 text, a malformed line (named
            by number) or the same image twice; every message starts with ``--dense:``.
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"--dense: {path} is a directory, not a dense caption file (JSONL)")
    if not path.is_file():
        raise MissingFileError(f"--dense: dense caption file not found: {path}")
    texts = DenseCaptions(path)
    lineno = 0
    try:
        with path.open(encoding="utf-8", errors="strict") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(f"--dense: {path}:{lineno}: malformed JSON: {err.msg}") from err
                meta = record.get("metadata") if isinstance(record, dict) else None
                text = record.get("text") if isinstance(record, dict) else None
                key = (meta.get("file") or meta.get("image_id")) if isinstance(meta, dict) else None
                if not isinstance(text, str) or not text.strip() or not isinstance(key, str) or not key:
                    raise DataError(
                        f"--dense: {path}:{lineno}: expected {{'text': ..., 'metadata': {{'file': <image "
                        "path relative to --images>}}"
                    )
                key = Path(key).as_posix()
                if key in texts:
                    raise DataError(f"--dense: {path}:{lineno}: a second dense caption for {key}")
                texts[key], texts.lines[key] = text.strip(), lineno
    except UnicodeDecodeError as err:
        raise DataError(f"--dense: {path}:{lineno + 1}: not UTF-8 text ({err.reason})") from err
    except OSError as err:  # unreadable (permissions, an I/O error): the file is what the user fixes
        raise DataError(f"--dense: cannot read {describe_os_error(err)}") from err
    return texts


def word_split(tokenizer: TextTokenizer) -> Callable[[str], list]:
    """The part of ``tokenizer``'s encoding that decides whether a text has no words (``NoWordsError``):
    the word vocabulary's split (:func:`~patchword.data.tokenizers.tokenize` with its ``split``: ``!!!``
    has no alphanumeric word), BERT's basic tokenisation (punctuation is a token; only whitespace, control
    and replacement characters leave none), without the rest (WordPiece, ids, tensors). For another
    tokenizer, its whole encoding of the text (exact, not cheaper). Texts with no words give ``[]``."""
    if isinstance(tokenizer, WordVocab):
        return functools.partial(tokenize, split=tokenizer.split)
    if isinstance(tokenizer, BertCaptionTokenizer):
        return tokenizer.basic_tokens

    def encoded(text: str) -> list:
        try:
            return tokenizer.batch_encode([text])[0][0].tolist()
        except NoWordsError:
            return []

    return encoded


def _no_words(captions: dict[str, str], file: str, err: NoWordsError) -> DataError:
    """The error for the dense caption of image ``file`` the tokenizer finds no word in, naming its line."""
    where = captions.place(file) if isinstance(captions, DenseCaptions) else "dense captions"
    return DataError(
        f"{where}: the dense caption of image {file} {err.text!r} has {err.reason}; reword or remove it"
    )


def check_dense_words(tokenizer: TextTokenizer, captions: dict[str, str], files: Iterable[str]) -> None:
    """Refuse a dense caption of the image ``files`` (keys of ``captions``) that ``tokenizer`` finds no word
    in, before any is encoded: a build that met it in its last shard would stop after writing the others.
    Runs the word split alone (:func:`word_split`), the tokenizer's own encoding only for a caption it
    finds empty (its reason goes in the message).

    Raises:
        DataError: ``FILE:LINE`` of the first such caption (in ``files`` order) and its image.
    """
    split = word_split(tokenizer)
    for file in files:
        if split(captions[file]):
            continue
        try:
            tokenizer.batch_encode([captions[file]])
        except NoWordsError as err:
            raise _no_words(captions, file, err) from err


@dataclass
class EncodedShard:
    """One shard's worth of encoded images (rows in the order of ``files``)."""

    files: list[ImageFile] = field(default_factory=list)
    globals_: list[torch.Tensor] = field(default_factory=list)
    tokens: list[torch.Tensor] = field(default_factory=list)
    dense: list[torch.Tensor] = field(default_factory=list)
    dense_lens: list[torch.Tensor] = field(default_factory=list)
    failed: list[SkippedFile] = field(default_factory=list)


class ShardEncoder:
    """Decodes files in threads (one batch ahead) and runs the model on whole batches."""

    def __init__(
        self,
        run: LoadedRun,
        root: Path,
        batch_size: int,
        pool: ThreadPoolExecutor,
        dense_texts: dict[str, str] | None,
    ) -> None:
        self.run, self.root, self.batch_size, self.pool = run, root, batch_size, pool
        self.dense_texts = dense_texts
        self.transform = run.image_transform()

    def _load(self, file: ImageFile) -> torch.Tensor | SkippedFile:
        try:
            # upright as its EXIF orientation says: what a browser shows of the file (the server sends a
            # JPEG as stored, a browser applies the tag), so the patches drawn over it are the ones indexed
            return self.transform(load_image(self.root / file.path, exif_orientation=True))
        except Exception as err:  # noqa: BLE001 - any decoding failure skips the file, never the build
            return SkippedFile(file.path, f"cannot decode: {err}", file.size, file.mtime_ns)

    def _submit(self, files: Sequence[ImageFile]) -> list[Future]:
        return [self.pool.submit(self._load, f) for f in files]

    @torch.no_grad()
    def encode(self, files: Sequence[ImageFile], on_batch: Callable[[int], None]) -> EncodedShard:
        out = EncodedShard()
        batches = [files[i : i + self.batch_size] for i in range(0, len(files), self.batch_size)]
        pending = self._submit(batches[0]) if batches else []
        model, device = self.run.model, self.run.device
        for b, batch in enumerate(batches):
            loaded = [f.result() for f in pending]
            pending = self._submit(batches[b + 1]) if b + 1 < len(batches) else []
            good = [(file, x) for file, x in zip(batch, loaded, strict=True) if isinstance(x, torch.Tensor)]
            out.failed += [x for x in loaded if isinstance(x, SkippedFile)]
            if good:
                images = torch.stack([x for _, x in good]).to(device)
                tokens = model.encode_images(images)
                out.files += [file for file, _ in good]
                out.tokens.append(tokens.float().cpu())
                out.globals_.append(model.matcher.global_image(tokens).float().cpu())
                if self.dense_texts is not None:
                    dense, lens = self._encode_dense([file.path for file, _ in good])
                    out.dense.append(dense)
                    out.dense_lens.append(lens)
            on_batch(len(batch))
        return out

    def _encode_dense(self, files: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """The dense captions of the image ``files`` encoded: ((B, L, C) tokens, (B,) lengths). Each has
        words: :func:`check_dense_words` refused the build otherwise, before the first shard.
        """
        run, captions = self.run, self.dense_texts
        texts = [captions[file] for file in files]
        ids, lens = run.tokenizer.batch_encode(texts, max_len=run.config.data.max_dense_len)
        # host lengths: the encoder checks them there (a device copy was read back, two waits per batch)
        tokens = run.model.encode_texts(ids.to(run.device, non_blocking=True), lens).float().cpu()
        return tokens, lens


def _pad_cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate (B_i, L_i, C) blocks along the batch, zero-padding to the longest L."""
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, 0, 0, width - p.shape[1])) for p in parts])


def dense_scores(engine: ScoringEngine, encoded: EncodedShard, device) -> np.ndarray:
    """(rows,) float32: the per-image score each image's dense caption gives (``--dense-store scores``)."""
    lens = torch.cat(encoded.dense_lens)
    scores = engine.image_constants(
        torch.cat(encoded.tokens), _pad_cat(encoded.dense)[:, : int(lens.max())], lens, device=device
    )
    if scores is None:  # checked before the build starts (build_index)
        raise RuntimeError("the matcher has no per-image dense score")
    return scores.numpy().astype(np.float32)


def prune_shard(engine: ScoringEngine, encoded: EncodedShard, keep: int, device) -> PrunedTokens:
    """Prune the shard's image tokens to ``keep`` patches per image (``--keep-patches``): its tokens
    are replaced by the kept ones; returns them with their grid positions and priors."""
    pruned = prune_patches(engine, torch.cat(encoded.tokens), keep, device=device)
    encoded.tokens = [pruned.tokens]
    return pruned


def write_shard(
    index_dir: Path,
    shard_id: int,
    encoded: EncodedShard,
    codec: TokenCodec,
    dense_score: np.ndarray | None = None,
    pruned: PrunedTokens | None = None,
) -> int:
    """Write one shard's arrays (each atomically), token arrays through the index's codec; with
    ``dense_score`` (rows,) that array instead of the dense tokens; with ``pruned`` (:func:`prune_shard`)
    the kept patches' positions and priors. Returns the shard's row count."""
    files = shard_files(index_dir, shard_id)
    save_npy_atomic(files["global"], torch.cat(encoded.globals_).numpy().astype(np.float32))
    for suffix, array in codec.encode(torch.cat(encoded.tokens).numpy()).items():
        save_npy_atomic(files[f"tokens{suffix}"], array)
    if pruned is not None:
        save_npy_atomic(files["patch_ids"], pruned.patch_ids.numpy())
        save_npy_atomic(files["patch_prior"], pruned.prior.numpy())  # float32
    if dense_score is not None:
        save_npy_atomic(files["dense_score"], dense_score)
    elif encoded.dense:
        lens = torch.cat(encoded.dense_lens)
        dense = _pad_cat(encoded.dense)[:, : int(lens.max())]
        for suffix, array in codec.encode(dense.numpy()).items():
            save_npy_atomic(files[f"dense{suffix}"], array)
        save_npy_atomic(files["dense_lens"], lens.numpy().astype(np.int32))
    return len(encoded.files)


def codec_sample(
    encoded: EncodedShard, limit: int = 100_000, seed: int = 0, *, dense: bool = True
) -> np.ndarray:
    """(n, C) float32 tokens of a shard (image, and dense unless ``dense`` is False: the ones the index
    stores) to train a quantiser on, ``limit`` at most."""
    parts = [torch.cat(encoded.tokens).flatten(0, 1)]
    if encoded.dense and dense:
        lens = torch.cat(encoded.dense_lens)
        dense = _pad_cat(encoded.dense)
        parts.append(dense[length_mask(lens, dense.shape[1])])
    tokens = torch.cat(parts).numpy()
    if len(tokens) > limit:
        tokens = tokens[np.random.default_rng(seed).choice(len(tokens), limit, replace=False)]
    return tokens
