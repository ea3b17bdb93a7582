"""The int4 and int8 layers on CUDA multiply through the Triton kernels, inside CUDA graphs too.

Each layer's output must be exactly the kernel's (plus the layer's bias), so the dequantizing
fallback is not what runs, and within rounding of the float32 product on the dequantized weight:
the kernels' dots take exact integer codes and accumulate in float32, then round once to the
activation dtype, and the layer adds its bias in that dtype, a second rounding: 2^-7 of the
result in bfloat16, 2^-10 in float16, plus the float32 sums' own error.
"""

import pytest
import torch

from engine.quantization.int4 import Int4WeightOnlyLinear, int4_linear_reference, unpack_codes
from engine.quantization.int8 import Int8WeightOnlyLinear, int8_linear_reference

pytestmark = pytest.mark.gpu

RELATIVE = {torch.float32: 1e-5, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}


def close_to_float32(actual, expected):
    scale = expected.float().abs().max().item()
    torch.testing.assert_close(actual.float(), expected.float(), rtol=RELATIVE[expected.dtype],
                               atol=1e-3 * scale)


def int4_layer(dtype):
    gen = torch.Generator("cuda").manual_seed(0)
    weight = torch.randn(256, 512, generator=gen, device="cuda")
    bias = torch.randn(256, generator=gen, device="cuda").to(dtype)
    return Int4WeightOnlyLinear.from_float(weight, 64, bias)


@pytest.mark.parametrize("rows", [1, 17, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_int4_layer_on_cuda_computes_through_the_kernel(dtype, rows):
    from engine.kernels.quant_matmul import int4_matmul

    layer = int4_layer(dtype)
    x = torch.randn(2, rows, 512, device="cuda").to(dtype)  # [batch, tokens, K]
    y = layer(x)
    x2 = x.reshape(-1, 512)
    kernel = int4_matmul(x2, layer.weight_packed, layer.scales_and_zeros, 64) + layer.bias
    torch.testing.assert_close(y.reshape(-1, 256), kernel, rtol=0, atol=0)
    sz = layer.scales_and_zeros
    close_to_float32(y.reshape(-1, 256), int4_linear_reference(
        x2, unpack_codes(layer.weight_packed), sz[..., 0].t(), sz[..., 1].t(), 64, layer.bias))


@pytest.mark.parametrize("rows", [1, 17, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_int8_layer_on_cuda_computes_through_the_kernel(dtype, rows):
    from engine.kernels.quant_matmul import int8_matmul

    gen = torch.Generator("cuda").manual_seed(0)
    weight = torch.randn(256, 200, generator=gen, device="cuda")
    bias = torch.randn(256, generator=gen, device="cuda").to(dtype)
    layer = Int8WeightOnlyLinear.from_float(weight, bias, dtype)
    x = torch.randn(rows, 200, device="cuda").to(dtype)
    y = layer(x)
    kernel = int8_matmul(x, layer.weight_int8, layer.scales) + layer.bias
    torch.testing.assert_close(y, kernel, rtol=0, atol=0)
    close_to_float32(y, int8_linear_reference(x, layer.weight_int8, layer.scales, layer.bias))


def test_int4_layer_replays_in_a_cuda_graph():
    layer = int4_layer(torch.bfloat16)
    x = torch.randn(4, 512, device="cuda").to(torch.bfloat16)
    expected = layer(x)  # compiles the kernel before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(x)
    x.copy_(torch.randn(4, 512, device="cuda").to(torch.bfloat16))
    graph.replay()
    torch.testing.assert_close(out, layer(x), rtol=0, atol=0)
    assert not torch.equal(out, expected)
