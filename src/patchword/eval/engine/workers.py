"""Scoring blocks in single-threaded worker threads on the CPU (the SEPS engine and the forward engine):
why, in :func:`in_workers`."""

from __future__ import annotations

import functools

import torch

__all__ = ["cpu_workers", "engine_plan", "in_workers", "plan_for_workers"]


def cpu_workers(device: torch.device, workers: int | None) -> int:
    """Threads of control for a CPU scoring job: ``workers``, or (None) one per torch thread."""
    if device.type != "cpu":
        return 1
    return max(1, torch.get_num_threads() if workers is None else workers)


def plan_for_workers(plan, inputs, budget: int, workers: int):
    """``(plan(inputs, budget // workers), workers)``, or with one worker and the whole budget when the
    share of one worker is too small for a single block."""
    try:
        return plan(inputs, budget // workers), workers
    except ValueError:
        if workers == 1:
            raise
        return plan(inputs, budget), 1


def engine_plan(engine, inputs, budget: int, device):
    """``(plan, workers)`` of an engine with ``plan`` and ``workers`` attributes for these inputs on
    ``device``; the plan records its worker count and becomes ``engine.last_plan``."""
    device = torch.device(device)
    plan, workers = plan_for_workers(
        functools.partial(engine.plan, device=device), inputs, budget, cpu_workers(device, engine.workers)
    )
    plan.details["workers"] = workers
    engine.last_plan = plan
    return plan, workers


def in_workers(workers: int, items, fn) -> None:
    """``fn(item)`` for every item, in ``workers`` threads that each take the next item when they are
    done with one (a shared queue), each single-threaded in torch; re-raises the first error. After an
    error or an interrupt no further item is started.

    Why not torch's intra-op threads: every op of a scoring block is a parallel region whose threads
    meet at a barrier at its end, and OpenMP threads spin while they wait. When another process holds
    a core, the thread that shares it runs at a fraction of its speed, every region waits for it, and
    the spinning of the others steals time from the same cores (scoring degraded ~4.6x when one of two
    cores was busy, docs/distributed.md). Single-threaded workers never wait for each other inside a
    block: a slowed worker simply takes fewer blocks, so the job slows by about the share of the busy
    core. The thread count is set inside each worker; torch also keeps that number as the default of
    threads created later, so the caller's count is set again afterwards (grad mode is per thread).
    """
    import threading
    from concurrent.futures import ThreadPoolExecutor

    queue, lock, stop = iter(items), threading.Lock(), threading.Event()

    def work() -> None:
        torch.set_num_threads(1)
        with torch.no_grad():
            while not stop.is_set():
                with lock:
                    item = next(queue, None)
                if item is None:
                    return
                try:
                    fn(item)
                except BaseException:
                    stop.set()  # the others finish the block in hand and take no more
                    raise

    if workers <= 1:
        for item in queue:
            fn(item)
        return
    caller = torch.get_num_threads()
    try:
        with ThreadPoolExecutor(workers) as pool:
            futures = [pool.submit(work) for _ in range(workers)]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                # Ctrl-C (or an error) in the caller: stop handing out blocks, so that leaving the pool
                # waits for the blocks in hand only, not for the whole job.
                stop.set()
                raise
    finally:
        torch.set_num_threads(caller)
