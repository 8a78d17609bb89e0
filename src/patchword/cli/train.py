"""``patchword train``: start a run, or continue one with ``--resume RUN``.

``torchrun --nproc_per_node=N -m patchword train ...`` trains with N processes (one per GPU, or gloo on
the CPU): see docs/distributed.md. Rank 0 logs, writes the run directory and prints the summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

__all__ = ["add_arguments", "quiet_other_rank", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", help="YAML file with RunConfig fields, or a shipped recipe's name (e.g. demo)"
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const="",
        metavar="RUN",
        help="continue a run from its last.pt with its own saved config: a run directory, or (without a "
        "value) the run that output_dir= / name= overrides point at. Only what does not change what is "
        "trained may be overridden: step, epoch and time limits, how often to log, validate and save, the "
        "device, threads, compilation, pair chunking and text width, data workers and cache, trackers, "
        "progress, dist_timeout_s and eval.* options; any other key is refused, naming it.",
    )
    parser.add_argument(
        "overrides", nargs="*", help="dotted config overrides, e.g. model.seps.sparse_ratio=0.6"
    )


def _resume_target(resume: str, overrides: list[str]) -> tuple[Path, list[str]]:
    """``--resume RUN`` or ``--resume name=X [output_dir=Y]`` -> (run directory, remaining overrides)."""
    if "=" in resume:  # argparse took the first override as the value: `--resume name=rho06`
        overrides = [resume, *overrides]
        resume = ""
    if resume:
        return Path(resume), overrides
    where = {"output_dir": "runs", "name": None}
    rest = []
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key in where:
            where[key] = item.split("=", 1)[1].strip()
        else:
            rest.append(item)
    if not where["name"]:
        from patchword.errors import ConfigError

        raise ConfigError("name", "--resume needs a run directory (--resume runs/NAME) or name=NAME")
    return Path(where["output_dir"]) / where["name"], rest


def quiet_other_rank() -> None:
    """The logging of a process other than rank 0 (``patchword train`` and ``patchword eval``): rank 0
    reports. patchword's warnings are the same in every process (each checks the same config and data; a
    step's values are the global batch's), so they come from rank 0 alone; errors still come from every
    process, and so do the warnings about the image files this process decodes for its own shard
    (``patchword.data.images``) and other libraries' warnings."""
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("patchword").setLevel(logging.ERROR)
    logging.getLogger("patchword.data.images").setLevel(logging.WARNING)


def run(args: argparse.Namespace) -> None:
    from patchword.distributed import launch_info
    from patchword.runs.config import load_run_config
    from patchword.train.runner import resume_run, train_run

    main = launch_info().rank == 0
    if not main:
        quiet_other_rank()
    if args.resume is not None:
        if args.config is not None:
            from patchword.errors import ConfigError

            raise ConfigError("--config", "a resumed run keeps its own config.yaml: drop --config")
        run_dir, overrides = _resume_target(args.resume, list(args.overrides))
        summary = resume_run(run_dir, overrides)
    else:
        cfg = load_run_config(args.config, args.overrides)
        summary = train_run(cfg)
    if main:  # stdout: the summary alone (| jq), with the run directory it describes
        run_dir = run_dir if args.resume is not None else Path(cfg.output_dir) / cfg.name
        shown = {k: v for k, v in summary.items() if not isinstance(v, (list, dict))}
        print(json.dumps({"run_dir": str(run_dir), **shown}, indent=2))
        print(f"written: {run_dir}", file=sys.stderr)
