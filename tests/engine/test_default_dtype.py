"""Two models built at once on two threads (the embedded server loads each model on a thread of its
own) each get their own dtype, and the process's default dtype is given back: torch's default is
the process's, so engine.runtime.device.default_dtype lets one block run at a time."""

import threading

import torch

from engine.runtime.device import default_dtype


def test_overlapping_builds_on_two_threads_keep_their_own_dtypes():
    before = torch.get_default_dtype()
    first_inside, second_inside, first_done, seen = threading.Event(), threading.Event(), threading.Event(), {}

    def first():
        with default_dtype(torch.bfloat16):
            first_inside.set()
            second_inside.wait(0.5)  # it cannot enter while this block runs (it could, before)
            seen["first"] = torch.nn.LayerNorm(4).weight.dtype
        first_done.set()

    def second():
        first_inside.wait(5)
        with default_dtype(torch.float64):
            second_inside.set()
            seen["second"] = torch.nn.Linear(4, 4).weight.dtype
            seen["second entered after the first ended"] = first_done.wait(5)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == {"first": torch.bfloat16, "second": torch.float64, "second entered after the first ended": True}
    assert torch.get_default_dtype() == before


def test_a_block_inside_a_block_on_one_thread_does_not_wait_for_itself():
    with default_dtype(torch.bfloat16):
        with default_dtype(torch.float64):
            assert torch.get_default_dtype() == torch.float64
        assert torch.get_default_dtype() == torch.bfloat16
    assert torch.get_default_dtype() == torch.float32
