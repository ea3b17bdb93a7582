"""Tensor parallelism on CPU (gloo, one process per rank): the same greedy tokens as one process.

The tiny Llama (4 heads, 2 KV heads) splits over 2 ranks; the bundled SmolLM2 (9 heads, 3 KV
heads) over 3. Greedy decoding in float32 compares tokens exactly: the only difference from
TP=1 is the order in which the row-parallel partial sums are added (about 1e-7 relative), far
below the gap between the two best logits of these prompts. Quantized layers shard before
packing so that each rank's int4 groups and int8 row scales are TP=1's own
(engine/layers/parallel.py): int8 tokens must be equal too. The int4 CPU kernel multiplies and
returns bfloat16, so each rank's partial o_proj / down_proj output is rounded to bf16 before
the all-reduce where TP=1 rounds the whole sum once (2**-8 relative): on this random model,
whose top logits are close, tokens may part after a few steps, so int4 is held to the same
first token and per-token logprobs within 0.05 until the tokens part.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.distributed.parallel_state import RankLostError
from engine.errors import InvalidParameterError
from engine.llm import LLM
from engine.sampling_params import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,"]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def greedy(model, prompts=PROMPTS, params=GREEDY, **settings):
    llm = LLM(str(model), dtype="float32", **settings)
    try:
        return llm.generate(prompts, params)
    finally:
        llm.engine.runner.shutdown()


def greedy_tokens(model, prompts=PROMPTS, params=GREEDY, **settings) -> list[list[int]]:
    return [o.token_ids for o in greedy(model, prompts, params, **settings)]


@pytest.mark.slow
@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_two_ranks_give_the_tokens_of_one_process(tiny_llama_dir, quantization):
    one = greedy_tokens(tiny_llama_dir, quantization=quantization)
    two = greedy_tokens(tiny_llama_dir, quantization=quantization, tensor_parallel_size=2)
    assert two == one
    assert len({tuple(t) for t in one}) == len(PROMPTS)  # the prompts' answers differ


@pytest.mark.slow
def test_two_int4_ranks_agree_with_one_process_to_bf16_rounding(tiny_llama_dir):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=1)
    one = greedy(tiny_llama_dir, params=params, quantization="int4")
    two = greedy(tiny_llama_dir, params=params, quantization="int4", tensor_parallel_size=2)
    for a, b in zip(one, two):
        assert a.token_ids[0] == b.token_ids[0]
        same = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
                    len(a.token_ids))
        for x, y in zip(a.logprobs[:same], b.logprobs[:same]):
            assert abs(x.logprob - y.logprob) < 0.05


TRITON_RUN = """
import json, sys
from engine.llm import LLM
from engine.sampling_params import SamplingParams
params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
tokens = {}
for tp, triton in ((1, False), (1, True), (2, True)):
    llm = LLM(sys.argv[1], dtype="float32", quantization="none", use_triton=triton,
              tensor_parallel_size=tp)
    tokens[f"{tp} {triton}"] = [o.token_ids for o in llm.generate(json.loads(sys.argv[2]), params)]
    llm.engine.runner.shutdown()
print(json.dumps(tokens))
"""


@pytest.mark.slow
def test_two_ranks_on_the_triton_path_give_the_tokens_of_one_process(tiny_llama_dir):
    """Under the Triton interpreter on CPU, in a fresh process: TRITON_INTERPRET must be set
    before triton is first imported, which this test process may have done already."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", TRITON_RUN, str(tiny_llama_dir),
                          json.dumps(PROMPTS[:2])], env=env, capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr[-3000:]
    tokens = json.loads(run.stdout.strip().splitlines()[-1])
    assert tokens["2 True"] == tokens["1 True"] == tokens["1 False"]


@pytest.mark.slow
def test_three_ranks_give_smollm2s_tokens_of_one_process():
    one = greedy_tokens("smollm2", PROMPTS[:2], quantization="none")
    three = greedy_tokens("smollm2", PROMPTS[:2], quantization="none", tensor_parallel_size=3)
    assert three == one


@pytest.mark.slow
def test_two_tensor_parallel_engines_serve_side_by_side_in_one_process(tiny_llama_dir):
    """A new version loads while the old one still serves: each engine has its own group."""
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    old = LLM(str(tiny_llama_dir), dtype="float32", quantization="none", tensor_parallel_size=2)
    try:
        before = [o.token_ids for o in old.generate(PROMPTS, params)]
        new = greedy_tokens(tiny_llama_dir, PROMPTS, params, quantization="none",
                            tensor_parallel_size=2)
        assert [o.token_ids for o in old.generate(PROMPTS, params)] == before == new
    finally:
        old.engine.runner.shutdown()


def test_heads_that_do_not_divide_are_refused_naming_the_numbers(tiny_llama_dir):
    with pytest.raises(InvalidParameterError) as caught:
        LLM(str(tiny_llama_dir), dtype="float32", tensor_parallel_size=3)
    assert caught.value.param == "tensor_parallel_size"
    message = str(caught.value)
    assert "num_attention_heads 4" in message and "num_key_value_heads 2" in message
    assert "intermediate_size 128" in message and "vocab_size" not in message  # 49152 = 3 x 16384


@pytest.mark.slow
def test_an_int4_group_that_fits_the_layer_but_not_a_shard_is_refused(tiny_llama_dir):
    # o_proj is [64, 64]: one group of 64 per row at TP=1, but 32 input columns per rank at TP=2.
    with pytest.raises(ValueError, match=r"o_proj: int4 with group size 64 fits the whole layer "
                                         r"\[64, 64\] but not its shard \[64, 32\]"):
        LLM(str(tiny_llama_dir), dtype="float32", quantization="int4",
            quantization_group_size=64, tensor_parallel_size=2)


@pytest.mark.slow
def test_a_killed_rank_fails_the_next_step_within_seconds_and_every_one_after(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", quantization="none", tensor_parallel_size=2)
    try:
        assert llm.generate(PROMPTS[0], GREEDY)[0].token_ids
        rank1 = llm.engine.runner.ranks.processes[0]
        rank1.kill()
        rank1.wait(10)
        started = time.monotonic()
        with pytest.raises(RankLostError, match="rank 1 exited"):
            llm.generate(PROMPTS[0], GREEDY)
        assert time.monotonic() - started < 10
        with pytest.raises(RankLostError):
            llm.engine.step()
    finally:
        llm.engine.runner.shutdown()
