"""``tiny-random``: a seeded, randomly initialised LLaVA built in-process, for smoke tests (no download).

It is a real :class:`transformers.LlavaForConditionalGeneration` (a CLIP vision tower, a projector and a
Llama decoder, each a few thousand parameters) with a real :class:`transformers.LlavaProcessor` (CLIP
image preprocessing, a word-level tokenizer built offline with the ``tokenizers`` library, and a
LLaVA-1.5 style chat template). Everything densify does with a real model happens (batching, left
padding, image tokens, greedy decoding, saving and reloading with ``save_pretrained``), but the weights
are random: **its text is nonsense**, a string of words from a small caption vocabulary.

The same seed gives the same weights, hence the same text, on every machine. Generation never emits the
special tokens (they are suppressed), so every description has at least two words.
"""

from __future__ import annotations

import torch

__all__ = ["TINY_MODEL_ID", "TINY_WORDS", "build_tiny_random"]

TINY_MODEL_ID = "tiny-random-llava"

_SPECIALS = ("<pad>", "<unk>", "<s>", "</s>", "<image>")
_ROLES = ("USER:", "ASSISTANT:")

# The words the tiny model can say: caption vocabulary, with the synthetic scenes' shapes and colours.
_WORDS = """
    a an the this image picture photo scene shows features depicts contains there is are of in on at with and
    to near next by its it which while as for from background foreground left right top bottom middle centre
    corner side small large big little tall bright dark light plain grey white black red green blue yellow
    orange purple cyan brown pink circle circles square squares triangle triangles diamond diamonds cross
    crosses shape shapes object objects man woman person people child dog cat ball table street tree water
    grass sky building car standing sitting walking running holding looking wearing playing together two three
    four several some other another one each arranged placed located overall atmosphere appears likely
"""
TINY_WORDS = tuple(_WORDS.split())

# The LLaVA-1.5 conversation format ("USER: <image>\n{prompt} ASSISTANT:"), as a chat template.
_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}USER: "
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>\n"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %} {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)

_IMAGE_SIZE = 16
_PATCH_SIZE = 4


def _tokenizer():
    return word_level_tokenizer((*_SPECIALS, *_ROLES, *TINY_WORDS))


def word_level_tokenizer(tokens):
    """A whitespace word-level LLaVA-style tokenizer over ``tokens`` (which must hold ``<unk>``, ``<s>``,
    ``</s>``, ``<pad>`` and ``<image>``): id i is ``tokens[i]``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(tokens)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_special_tokens={"image_token": "<image>"},
    )


def _image_processor():
    import transformers

    # The PIL backend needs no torchvision (the default backend does, and warns without it).
    cls = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor
    return cls(size={"shortest_edge": _IMAGE_SIZE}, crop_size={"height": _IMAGE_SIZE, "width": _IMAGE_SIZE})


def build_tiny_random(seed: int = 0):
    """Build the tiny LLaVA and its processor.

    Args:
        seed: initialisation seed (the global torch RNG is left untouched).

    Returns:
        ``(model, processor)``: a :class:`~transformers.LlavaForConditionalGeneration` in eval mode and a
        :class:`~transformers.LlavaProcessor`; both can be saved with ``save_pretrained`` and reloaded with
        ``AutoModelForImageTextToText`` / ``AutoProcessor``.
    """
    from patchword.hub import require_transformers

    require_transformers()  # a clear ImportError naming the extra when it is missing
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tokenizer = _tokenizer()
    ids = tokenizer.convert_tokens_to_ids
    processor = LlavaProcessor(
        image_processor=_image_processor(),
        tokenizer=tokenizer,
        patch_size=_PATCH_SIZE,
        vision_feature_select_strategy="default",
        chat_template=_CHAT_TEMPLATE,
        num_additional_image_tokens=1,  # CLIP's class token
    )
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=_IMAGE_SIZE,
        patch_size=_PATCH_SIZE,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        # Wider than the 0.02 default, so that the images visibly steer the (random) words.
        initializer_range=0.2,
        pad_token_id=ids("<pad>"),
        bos_token_id=ids("<s>"),
        eos_token_id=ids("</s>"),
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config).eval()
    generation = model.generation_config
    generation.pad_token_id, generation.bos_token_id, generation.eos_token_id = (
        ids("<pad>"),
        ids("<s>"),
        ids("</s>"),
    )
    generation.suppress_tokens = [ids(t) for t in (*_SPECIALS, *_ROLES) if t != "</s>"]
    generation.min_new_tokens = 2
    return model, processor
