"""``make gpu-check``'s ``train_compile`` step (``benchmarks/gpu_compile_variants.py``): the variants of a
wave compile at once and are timed one at a time, so that no timed step shares the machine with another
variant's compilation or steps. Stand-in children (a few lines of Python speaking ``gpu-step --wait-go``'s
protocol) record when they compiled and when they timed."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from project_paths import BENCHMARKS
from stall_support import HANG_GUARD_S

sys.path.insert(0, str(BENCHMARKS))
import gpu_compile_variants as gcv  # noqa: E402

# A stand-in gpu-step: says it began "compiling" (a file in the gate directory), compiles until the gate
# file "release" exists, then dies ("fail") or says it is ready, waits for its turn, "times" for 0.2 s
# and writes its JSON. "hang" never gets ready, and leaves the time it last compiled in "heartbeat".
# Ordering is read from the time stamps it records, never from how long anything took.
CHILD = """
import json, pathlib, sys, time
out, how, gate = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
began = time.time()
(gate / f"began-{pathlib.Path(out).stem}").touch()
while how == "hang" or not (gate / "release").exists():
    if how == "hang":  # still compiling: a heartbeat, replaced whole (a kill inside a write left it empty)
        (gate / "heartbeat.tmp").write_text(str(time.time()))
        (gate / "heartbeat.tmp").replace(gate / "heartbeat")
    time.sleep(0.01)
if how == "fail":
    print("Traceback: the compiler failed", flush=True)
    sys.exit(1)
ready = time.time()
(gate / f"ready-{pathlib.Path(out).stem}").touch()
print("gpu-step: ready", flush=True)
if not sys.stdin.readline():
    sys.exit("no turn")
start = time.time()
time.sleep(0.2)
row = {"steps_per_s": 1.0, "batch": 8, "began": began, "ready": ready, "timed": [start, time.time()]}
json.dump(row, open(out, "w"))
"""


def _variants(text: str) -> list[dict]:
    return gcv.parse_compile_variants(text)


@pytest.fixture(autouse=True)
def _open_the_gate_at_the_end(tmp_path):
    """A test that fails before it opens the gate would leave its stand-in children compiling after it:
    the gate opens at teardown, so they end."""
    yield
    gate = tmp_path / "gate"
    if gate.is_dir():
        (gate / "release").touch()


def _runner(tmp_path, variants, how: dict, parallel: int, free_s=lambda: 600.0, before_turns=None):
    """run_variants over stand-in children, in a thread: (a function that waits for its rows, gate dir)."""
    script, gate = tmp_path / "child.py", tmp_path / "gate"
    script.write_text(CHILD)
    gate.mkdir()
    rows, reported = [], []

    def command(variant, out):
        return [
            sys.executable,
            str(script),
            str(out),
            how[gcv.variant_label(variant)],
            str(gate),
            "--json",
            str(out),
        ]

    def run():
        rows.extend(
            gcv.run_variants(
                variants, command, {}, tmp_path, tmp_path, parallel, free_s, reported.append, before_turns
            )
        )

    thread = threading.Thread(target=run, daemon=True)  # a runner that hangs must not hang pytest

    def finish() -> list[dict]:
        thread.join(timeout=HANG_GUARD_S)
        if thread.is_alive():
            pytest.fail(f"hang guard: run_variants did not return in {HANG_GUARD_S:g} s")
        assert len(rows) == len(variants)
        assert rows == reported  # reported as each finishes, in variant order
        return rows

    thread.start()
    return finish, gate


def _wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S  # a hang guard: only ever reached when the runner is wrong
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"hang guard ({HANG_GUARD_S:g} s): {what}")
        time.sleep(0.01)


def test_a_wave_compiles_at_once_and_times_one_variant_at_a_time(tmp_path):
    variants = _variants("bf16:step,bf16:step:reduce-overhead,bf16:step:reduce-overhead:math-bf16")
    background = []  # when the work run beside the compilation was waited for
    how = dict.fromkeys(map(gcv.variant_label, variants), "ok")
    finish, gate = _runner(tmp_path, variants, how, 3, before_turns=lambda: background.append(time.time()))
    # all three compile at once: none is ready (the gate is shut) and yet all have begun
    _wait_for(lambda: len(list(gate.glob("began-*"))) == 3, "the variants of a wave did not compile at once")
    (gate / "release").touch()
    rows = finish()
    assert [gcv.variant_label(r) for r in rows] == list(map(gcv.variant_label, variants))
    assert all(r["compiling_at_once"] == 3 and r["ready_s"] is not None for r in rows)
    turns = [r["timed"] for r in rows]
    assert turns[0][0] >= max(r["ready"] for r in rows)  # no turn while another variant compiles
    assert len(background) == 1 and max(r["ready"] for r in rows) <= background[0] <= turns[0][0]
    assert all(
        later[0] >= earlier[1] for earlier, later in zip(turns, turns[1:], strict=False)
    )  # one at a time


def test_waves_follow_each_other_and_a_failed_compilation_keeps_its_last_lines(tmp_path):
    variants = _variants("bf16:step,bf16:step:reduce-overhead,bf16:modules")
    how = {"bf16:step": "ok", "bf16:step:reduce-overhead": "fail", "bf16:modules": "ok"}
    finish, gate = _runner(tmp_path, variants, how, parallel=2)
    (gate / "release").touch()
    rows = finish()
    ok, failed, second_wave = rows
    assert ok["steps_per_s"] == 1.0 and ok["compiling_at_once"] == 2
    assert failed["status"].startswith("failed: exit 1") and failed["tail"] == [
        "Traceback: the compiler failed"
    ]
    log = tmp_path / "train_compile_bf16_step_reduce-overhead.log"
    assert log.read_text() == "Traceback: the compiler failed\n"  # a child's whole output is kept
    assert second_wave["steps_per_s"] == 1.0 and second_wave["compiling_at_once"] == 1
    assert second_wave["began"] > ok["timed"][1]  # the second wave starts once the first has been timed


def test_a_variant_still_compiling_when_the_budget_ends_is_stopped_before_any_turn(tmp_path):
    variants = _variants("bf16:step,bf16:step:reduce-overhead")
    how = {"bf16:step": "ok", "bf16:step:reduce-overhead": "hang"}
    gate = tmp_path / "gate"

    def free_s() -> float:  # plenty until the first child is ready, then only the two turns' reserve
        ready = (gate / "ready-train_compile_bf16_step").exists()
        return 2 * gcv.TURN_RESERVE_S - 1 if ready else 600.0

    finish, _ = _runner(tmp_path, variants, how, parallel=2, free_s=free_s)
    (gate / "release").touch()
    ok, hung = finish()
    assert ok["steps_per_s"] == 1.0 and hung["status"].startswith("not compiled in")
    assert "tail" not in hung  # stopped by the budget, not failed
    assert float((gate / "heartbeat").read_text()) < ok["timed"][0]  # and before the other's turn


def test_the_child_command_asks_gpu_step_to_wait_for_its_turn(tmp_path):
    (variant,) = _variants("bf16:step:reduce-overhead:eager-attention-all")
    cmd = gcv.variant_command("python3", BENCHMARKS.parent, variant, "cuda", False, tmp_path / "v.json")
    assert cmd[cmd.index("--json") + 1] == str(tmp_path / "v.json") and "--wait-go" in cmd
    assert cmd[cmd.index("--compile-mode") + 1] == "reduce-overhead"
    assert cmd[cmd.index("--eager-attention") + 1] == "all" and "--quick" not in cmd
    assert gcv.parse_compile_variants("amp_bf16:modules") == [
        {"precision": "amp_bf16", "scope": "modules", "mode": None, "flags": []}
    ]


def test_a_variant_of_two_caption_widths_steps_over_batches_cut_and_padded_to_them():
    import ddp_bench
    import torch

    from patchword.data.batches import ShardBatch

    (variant,) = _variants("bf16:step:reduce-overhead:widths-32-40")
    cmd = gcv.variant_command("python3", BENCHMARKS.parent, variant, "cuda", False, BENCHMARKS / "v.json")
    assert cmd[cmd.index("--caption-widths") + 1] == "32,40"
    lens = torch.tensor([35, 12])
    ids = torch.arange(1, 71).reshape(2, 35) * (torch.arange(35) < lens[:, None])
    shard = ShardBatch(images=torch.zeros(2, 3), ids=ids, lens=lens, lens_all=lens, img_ids=torch.arange(2))
    cut, padded = ddp_bench.caption_width(shard, 32), ddp_bench.caption_width(shard, 40)
    assert cut.ids.shape == (2, 32) and cut.lens.tolist() == [32, 12] and torch.equal(cut.ids, ids[:, :32])
    assert padded.ids.shape == (2, 40) and padded.lens.tolist() == [35, 12]
    assert torch.equal(padded.ids[:, :35], ids) and not padded.ids[:, 35:].any()
