import pytest
import torch

from engine.errors import InvalidParameterError
from engine.kernels.activation import silu_and_mul, silu_and_mul_ref


def test_reference_is_silu_of_gate_times_up():
    x = torch.randn(4, 2 * 10, generator=torch.Generator().manual_seed(0))
    gate, up = x[:, :10], x[:, 10:]
    expected = gate * torch.sigmoid(gate) * up
    torch.testing.assert_close(silu_and_mul_ref(x), expected, atol=1e-6, rtol=1e-6)


# 1536 columns span two programs per row (BLOCK_I 1024) with a masked tail; 100 is one tile.
@pytest.mark.parametrize("intermediate", [100, 1536])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_silu_and_mul_kernel_matches_reference(device, assert_close, dtype, intermediate):
    gen = torch.Generator().manual_seed(0)
    x = (4 * torch.randn(3, 2 * intermediate, generator=gen)).to(dtype).to(device)
    assert_close(silu_and_mul(x), silu_and_mul_ref(x))


def test_silu_and_mul_kernel_reads_rows_of_a_wider_tensor(device, assert_close):
    x = torch.randn(3, 2 * 100 + 8, generator=torch.Generator().manual_seed(0)).to(device)
    strided = x[:, :200]  # row stride 208
    assert_close(silu_and_mul(strided), silu_and_mul_ref(strided.contiguous()))


def test_silu_and_mul_rejects_an_odd_width(device):
    with pytest.raises(InvalidParameterError) as err:
        silu_and_mul(torch.zeros(2, 7, device=device))
    assert err.value.param == "x"
