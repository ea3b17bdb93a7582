"""Decode through CUDA graphs gives what eager decode gives; graphs are replayed without host
syncs; sampling with logprobs costs one device-to-host transfer."""

import warnings

import pytest
import torch

from engine import SamplingParams
from engine.layers.attention_metadata import AttentionMetadata
from engine.sampling.sampler import Sampler
from engine.runtime.model_runner import ModelRunner
from engine.sampling.sampling_metadata import SamplingMetadata
from engine.scheduling.scheduler import ScheduledSequence
from engine.scheduling.sequence import Sequence

pytestmark = pytest.mark.gpu

# Requests finish at different steps, so the decode batch shrinks through several padded sizes.
MAX_TOKENS = (3, 9, 14, 20, 6, 11, 17)


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_cuda_graph_decode_matches_eager_decode(model, cuda_llm, prompts_for):
    graphed = cuda_llm(model, "float32")
    eager = cuda_llm(model, "float32", enforce_eager=True)
    assert eager.engine.runner.cuda_graphs is None
    graphs = graphed.engine.runner.cuda_graphs
    assert graphs.sizes == [1, 2, 4, 8, 16]  # max_num_seqs 16
    prompts = (prompts_for(model) * 2)[:len(MAX_TOKENS)]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=2)
              for n in MAX_TOKENS]
    replays = graphs.num_replays
    with_graphs = graphed.generate(prompts, params)
    assert graphs.num_replays - replays >= max(MAX_TOKENS) - 1
    without = eager.generate(prompts, params)
    for i, (g, e) in enumerate(zip(with_graphs, without)):
        assert g.token_ids == e.token_ids, f"prompt {i}"
        # the graphs' fixed-width block tables may split attention differently: float32 rounding
        assert [lp.logprob for lp in g.logprobs] == pytest.approx(
            [lp.logprob for lp in e.logprobs], abs=1e-3)


class SyncCounter:
    """Counts CUDA operations that block the host (torch's sync debug mode, warning level)."""

    def __enter__(self):
        self._warnings = warnings.catch_warnings(record=True)
        self.records = self._warnings.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")
        self._warnings.__exit__(*exc)

    @property
    def count(self) -> int:
        return sum("synchronizing" in str(w.message) for w in self.records)


def test_graph_replay_never_blocks_the_host(cuda_llm):
    runner = cuda_llm("tiny", "float32").engine.runner
    n = 3  # padded to the graph of 4
    meta = AttentionMetadata(
        slot_mapping=torch.full((n,), -1, dtype=torch.long, device="cuda"),
        num_prefill_tokens=0, num_decode_tokens=n,
        decode_block_tables=torch.zeros((n, 2), dtype=torch.int32, device="cuda"),
        decode_context_lens=torch.zeros(n, dtype=torch.int32, device="cuda"))
    ids = torch.zeros(n, dtype=torch.long, device="cuda")
    torch.cuda.synchronize()
    with torch.inference_mode(), SyncCounter() as syncs:
        hidden = runner.cuda_graphs.run(ids, ids.clone(), meta)
    assert syncs.count == 0
    assert hidden.shape == (n, runner.model_config.hidden_size)
    assert torch.isfinite(hidden).all()


def test_sampling_with_logprobs_transfers_to_the_host_once():
    params = [SamplingParams(temperature=0, logprobs=3), SamplingParams(temperature=0.8, top_p=0.9),
              SamplingParams(temperature=0, logprobs=0)]
    entries = [ScheduledSequence(Sequence(f"r{i}", [1, 2, 3], p), 3, 0)
               for i, p in enumerate(params)]
    empty = [[] for _ in params]
    meta = SamplingMetadata.build(params, empty, empty, [None] * 3, empty, device="cuda")
    logits = torch.randn(3, 1000, device="cuda")
    torch.cuda.synchronize()
    with SyncCounter() as syncs:
        out = Sampler()(logits, meta)
        token_ids, logprobs = ModelRunner._to_host(entries, out)
    assert syncs.count == 1
    assert token_ids[0] == logits[0].argmax().item()
    assert logprobs[1] is None and logprobs[2].top == []
    expected = logits[0].log_softmax(-1).topk(3)
    assert [t for t, _ in logprobs[0].top] == expected.indices.tolist()
    assert [lp for _, lp in logprobs[0].top] == pytest.approx(expected.values.tolist(), abs=1e-6)
