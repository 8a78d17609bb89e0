"""Shared pytest fixtures."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_thread():
    """Run a test with one torch thread, restoring the previous count afterwards.

    Tiny tensors: with two threads the OpenMP barriers cost more than the work (and several times more when
    other jobs load the machine). Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
