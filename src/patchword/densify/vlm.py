"""A vision-language model that describes images: transformers' image-text-to-text models, or the tiny one.

Any model that ``AutoModelForImageTextToText`` and ``AutoProcessor`` load works (LLaVA-1.5, LLaVA-NeXT,
Qwen2-VL, ...), from a local directory (the output of ``save_pretrained`` or a hub snapshot) or a hub id.
Hub ids are looked up in the local Hugging Face cache only, unless the caller allows a download.

``tiny-random`` is the smoke-test model of :mod:`patchword.densify.tiny`: real pipeline, nonsense text.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from patchword.densify.config import PRECISIONS, GenerationSettings
from patchword.densify.fingerprint import directory_fingerprint
from patchword.errors import ConfigError, MissingFileError, ModelNotFoundError
from patchword.hub import hub_snapshot

__all__ = ["TINY_RANDOM", "Generation", "VisionLanguageModel", "check_model_id", "load_vlm"]

logger = logging.getLogger(__name__)

#: ``--model`` value that builds the in-process smoke-test model.
TINY_RANDOM = "tiny-random"

# A processor saved by transformers 5 keeps its image processor in processor_config.json; older snapshots
# have preprocessor_config.json.
_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


@dataclass(frozen=True)
class Generation:
    """One generated description.

    Attributes:
        text: decoded text, special tokens removed, surrounding whitespace stripped.
        new_tokens: tokens generated before the end-of-text token.
        truncated: generation stopped at ``max_new_tokens`` instead of an end-of-text token.
    """

    text: str
    new_tokens: int
    truncated: bool


class VisionLanguageModel:
    """A generative image-text model with its processor, on one device and in one precision.

    Args:
        model: a transformers image-text-to-text model (``generate`` with ``pixel_values``).
        processor: its processor (image processor + tokenizer + chat template).
        model_id: the name written into every output line.
        device: where generation runs.
        precision: ``fp32``, ``bf16`` or ``fp16``.
        fingerprint: what the model's files are (:mod:`patchword.densify.fingerprint`), recorded in the
            sidecar so that a rerun or a merge never mixes two models of one name; None: unknown (then
            the ``--model`` value alone is compared).
    """

    def __init__(
        self,
        model,
        processor,
        model_id: str,
        device: torch.device,
        precision: str,
        fingerprint: str | None = None,
    ) -> None:
        self.fingerprint = fingerprint
        self.dtype = PRECISIONS[precision]
        self.model = model.to(device=device, dtype=self.dtype).eval()
        self.processor = processor
        self.model_id = model_id
        self.device = device
        self.precision = precision
        tokenizer = getattr(processor, "tokenizer", None)
        if tokenizer is None:
            raise ConfigError("--model", f"the processor of {model_id!r} has no tokenizer")
        # Decoder-only batched generation needs the prompts right-aligned.
        tokenizer.padding_side = "left"
        self.tokenizer = tokenizer
        # densify prepares the next batch on a thread while this one decodes; a fast tokenizer's Rust
        # backend refuses concurrent use ("Already borrowed"), so tokenising and decoding take turns.
        self._tokenizer_lock = threading.Lock()
        eos = model.generation_config.eos_token_id
        eos = eos if eos is not None else tokenizer.eos_token_id
        eos_ids = [] if eos is None else sorted(set(eos if isinstance(eos, list) else [eos]))
        self._eos_ids = torch.tensor(eos_ids, dtype=torch.long)

    def prompt_text(self, prompt: str) -> str:
        """The full model input text for one image and the instruction ``prompt`` (the chat template)."""
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        if getattr(self.processor, "chat_template", None):
            return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if self.model.config.model_type == "llava":
            logger.info("the processor has no chat template; using the LLaVA-1.5 prompt format")
            return f"USER: <image>\n{prompt} ASSISTANT:"
        raise ConfigError(
            "--model",
            f"the processor of {self.model_id!r} has no chat template, so the prompt format is unknown; save "
            "one with processor.chat_template = ...; processor.save_pretrained(DIR)",
        )

    def prepare(self, images: list[Image.Image], prompt_text: str) -> dict[str, torch.Tensor]:
        """Processor outputs (CPU tensors) for a batch of images with the same prompt.

        Returns:
            ``input_ids`` / ``attention_mask`` (B, L) left-padded, ``pixel_values`` (B, 3, H, W) or the
            model's own layout (e.g. patches for Qwen2-VL), and any extra inputs the processor makes.
        """
        with self._tokenizer_lock:
            batch = self.processor(
                images=images, text=[prompt_text] * len(images), padding=True, return_tensors="pt"
            )
        return dict(batch)

    def _generation_config(self, settings: GenerationSettings):
        config = copy.deepcopy(self.model.generation_config)
        config.max_new_tokens = settings.max_new_tokens
        config.max_length = None
        config.num_beams = 1
        config.do_sample = settings.do_sample
        if settings.do_sample:
            config.temperature, config.top_p, config.top_k = settings.temperature, settings.top_p, None
        else:  # unset the sampling knobs a hub generation_config may carry (they would only warn)
            config.temperature = config.top_p = config.top_k = None
        return config

    @torch.inference_mode()
    def generate(
        self, inputs: dict[str, torch.Tensor], settings: GenerationSettings, seed: int | None = None
    ) -> list[Generation]:
        """Describe a batch prepared by :meth:`prepare`.

        Args:
            inputs: the output of :meth:`prepare`.
            settings: decoding settings.
            seed: seed of the sampling generator (sampling only; the global RNG state is restored after).
        """
        inputs = {
            k: v.to(self.device, dtype=self.dtype if v.is_floating_point() else v.dtype)
            for k, v in inputs.items()
        }
        prompt_len = inputs["input_ids"].shape[1]
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, enabled=settings.do_sample):
            if settings.do_sample:
                torch.manual_seed(settings.seed if seed is None else seed)
            out = self.model.generate(**inputs, generation_config=self._generation_config(settings))
        new = out[:, prompt_len:].cpu()
        with self._tokenizer_lock:
            texts = self.tokenizer.batch_decode(new, skip_special_tokens=True)
        is_eos = torch.isin(new, self._eos_ids)
        results = []
        for row, text in zip(range(len(new)), texts, strict=True):
            stops = torch.nonzero(is_eos[row])
            finished = len(stops) > 0
            results.append(
                Generation(text.strip(), int(stops[0]) if finished else new.shape[1], not finished)
            )
        return results


def _check_local_dir(path: Path) -> None:
    if not (path / "config.json").is_file():
        raise MissingFileError(
            f"--model: model directory {path} has no config.json; expected the output of save_pretrained() "
            "or a snapshot of a Hugging Face model repository"
        )
    if not any((path / name).is_file() for name in _PROCESSOR_FILES):
        raise MissingFileError(
            f"--model: model directory {path} has no processor ({' or '.join(_PROCESSOR_FILES)}); save the "
            f"model's processor there with AutoProcessor.from_pretrained(HUB_ID).save_pretrained('{path}')"
        )


def _looks_like_path(name: str) -> bool:
    return os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1 or "\\" in name


def _dtype_kwarg(transformers, dtype: torch.dtype) -> dict[str, torch.dtype]:
    """``from_pretrained``'s precision argument: ``dtype`` since transformers 4.56, ``torch_dtype`` before."""
    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def _load_pretrained(name: str, dtype: torch.dtype, allow_download: bool):
    from patchword.hub import require_transformers

    transformers = require_transformers()

    path = Path(name).expanduser()
    if path.is_dir():
        _check_local_dir(path)
        source = str(path)
    elif path.exists() or _looks_like_path(name):
        raise MissingFileError(f"--model: {path} is not a model directory")
    else:
        source = name
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    local_only = not allow_download or offline
    try:
        processor = transformers.AutoProcessor.from_pretrained(source, local_files_only=local_only)
        model = transformers.AutoModelForImageTextToText.from_pretrained(
            source, local_files_only=local_only, **_dtype_kwarg(transformers, dtype)
        )
    except ValueError as err:
        if "Unrecognized configuration class" in str(err) or "Unrecognized model" in str(err):
            first_line = str(err).split("\n")[0]
            raise ConfigError(
                "--model",
                f"{name!r} is not an image-text-to-text model (LLaVA, LLaVA-NeXT, Qwen2-VL...): {first_line}",
            ) from err
        raise
    except OSError as err:
        if path.is_dir():
            raise ModelNotFoundError(f"--model: could not load the model directory {path}: {err}") from err
        if not allow_download:
            hint = "pass --allow-download to fetch it from the hub, or point --model at a local directory"
        elif offline:
            hint = "HF_HUB_OFFLINE is set, so nothing is downloaded: unset it, or use a local directory"
        else:
            hint = "check the id and the network"
        raise ModelNotFoundError(
            f"--model: {name!r} is neither a local directory nor in the Hugging Face cache; {hint}"
        ) from err
    return model, processor


def check_model_id(model_id: str | None) -> None:
    """Refuse an empty or blank ``--model-id`` (None: the default id), which was silently replaced by the
    default id.

    Raises:
        ConfigError: naming ``--model-id``.
    """
    if model_id is not None and not model_id.strip():
        raise ConfigError("--model-id", "is empty: give the name each line records, or leave it out")


def load_vlm(
    name_or_path: str,
    *,
    device: torch.device,
    precision: str,
    allow_download: bool = False,
    model_id: str | None = None,
    seed: int = 0,
) -> VisionLanguageModel:
    """Load a model and its processor for :func:`patchword.densify.densify`.

    Args:
        name_or_path: a local model directory, a hub id, or ``"tiny-random"``.
        device: where to run (see :func:`patchword.densify.config.resolve_device`).
        precision: ``fp32``, ``bf16`` or ``fp16``.
        allow_download: let a hub id be downloaded (default: local cache only).
        model_id: name written into the output lines (default: the hub id, the directory name, or
            ``tiny-random-llava``).
        seed: initialisation seed of ``tiny-random``.

    Raises:
        MissingFileError: a local directory without config.json or without a processor.
        ModelNotFoundError: a hub id that is not cached (and may not be downloaded), or a directory whose
            weights cannot be loaded.
        ConfigError: the model is not an image-text-to-text model.
    """
    check_model_id(model_id)
    if name_or_path == TINY_RANDOM:
        # the smoke-test model only: tiny builds on this module (through the package), so it stays here
        from patchword.densify.tiny import TINY_MODEL_ID, build_tiny_random

        model, processor = build_tiny_random(seed=seed)
        default_id, fingerprint = TINY_MODEL_ID, f"{TINY_RANDOM}:seed={seed}"  # the seed gives the weights
    else:
        model, processor = _load_pretrained(name_or_path, PRECISIONS[precision], allow_download)
        local = Path(name_or_path).expanduser()
        is_local = local.is_dir()
        default_id = local.name if is_local else name_or_path
        fingerprint = _fingerprint(local if is_local else None, name_or_path)
    return VisionLanguageModel(
        model, processor, default_id if model_id is None else model_id, device, precision, fingerprint
    )


def _fingerprint(directory: Path | None, hub_id: str) -> str | None:
    """The fingerprint of a local model directory, or of the cached snapshot a hub id was loaded from."""
    directory = directory or hub_snapshot(hub_id)
    if directory is None:  # loaded, yet not where the cache lookup looks: compared by --model alone
        logger.warning("%r: cached snapshot not found; the output records no model fingerprint", hub_id)
        return None
    return directory_fingerprint(directory)
