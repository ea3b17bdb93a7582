"""engine/kept_buffer.py: one tensor a hot path's large temporaries are views of."""

import torch

from engine.kept_buffer import KeptBuffer


def test_views_of_one_tensor_grown_geometrically():
    kept = KeptBuffer(torch.float32)
    a = kept.take(3, 5)
    assert a.shape == (3, 5) and a.dtype == torch.float32 and a.is_contiguous()
    b = kept.take(2, 5)  # fewer: the same memory
    assert b.data_ptr() == a.data_ptr() and kept.nbytes == 60
    c = kept.take(4, 5)  # more: doubled (30 floats), not just enough
    assert c.shape == (4, 5) and kept.nbytes == 120
    assert kept.take(6, 5).data_ptr() == c.data_ptr()
    assert kept.take(7).shape == (7,)


def test_past_its_limit_a_request_gets_a_tensor_of_its_own():
    kept = KeptBuffer(torch.uint8, limit_bytes=100)
    small = kept.take(60)
    assert kept.take(80).data_ptr() == kept.take(10).data_ptr()  # grown to 100 (the cap), not 120
    assert kept.nbytes == 100
    big = kept.take(101)
    assert big.numel() == 101 and kept.nbytes == 100  # not kept
    assert small.dtype == torch.uint8


def test_another_device_starts_afresh():
    kept = KeptBuffer(torch.float32)
    kept.take(10)
    meta = kept.take(4, device="meta")
    assert meta.device.type == "meta" and kept.nbytes == 16
