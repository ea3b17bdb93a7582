"""The CPU runner's logits buffer (ModelRunner._logits_out): the int8 LM head writes each step's
logits into one kept buffer instead of a new tensor (past glibc's mmap threshold a new one is
mapped, faulted in and zeroed every step: 14 of 47 ms of Gemma 3's head at 32 rows). The same
logits and the same tokens as without it, and nothing kept past its byte cap."""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.runtime import model_runner


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), quantization="int4", num_kv_blocks=64, max_model_len=256)
    if llm.engine.runner.model.lm_head.q8_weight is None:
        pytest.skip("no native int8 LM head here (no C compiler or no AVX2)")
    return llm


def test_a_steps_logits_are_written_into_one_kept_buffer(llm):
    runner = llm.engine.runner
    vocab = runner.model_config.vocab_size
    out = runner._logits_out(3)
    assert out.shape == (3, vocab) and out.dtype == torch.float32 and out.is_contiguous()
    assert runner._logits_out(2).data_ptr() == out.data_ptr()  # fewer rows: the same memory
    hidden = torch.randn(3, runner.model_config.hidden_size).to(runner.dtype)
    with torch.inference_mode():
        fresh = runner.model.compute_logits(hidden)
        into = runner.model.compute_logits(hidden, out=out)
    assert into.data_ptr() == out.data_ptr() and torch.equal(into, fresh)
    too_many = model_runner.LOGITS_BUFFER_BYTES // (4 * vocab) + 1
    assert runner._logits_out(too_many) is None  # past the cap: a tensor of the step's own


@pytest.mark.slow
def test_greedy_and_sampled_tokens_are_the_same_with_and_without_the_buffer(llm, monkeypatch):
    prompts = [[11, 12, 13, 14], list(range(20, 57)), [5, 6]]
    params = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.8, seed=7, max_tokens=16, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)]
    with_buffer = [o.token_ids for o in llm.generate(prompts, params)]
    assert llm.engine.runner._logits is not None  # the steps used it
    monkeypatch.setattr(type(llm.engine.runner), "_logits_out", lambda self, rows: None)
    assert [o.token_ids for o in llm.generate(prompts, params)] == with_buffer


def test_the_kernel_refuses_an_out_tensor_of_another_shape_or_dtype(llm):
    from engine.kernels.cpu import qmatmul

    head = llm.engine.runner.model.lm_head
    x = torch.randn(2, llm.engine.runner.model_config.hidden_size)
    vocab = head.q8_weight.shape[0] * head.q8_weight.shape[3]
    for bad in (torch.empty(3, vocab), torch.empty(2, vocab, dtype=torch.bfloat16), torch.empty(vocab, 2).t()):
        with pytest.raises(ValueError, match="out must be"):
            qmatmul.int8_matmul(x, head.q8_weight, head.q8_scales, out_dtype=torch.float32, out=bad)
