"""Recall through the live server: does `GET /api/search` find each test caption's image?

Sends every caption of an exported split (``patchword data export synthetic``) to a running
``patchword serve`` and counts how often the caption's own image is among the top 1 / 5 / 10 results: the
server's text-to-image R@K, to compare with the run's ``t2i_r*`` (``summary.json``). With the default
shortlist (100 of 1000 images) the two differ only where the global shortlist misses an image the fine
matcher would have ranked in the top 10.

    patchword data export synthetic --split test --out /tmp/scenes --run runs/demo
    patchword index build runs/demo --images /tmp/scenes/images --dense /tmp/scenes/test.jsonl --out /tmp/idx
    patchword serve /tmp/idx --port 8000 &
    python benchmarks/search_recall.py --url http://127.0.0.1:8000 --export /tmp/scenes --run runs/demo
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx


def search_recall(url: str, export: Path, split: str = "test", limit: int | None = None) -> dict[str, float]:
    captions = (export / f"{split}_caps.txt").read_text().splitlines()
    ids = (export / f"{split}_ids.txt").read_text().splitlines()
    files = json.loads((export / "id_mapping.json").read_text())
    pairs = list(zip(captions, ids, strict=True))[:limit]
    hits = {1: 0, 5: 0, 10: 0}
    start = time.perf_counter()
    with httpx.Client(base_url=url, timeout=60) as client:
        for caption, image_id in pairs:
            answer = client.get("/api/search", params={"q": caption, "k": 10})
            answer.raise_for_status()
            paths = [Path(r["path"]).name for r in answer.json()["results"]]
            want = Path(files[image_id]).name
            for k in hits:
                hits[k] += want in paths[:k]
    seconds = time.perf_counter() - start
    out = {f"t2i_r{k}": 100.0 * n / len(pairs) for k, n in hits.items()}
    out.update(queries=len(pairs), seconds=seconds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--export", type=Path, required=True, help="a `patchword data export` directory")
    parser.add_argument("--split", default="test")
    parser.add_argument("--run", type=Path, help="the run whose summary.json t2i recall to print beside")
    parser.add_argument("--limit", type=int, help="only the first N captions")
    args = parser.parse_args()
    got = search_recall(args.url, args.export, args.split, args.limit)
    print(json.dumps(got))
    if args.run:
        summary = json.loads((args.run / "summary.json").read_text())
        print("| | t2i R@1 | R@5 | R@10 |\n|---|---|---|---|")
        print(
            f"| through `GET /api/search` ({got['queries']} captions) | "
            + " | ".join(f"{got[f't2i_r{k}']:.1f}" for k in (1, 5, 10))
            + " |"
        )
        print(
            "| the run's evaluation (summary.json) | "
            + " | ".join(f"{summary[f't2i_r{k}']:.1f}" for k in (1, 5, 10))
            + " |"
        )


if __name__ == "__main__":
    main()
