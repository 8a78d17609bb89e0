"""The README's library example runs as printed and says what it claims (shapes, names)."""

from __future__ import annotations

import re

import pytest

from project_paths import ROOT

README = ROOT / "README.md"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_library_example_runs():
    # create_model("seps-vit-b16-code") builds HF ViT + BERT (random init)
    pytest.importorskip("transformers")
    blocks = _python_blocks(README.read_text())
    assert len(blocks) == 1, "update this test when the README gains Python examples"
    scope: dict = {}
    exec(compile(blocks[0], str(README), "exec"), scope)  # noqa: S102 - our own README
    assert tuple(scope["out"].sims.shape) == (4, 6)
    assert scope["model"].image_encoder.num_patches == 196 and scope["model"].image_encoder.image_size == 224
    assert {"seps-vit-b16-code", "laps-swin-b-384", "scan-t2i-precomp", "tgdt-precomp"} <= set(
        scope["list_models"]()
    )
    assert set(scope["metrics"]) >= {"i2t_r1", "t2i_r10", "rsum"}


def test_readme_names_every_registered_matcher():
    """The README's list of registered matchers is the registry's (f715cbc's omitted ``filip``)."""
    from patchword.matching import list_matchers
    from patchword.matching.registry import matcher_spec

    sentence = re.search(
        r"Registered matchers \(`patchword.matching.list_matchers\(\)`\):(.*?)\. Every",
        README.read_text(),
        flags=re.S,
    )
    assert sentence is not None
    listed = set(re.findall(r"`([a-z]+)`", sentence.group(1)))
    # the built-in ones (a plug-in another test registered is not the README's business)
    built_in = {n for n in list_matchers() if matcher_spec(n).cls.__module__.startswith("patchword.")}
    assert listed == built_in
