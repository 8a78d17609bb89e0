"""Damaged files a user hands in, fed to every verb that reads them: one ``error:`` line naming the file,
exit code 2, no traceback, nothing written (``patchword.readers``).

Each case copies the shared tiny run and its search index into a fresh workspace, damages one file there
(empty, text, truncated, the wrong JSON shape, another kind's file), runs the verb in-process and compares
the workspace before and after.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from conftest import one_error_line
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from search_support import search_env

    return search_env(tmp_path_factory)


def _workspace(env, tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(env.run_dir, ws / "run")
    shutil.copytree(env.index_dir, ws / "index")
    (ws / "sweep").mkdir()
    summary = (ws / "run" / "summary.json").read_text()
    (ws / "sweep" / "sweep.json").write_text('{"seeds": [0], "runs": {"runs": {"0": ' + summary + "}}}")
    return ws


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


# How a file is damaged: real bytes -> damaged bytes. "another kind" swaps in the bytes of another file the
# user might hand in by mistake (a config for a checkpoint, a checkpoint for a JSON file).
Damage = Callable[[bytes, bytes], bytes]
CHECKPOINT_DAMAGE: dict[str, Damage] = {
    "empty": lambda real, other: b"",
    "text": lambda real, other: b"root:x:0:0:root:/root:/bin/bash\n",
    "truncated": lambda real, other: real[: len(real) // 2],
    "truncated early": lambda real, other: real[:5000],  # inside the first tensor: torch says only EINVAL
    "json": lambda real, other: b'{"runs": 5}',
    "another kind": lambda real, other: other,
}
JSON_DAMAGE: dict[str, Damage] = {
    "empty": lambda real, other: b"",
    "text": lambda real, other: b"hello, world\n",
    "truncated": lambda real, other: real[: len(real) // 2],
    "wrong shape": lambda real, other: b"[1, 2]",
    "another kind": lambda real, other: other,
}
# A JSONL log may end in a line torn by a kill (readers drop it, as the writers do on resume): the damage
# that must be refused is inside the file.
JSONL_DAMAGE: dict[str, Damage] = {
    "text": lambda real, other: b"hello, world\n" + real,
    "wrong shape": lambda real, other: b"[1, 2]\n" + real,
    "another kind": lambda real, other: other,
}

# (verb, file damaged (workspace-relative), the other kind's file, damages, argv)
Argv = Callable[[Path], list[str]]
CASES: list[tuple[str, str, str, dict[str, Damage], Argv]] = [
    ("eval", "run/best.pt", "run/config.yaml", CHECKPOINT_DAMAGE, lambda ws: ["eval", str(ws / "run")]),
    (
        "export",
        "run/best.pt",
        "run/config.yaml",
        CHECKPOINT_DAMAGE,
        lambda ws: ["export", str(ws / "run"), str(ws / "out")],
    ),
    (
        "resume",
        "run/last.pt",
        "run/summary.json",
        CHECKPOINT_DAMAGE,
        lambda ws: ["train", "--resume", str(ws / "run"), "train.epochs=3"],
    ),
    (
        "index build",
        "run/best.pt",
        "run/config.yaml",
        CHECKPOINT_DAMAGE,
        lambda ws: ["index", "build", str(ws / "run"), "--images", str(ws / "run"), "--out", str(ws / "idx")],
    ),
    (
        "import",
        "run/best.pt",
        "run/config.yaml",
        CHECKPOINT_DAMAGE,
        lambda ws: [
            "import",
            str(ws / "run" / "best.pt"),
            "--out",
            str(ws / "imported"),
            "--family",
            "ucmfh",
        ],
    ),
    (
        "eval",
        "run/config.yaml",
        "run/best.pt",
        {"another kind": JSON_DAMAGE["another kind"]},
        lambda ws: ["eval", str(ws / "run")],
    ),
    (
        "export",
        "run/summary.json",
        "run/best.pt",
        JSON_DAMAGE,
        lambda ws: ["export", str(ws / "run"), str(ws / "out")],
    ),
    (
        "report",
        "run/summary.json",
        "run/best.pt",
        JSON_DAMAGE,
        lambda ws: ["report", str(ws / "run"), "--out", str(ws / "report.md")],
    ),
    (
        "report",
        "run/metrics.jsonl",
        "run/best.pt",
        JSONL_DAMAGE,
        lambda ws: ["report", str(ws / "run"), "--out", str(ws / "report.md")],
    ),
    (
        "report",
        "sweep/sweep.json",
        "run/summary.json",
        {**JSON_DAMAGE, "runs not a mapping": lambda real, other: b'{"runs": 5}'},
        lambda ws: ["report", str(ws / "sweep"), "--out", str(ws / "report.md")],
    ),
    (
        "search",
        "index/manifest.json",
        "run/summary.json",
        JSON_DAMAGE,
        lambda ws: ["search", str(ws / "index"), "a cat"],
    ),
    (
        "serve",
        "index/manifest.json",
        "run/summary.json",
        JSON_DAMAGE,
        lambda ws: ["serve", str(ws / "index"), "--port", "0"],
    ),
]

PARAMS = [
    pytest.param(verb, target, other, damage, argv, id=f"{verb}-{target}-{name}")
    for verb, target, other, damages, argv in CASES
    for name, damage in damages.items()
]


@pytest.mark.parametrize(("verb", "target", "other", "damage", "argv"), PARAMS)
def test_a_damaged_file_is_one_line_naming_it_and_nothing_is_written(
    env, tmp_path, capsys, verb, target, other, damage, argv
):
    ws = _workspace(env, tmp_path)
    path = ws / target
    path.write_bytes(damage(path.read_bytes(), (ws / other).read_bytes()))
    before = _snapshot(ws)
    capsys.readouterr()
    assert main(argv(ws)) == 2, verb
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    assert path.name in line, line
    assert "serving" not in captured.out
    assert _snapshot(ws) == before


def test_checkpoint_reader_says_what_the_file_is(tmp_path):
    """The reasons a user can act on: empty, text (quoted), a truncated archive, a pickle of a class the
    restricted unpickler refuses, a mapping without the entry a patchword checkpoint has."""
    from patchword.errors import DataError
    from patchword.readers import read_checkpoint

    good = tmp_path / "good.pt"
    torch.save({"model": {"w": torch.ones(3)}}, good)
    assert torch.equal(read_checkpoint(good, require=("model",))["model"]["w"], torch.ones(3))
    cases = {
        "empty.pt": (b"", "the file is empty"),
        "text.pt": (b"hello world\n", "text starting 'hello world'"),
        "cut.pt": (good.read_bytes()[:200], "truncated or damaged"),
    }
    for name, (data, reason) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(DataError, match=reason) as info:
            read_checkpoint(tmp_path / name)
        assert str(tmp_path / name) in str(info.value)
    torch.save({"optimizer": {}}, tmp_path / "other.pt")
    with pytest.raises(DataError, match="no 'model' entry"):
        read_checkpoint(tmp_path / "other.pt", require=("model",))
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(DataError, match="holds a list, not a mapping"):
        read_checkpoint(tmp_path / "list.pt")
    torch.save({"model": Path("x")}, tmp_path / "class.pt")
    with pytest.raises(DataError, match="refused to unpickle a class.*Path"):
        read_checkpoint(tmp_path / "class.pt")


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
@pytest.mark.parametrize("protocol", [4, 5])
def test_checkpoint_of_a_newer_pickle_protocol_is_named_with_the_way_out(tmp_path, recwarn, protocol, zipped):
    """Old code: torch's restricted loader reads protocol 2 and 3 only; a file saved with
    ``pickle_protocol=4`` was "refused to unpickle a class" (it holds none) after torch's UserWarning."""
    from patchword.errors import DataError
    from patchword.readers import read_checkpoint

    path = tmp_path / "new.pth"
    state = {"model": {"w": torch.ones(3)}, "opt": argparse.Namespace(lr=0.1)}
    torch.save(state, path, pickle_protocol=protocol, _use_new_zipfile_serialization=zipped)
    with pytest.raises(DataError, match=f"new.pth: saved with pickle protocol {protocol}, which") as info:
        read_checkpoint(path, safe_globals=[argparse.Namespace])
    assert "class" not in str(info.value)
    assert not [w for w in recwarn if "pickle protocol" in str(w.message)]
    resaved = tmp_path / "resaved.pth"  # the way out the message gives
    torch.save(torch.load(path, weights_only=False), resaved)
    assert read_checkpoint(resaved, safe_globals=[argparse.Namespace])["opt"].lr == 0.1


def test_checkpoint_reader_refuses_flipped_bytes_inside_a_tensor(tmp_path, capsys):
    """Old code: torch.load does not check the zip members' CRC32, so a checkpoint corrupted in the middle
    (not cut short) loaded other weights without an error (an import gave weights off by up to 1931)."""
    from patchword.errors import DataError
    from patchword.readers import read_checkpoint

    weights = torch.arange(4096, dtype=torch.float32)
    good = tmp_path / "good.pt"
    torch.save({"model": {"w": weights}}, good)
    data = bytearray(good.read_bytes())
    start = bytes(data).index(weights[:4].numpy().tobytes())  # the tensor's bytes, stored uncompressed
    data[start + 4000 : start + 4064] = bytes(64)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(data))
    assert not torch.equal(torch.load(bad, weights_only=True)["model"]["w"], weights)  # torch takes it
    with pytest.raises(DataError, match=r"bad\.pt: not a readable .*fails its CRC check") as info:
        read_checkpoint(bad, require=("model",))
    assert "copy it again" in str(info.value)
    assert torch.equal(read_checkpoint(good, require=("model",))["model"]["w"], weights)


def test_jsonl_reader_drops_a_torn_last_line_and_names_a_bad_row(tmp_path):
    from patchword.errors import DataError
    from patchword.readers import read_json_lines

    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\n{"step": 2}\n{"st')
    assert read_json_lines(log, "metrics log") == [{"step": 1}, {"step": 2}]
    log.write_text('{"step": 1}\n[3]\n{"step": 2}\n')
    with pytest.raises(DataError, match=r"metrics.jsonl:2: .*expected a JSON object, found a list"):
        read_json_lines(log, "metrics log")
    assert read_json_lines(tmp_path / "absent.jsonl", "metrics log") == []
