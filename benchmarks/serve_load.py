"""Search at scale: index build speed and size, and `patchword serve` latency and throughput under load.

For each size N (synthetic scenes exported as PNG files, rendered at the run's image size):

1. ``patchword index build`` in a child process: images/s (encoding loop, from its report, and end to end),
   index size per image, the child's peak RSS;
2. ``patchword serve`` in a child process (global shortlist over all N images, the fine matcher re-ranks
   only the ``--shortlist`` best), then ``--clients`` concurrent clients (default 1 and 32), each with its
   own keep-alive connection, sending ``GET /api/search?q=<test caption>&k=10``: latency p50 / p95,
   throughput, failed requests (any non-200 answer or transport error), the server's peak RSS (VmHWM).

Prints a markdown table (and writes it with the raw numbers as JSON under ``--out``). Usage::

    # the measurements of docs/benchmarks.md (after `make demo`; an idle machine, ~1 h for 100k images)
    python benchmarks/serve_load.py --run runs/demo --sizes 10000 100000 --out benchmarks/results

    # a smoke test of the script itself (seconds)
    python benchmarks/serve_load.py --run RUN --sizes 200 --requests 20 --work /tmp/serve_load

Images and indexes are kept under ``--work`` (default ``<out>/serve_load_work``) and reused by later runs of
the same sizes (delete the folder to rebuild). Client and server share the machine: on a 2-core CPU the
client threads take some of the server's CPU, so throughput at 32 clients is a lower bound.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import replace
from http.client import HTTPConnection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _child(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


INDEX_CMD = "import sys; from patchword.cli.search import main_index; sys.exit(main_index(sys.argv[1:]))"
SERVE_CMD = "import sys; from patchword.cli.serve import main_serve; sys.exit(main_serve(sys.argv[1:]))"


def export_images(run_dir: Path, size: int, work: Path) -> Path:
    """The synthetic test split with ``size`` images, rendered for the run, exported once under ``work``."""
    from patchword.data.export import export_synthetic_split
    from patchword.runs import read_run_config

    out = work / f"images-{size}"
    if (out / "export.json").is_file():
        return out
    config = replace(read_run_config(run_dir).data.synthetic_config(), num_test=size, num_train=1, num_dev=1)
    print(f"exporting {size} synthetic images to {out} ...", flush=True)
    export_synthetic_split(out, "test", config=config, workers=os.cpu_count() or 2)
    return out


def build(run_dir: Path, export: Path, index: Path, args: argparse.Namespace) -> dict:
    """Build (once) and measure: wall time, encoding images/s, size on disk, the child's peak RSS."""
    if (index / "manifest.json").is_file() and (index / "bench_build.json").is_file():
        return json.loads((index / "bench_build.json").read_text())
    shutil.rmtree(index, ignore_errors=True)
    cmd = _child(
        INDEX_CMD,
        "build",
        str(run_dir),
        "--images",
        str(export / "images"),
        "--out",
        str(index),
        "--batch-size",
        str(args.batch_size),
        "--device",
        args.device,
    )
    if args.fp16:
        cmd.append("--fp16")
    if args.dense:
        cmd += ["--dense", str(export / "test.jsonl")]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"index build failed:\n{done.stdout}\n{done.stderr}")
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    match = re.search(r"\(([0-9.]+) images/s encoding\)", done.stdout)
    images = len(list((export / "images").iterdir()))
    size_bytes = sum(p.stat().st_size for p in index.rglob("*") if p.is_file())
    result = {
        "images": images,
        "build_wall_s": wall,
        "build_images_per_s": images / wall,
        "encode_images_per_s": float(match.group(1)) if match else None,
        "index_bytes": size_bytes,
        "index_kib_per_image": size_bytes / 1024 / images,
        # ru_maxrss of all waited-for children: the largest so far, this build's unless an earlier was larger
        "build_peak_rss_mib": max(peak_kib, before) / 1024,
    }
    (index / "bench_build.json").write_text(json.dumps(result, indent=2))
    return result


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(
                f"serve exited with {proc.returncode}:\n{proc.stderr.read() if proc.stderr else ''}"
            )
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("serve did not become ready")


def _peak_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = int(position), min(int(position) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def load(host: str, port: int, queries: list[str], clients: int, requests: int, k: int) -> dict:
    """``requests`` searches spread over ``clients`` threads, each on its own keep-alive connection."""
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    counter = iter(range(requests))

    def client(seed: int) -> None:
        rng = random.Random(seed)
        conn = HTTPConnection(host, port, timeout=120)
        while True:
            with lock:
                if next(counter, None) is None:
                    break
            path = f"/api/search?q={urllib.parse.quote(rng.choice(queries))}&k={k}"
            t0 = time.perf_counter()
            try:
                conn.request("GET", path)
                response = conn.getresponse()
                body = response.read()
                elapsed = time.perf_counter() - t0
                ok = response.status == 200 and len(json.loads(body)["results"]) > 0
            except Exception as err:  # noqa: BLE001 - every failure is counted, never hidden
                with lock:
                    failures.append(repr(err))
                conn.close()
                conn = HTTPConnection(host, port, timeout=120)
                continue
            with lock:
                if ok:
                    latencies.append(elapsed)
                else:
                    failures.append(f"HTTP {response.status}: {body[:200]!r}")
        conn.close()

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(clients)]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - t0
    return {
        "clients": clients,
        "requests": requests,
        "ok": len(latencies),
        "failed": len(failures),
        "failures": failures[:5],
        "p50_ms": 1000 * _percentile(latencies, 0.5) if latencies else None,
        "p95_ms": 1000 * _percentile(latencies, 0.95) if latencies else None,
        "throughput_rps": len(latencies) / wall,
    }


def serve_and_load(index: Path, export: Path, args: argparse.Namespace) -> tuple[list[dict], float | None]:
    port = args.port
    cmd = _child(
        SERVE_CMD,
        str(index),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(args.workers),
        "--shortlist",
        str(args.shortlist),
        "--device",
        args.device,
        "--log-level",
        "warning",
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(f"http://127.0.0.1:{port}", proc, timeout=600)
        queries = (export / "test_caps.txt").read_text().splitlines()
        load("127.0.0.1", port, queries, 2, min(20, args.requests), args.k)  # warm-up
        results = []
        for clients in args.clients:
            requests = max(args.requests, 4 * clients)
            print(f"  {clients} clients, {requests} requests ...", flush=True)
            results.append(load("127.0.0.1", port, queries, clients, requests, args.k))
        return results, _peak_rss_mib(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def table(rows: list[dict]) -> str:
    head = (
        "| images | build img/s (encode / end to end) | index KiB/image | build peak RSS MiB | clients | "
        "p50 ms | p95 ms | req/s | failed | serve peak RSS MiB |"
    )
    lines = [head, "|" + "---|" * 10]
    for row in rows:
        b = row["build"]
        for run in row["load"]:
            lines.append(
                f"| {b['images']} | {_fmt(b['encode_images_per_s'])} / {_fmt(b['build_images_per_s'])} | "
                f"{_fmt(b['index_kib_per_image'])} | {_fmt(b['build_peak_rss_mib'], 0)} | {run['clients']} | "
                f"{_fmt(run['p50_ms'])} | {_fmt(run['p95_ms'])} | {_fmt(run['throughput_rps'])} | "
                f"{run['failed']} of {run['requests']} | {_fmt(row['serve_peak_rss_mib'], 0)} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="trained run directory (e.g. runs/demo)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="indexed images")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 32], help="concurrent clients")
    parser.add_argument(
        "--requests", type=int, default=200, help="requests per client count (>= 4 x clients)"
    )
    parser.add_argument(
        "--shortlist", type=int, default=100, help="images the fine matcher re-ranks per query"
    )
    parser.add_argument("-k", type=int, default=10, help="results per query")
    parser.add_argument("--workers", type=int, default=2, help="serve --workers")
    parser.add_argument("--batch-size", type=int, default=64, help="index build --batch-size")
    parser.add_argument("--fp16", action="store_true", help="index build --fp16")
    parser.add_argument("--no-dense", dest="dense", action="store_false", help="index without dense captions")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--work", type=Path, default=None, help="images and indexes (default <out>/serve_load_work)"
    )
    args = parser.parse_args(argv)
    work = args.work or args.out / "serve_load_work"
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in args.sizes:
        export = export_images(args.run, size, work)
        index = work / f"index-{size}{'-fp16' if args.fp16 else ''}"
        print(f"{size} images: index build ...", flush=True)
        built = build(args.run, export, index, args)
        print(f"{size} images: serve under load ...", flush=True)
        loads, serve_peak = serve_and_load(index, export, args)
        rows.append({"size": size, "build": built, "load": loads, "serve_peak_rss_mib": serve_peak})
    text = table(rows)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    (args.out / "serve_load.md").write_text(text + "\n")
    (args.out / "serve_load.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    failed = sum(run["failed"] for row in rows for run in row["load"])
    if failed:
        print(f"{failed} requests failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
