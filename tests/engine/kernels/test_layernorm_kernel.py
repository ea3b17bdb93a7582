import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from engine.errors import InvalidParameterError
from engine.kernels.layernorm import (
    fused_add_rms_norm, fused_add_rms_norm_ref, rms_norm, rms_norm_ref,
)

HIDDEN, EPS = 576, 1e-5  # SmolLM2's hidden size: not a power of two, so the tile is masked


def make_case(device, dtype, num_tokens=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, HIDDEN, generator=gen).to(dtype)
    residual = (3 * torch.randn(num_tokens, HIDDEN, generator=gen)).to(dtype)
    weight = (1 + 0.1 * torch.randn(HIDDEN, generator=gen)).to(dtype)
    return x.to(device), residual.to(device), weight.to(device)


def hf_rms_norm(weight, device):
    norm = LlamaRMSNorm(HIDDEN, eps=EPS).to(device=device, dtype=weight.dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_references_match_hf_llama_rms_norm_and_residual_add(device, dtype):
    x, residual, weight = make_case(device, dtype)
    hf = hf_rms_norm(weight, device)
    with torch.no_grad():
        torch.testing.assert_close(rms_norm_ref(x, weight, EPS), hf(x), atol=1e-6, rtol=1e-6)
        out, new_residual = fused_add_rms_norm_ref(x, residual, weight, EPS)
        hf_residual = x + residual  # a Llama decoder layer's residual add, in the model dtype
        assert torch.equal(new_residual, hf_residual)
        torch.testing.assert_close(out, hf(hf_residual), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rms_norm_kernel_matches_reference(device, assert_close, dtype):
    x, _, weight = make_case(device, dtype)
    assert_close(rms_norm(x, weight, EPS), rms_norm_ref(x, weight, EPS))


def test_rms_norm_kernel_rounds_like_hf_before_the_weight_in_half_precision(device):
    # float16 casts round to nearest in the interpreter too, so the kernel should agree with the
    # reference bit for bit; rounding once instead (normed * weight) differs in ~1/4 of values.
    x, _, weight = make_case(device, torch.float16)
    same = rms_norm(x, weight, EPS) == rms_norm_ref(x, weight, EPS)
    assert same.float().mean().item() > 0.99


def test_rms_norm_kernel_reads_rows_of_a_wider_tensor(device, assert_close):
    x, residual, weight = make_case(device, torch.float32)
    wide = torch.cat((x, residual), dim=1)[:, :HIDDEN]  # row stride 2 * HIDDEN
    assert_close(rms_norm(wide, weight, EPS), rms_norm_ref(x, weight, EPS))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_add_rms_norm_kernel_matches_reference(device, assert_close, dtype):
    x, residual, weight = make_case(device, dtype)
    x_before, residual_before = x.clone(), residual.clone()
    out, new_residual = fused_add_rms_norm(x, residual, weight, EPS)
    expected_out, expected_residual = fused_add_rms_norm_ref(x, residual, weight, EPS)
    assert_close(new_residual, expected_residual)
    assert_close(out, expected_out)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)  # not in place


def test_rms_norm_rejects_a_weight_of_the_wrong_size(device):
    x, _, weight = make_case(device, torch.float32)
    with pytest.raises(InvalidParameterError) as err:
        rms_norm(x, weight[:-1], EPS)
    assert err.value.param == "weight"
