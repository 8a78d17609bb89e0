"""The Hugging Face files an import reads besides the checkpoint: a backbone's architecture
(``config.json``) and BERT's vocabulary (``vocab.txt``), from a local directory or a hub id (``--hf-vision``,
``--hf-text``). A hub id is read from the local cache, or downloaded where the import's overrides set
``model.hf_local_files_only=false``; no weights are ever read (they come from the checkpoint).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from patchword.errors import ConfigError

__all__ = ["bert_vocab_file", "hf_architecture"]

_logger = logging.getLogger(__name__)


def bert_vocab_file(source: str | None, text_arch: dict[str, Any], *, local_files_only: bool = True) -> Path:
    """BERT's ``vocab.txt`` from ``--hf-text`` (a directory or a hub id: a cached one, or with
    ``local_files_only=False`` one downloaded now), checked to fit the checkpoint's word embedding
    (``text_arch["vocab_size"]`` rows): more tokens than rows is refused (ids past the table: an IndexError
    at the first caption that has one), fewer is warned of (the official vocabulary fills the table: another
    one tokenises the same captions to other ids).

    Raises:
        ConfigError: naming ``--hf-text``.
    """
    from patchword.data.tokenizers import BertCaptionTokenizer

    local = Path(str(source)).expanduser()
    if local.is_dir():
        vocab = local / "vocab.txt"
    else:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(str(source), "vocab.txt")
        vocab = Path(cached) if isinstance(cached, str) else local / "vocab.txt"
        if not isinstance(cached, str) and not local_files_only:  # model.hf_local_files_only=false
            vocab = _downloaded_vocab(str(source))
    if not vocab.is_file():
        raise ConfigError("--hf-text", f"{source} has no vocab.txt: the run needs BERT's vocabulary file")
    try:
        tokenizer = BertCaptionTokenizer.from_pretrained(vocab)
    except (ValueError, KeyError) as err:
        raise ConfigError("--hf-text", f"{vocab}: not a BERT vocabulary ({err})") from None
    embedded = int(text_arch.get("vocab_size", 0))
    if tokenizer.vocab_size > embedded:
        raise ConfigError(
            "--hf-text",
            f"{vocab} has {tokenizer.vocab_size} tokens but the BERT architecture embeds {embedded}",
        )
    if tokenizer.vocab_size < embedded:
        _logger.warning(
            "%s has %d tokens but the BERT architecture embeds %d: is it the checkpoint's own vocabulary? "
            "Another one tokenises the same captions to other ids",
            vocab,
            tokenizer.vocab_size,
            embedded,
        )
    return vocab


def _downloaded_vocab(source: str) -> Path:
    """Hub id ``source``'s ``vocab.txt``, downloaded (or found) by huggingface_hub (``--hf-text`` with
    ``model.hf_local_files_only=false``).

    Raises:
        ConfigError: naming ``--hf-text``: no such repository or file, no network.
    """
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(source, "vocab.txt"))
    except (OSError, ValueError) as err:  # huggingface_hub's errors derive from both
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError("--hf-text", f"{source}: could not download vocab.txt ({first})") from None


def hf_architecture(
    source: str | None, role: str, arg: str, *, local_files_only: bool = True
) -> dict[str, Any]:
    """A Hugging Face config dict from a local directory or a hub id (no weights are read): a cached one,
    or with ``local_files_only=False`` (``model.hf_local_files_only=false``) one downloaded now."""
    from patchword.hub import read_hf_config

    if not source:
        raise ConfigError(arg, f"the checkpoint holds a Hugging Face {role} backbone: give its architecture")
    try:
        _, config = read_hf_config(source, local_files_only=local_files_only, reword_errors=False)
    except OSError as err:
        hint = ""
        if local_files_only and not Path(source).expanduser().exists():
            hint = "; a hub id is read from the local cache: model.hf_local_files_only=false downloads it"
        raise ConfigError(
            arg, f"{source}: no Hugging Face config there ({str(err).splitlines()[0]}){hint}"
        ) from None
    return config.to_dict()
