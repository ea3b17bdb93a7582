"""bench/draft_gguf.py cuts a draft model from the bundled SmolLM2 (its first layers): the same
metadata but the block count, the kept tensors' bytes as they were; and drafting by it leaves the
bundled model's answer unchanged, with some drafts accepted (a real model drafting for a real one)."""

import numpy as np
import pytest
from gguf import GGUFReader

from bench.draft_gguf import write_truncated
from engine import LLM, SamplingParams
from engine.kernels.cpu import decode_step

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    decode_step.library() is None, reason="no C compiler or no AVX2/FMA/F16C here: no fused step, no invariance")]


def test_a_cut_gguf_keeps_the_first_layers_as_they_were(tmp_path, smollm2_path):
    out = tmp_path / "draft.gguf"
    write_truncated(smollm2_path, 4, out)
    source, cut = GGUFReader(str(smollm2_path)), GGUFReader(str(out))
    assert int(cut.fields["llama.block_count"].parts[-1][0]) == 4
    keys = [k for k in source.fields if not k.startswith("GGUF.")]
    assert [k for k in cut.fields if not k.startswith("GGUF.")] == keys
    for key in keys:
        if key != "llama.block_count":
            assert [bytes(p) for p in cut.fields[key].parts] == [bytes(p) for p in source.fields[key].parts], key
    kept = {t.name: t for t in source.tensors if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < 4}
    assert [t.name for t in cut.tensors] == list(kept)
    for tensor in cut.tensors:
        assert tensor.tensor_type == kept[tensor.name].tensor_type
        assert np.array_equal(np.asarray(tensor.data), np.asarray(kept[tensor.name].data)), tensor.name


def test_the_bundled_model_drafted_by_its_first_layers_answers_as_alone(tmp_path, smollm2_path):
    draft = tmp_path / "draft.gguf"
    write_truncated(smollm2_path, 24, draft)  # of 30: with 16 or fewer, no draft was accepted
    messages = [{"role": "user", "content": "List the days of the week."}]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    plain = LLM(str(smollm2_path), num_kv_blocks=128, speculative_tokens=0).chat(messages, params)[0]
    llm = LLM(str(smollm2_path), num_kv_blocks=128, speculative_tokens=4, speculative_model=str(draft))
    out = llm.chat(messages, params)[0]
    assert out.token_ids == plain.token_ids
    spec = llm.engine.scheduler.speculator
    assert spec.num_accepted_tokens > 0
    llm.engine.block_manager.check_all_free()
