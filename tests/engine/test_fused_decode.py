"""The CPU's fused decode step (engine/models/fused_decode.py, engine/kernels/cpu/decode_step.c)
against the torch path it replaces, on tiny random int4 checkpoints: the same hidden states
within the rounding the two paths do differently, and bit for bit the same whatever shares the
batch, however many threads run it and wherever a sequence's blocks lie in the pool."""

from types import SimpleNamespace

import pytest
import torch

from engine import LLM, SamplingParams
from engine.scheduling.input_batch import build_input_batch
from engine.scheduling.scheduler import ScheduledSequence
from engine.kernels.cpu import decode_step

pytestmark = pytest.mark.skipif(decode_step.library() is None,
                                reason="no C compiler or no AVX2/FMA/F16C here")

BLOCK = 16


def _runner(path, dtype="float32", **kw):
    llm = LLM(str(path), quantization="int4", dtype=dtype, num_kv_blocks=64, max_model_len=256,
              block_size=BLOCK, **kw)
    return llm.engine.runner


def _entry(tokens, table, start, count):
    seq = SimpleNamespace(token_ids=tokens, block_table=table, num_tokens=len(tokens))
    return ScheduledSequence(seq, num_new_tokens=count, start=start)


def _sequences(seed=0, lengths=(5, 37, 70), blocks=None):
    """Random prompts, each with blocks drawn from the pool in a scattered order."""
    g = torch.Generator().manual_seed(seed)
    order = blocks if blocks is not None else torch.randperm(64, generator=g).tolist()
    seqs, used = [], 0
    for n in lengths:
        need = -(-n // BLOCK)
        seqs.append((torch.randint(3, 1000, (n,), generator=g).tolist(), order[used:used + need]))
        used += need
    return seqs


@torch.inference_mode()
def _prefill(runner, seqs):
    """Every token but the last through the torch path (it writes their K/V)."""
    entries = [_entry(t, b, 0, len(t) - 1) for t, b in seqs if len(t) > 1]
    batch = build_input_batch(entries, BLOCK, runner.device, False)
    batch.meta.workspace = runner.workspace
    runner.model(batch.input_ids, batch.positions, runner.kv_caches, batch.meta)


@torch.inference_mode()
def _decode(runner, seqs, fused=True):
    """The last token of each sequence, one decode step: hidden states [B, hidden]."""
    entries = [_entry(t, b, len(t) - 1, 1) for t, b in seqs]
    batch = build_input_batch(entries, BLOCK, runner.device, False, fused_decode=fused)
    batch.meta.workspace = runner.workspace
    if fused:
        return runner.fused_decode.run(batch.input_ids, batch.positions, batch.meta.slot_mapping,
                                       batch.meta)
    return runner.model(batch.input_ids, batch.positions, runner.kv_caches, batch.meta)


def _rows_by_length(seqs, hidden):
    """build_input_batch orders decodes by context length; map back to seqs' order."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))
    out = torch.empty_like(hidden)
    out[order] = hidden
    return out


@pytest.mark.slow
@pytest.mark.parametrize("dtype,tolerance", [("float32", 1e-5), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("checkpoint", ["tiny_llama_dir", "tiny_qwen2_dir", "tiny_llama_d64_dir",
                                        "tiny_qwen3_dir"])
def test_fused_step_gives_the_torch_paths_hidden_states(checkpoint, dtype, tolerance, request):
    """GQA (4 query heads on 2 KV heads), Qwen2's Q/K/V bias, Qwen3's Q/K norms, several sequences
    of different lengths in scattered blocks; float32 and bf16 activations and caches; heads of 16
    and of 64 dimensions (where the CPU has AVX512-BF16, a bf16 cache's attention takes bf16
    products). Gemma 3's layers: the engine-level test below."""
    runner = _runner(request.getfixturevalue(checkpoint), dtype)
    assert runner.fused_decode is not None
    seqs = _sequences()
    _prefill(runner, seqs)
    reference = _decode(runner, seqs, fused=False).float()
    got = _decode(runner, seqs).float()
    assert got.shape == reference.shape == (3, runner.model_config.hidden_size)
    assert got.dtype == reference.dtype
    for row in range(3):
        error = (got[row] - reference[row]).norm() / reference[row].norm()
        assert error < tolerance, f"row {row}: relative error {error:.2e}"


@pytest.mark.slow
def test_fused_step_writes_the_tokens_kv_where_the_torch_path_does(tiny_llama_dir):
    runner = _runner(tiny_llama_dir)
    seqs = _sequences(lengths=(20,))
    _prefill(runner, seqs)
    pool = runner.kv_pool
    slot = seqs[0][1][19 // BLOCK] * BLOCK + 19 % BLOCK
    flat = pool.view(2, pool.shape[1], -1, *pool.shape[-2:])  # [2, layers, slots, KVH, D]
    before = flat.clone()
    _decode(runner, seqs, fused=False)
    torch_kv = flat[:, :, slot].clone()
    flat[:, :, slot] = 0
    _decode(runner, seqs)
    others = torch.ones(flat.shape[2], dtype=torch.bool)
    others[slot] = False
    assert torch.equal(flat[:, :, others], before[:, :, others])  # nothing else touched
    assert torch.allclose(flat[:, :, slot], torch_kv, rtol=1e-3, atol=1e-4)


# 20 rows: from 16 the kernels deal work out to whichever thread is free (DYNAMIC_ROWS, pagoda_kernels.h)
MANY = (5, 9, 40, 12, 33, 7, 2, 25, 18, 30, 3, 44, 11, 20, 6, 15, 28, 9, 4, 35)


@pytest.mark.slow
@pytest.mark.parametrize("lengths", [(5, 37, 70, 18), MANY], ids=["4 rows", "20 rows"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("checkpoint", ["tiny_llama_dir", "tiny_llama_d64_dir"])
def test_a_sequences_fused_step_does_not_depend_on_its_batch_threads_or_blocks(checkpoint, dtype,
                                                                               lengths, request):
    runner = _runner(request.getfixturevalue(checkpoint), dtype)
    seqs = _sequences(lengths=lengths)
    _prefill(runner, seqs)
    together = _rows_by_length(seqs, _decode(runner, seqs))
    for i, s in enumerate(seqs):
        assert torch.equal(_decode(runner, [s])[0], together[i]), f"sequence {i} alone"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread = _rows_by_length(seqs, _decode(runner, seqs))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one_thread, together)
    # the same K/V in other blocks of the pool: the same bits
    tokens, blocks = seqs[2]
    used = {b for _, bs in seqs for b in bs}
    moved = [b for b in range(63, -1, -1) if b not in used][:len(blocks)]  # descending: not a run
    pool = runner.kv_pool
    pool[:, :, moved] = pool[:, :, blocks]
    assert torch.equal(_decode(runner, [(tokens, moved)])[0], together[2])


@pytest.mark.slow
def test_greedy_tokens_are_the_same_alone_and_beside_arriving_prefills(tiny_llama_dir):
    """Through the engine: a decode step that shares its step with another request's prefill
    (the prefill rows take the torch path, the decode rows the fused one) changes nothing."""
    llm = LLM(str(tiny_llama_dir), quantization="int4", num_kv_blocks=64, max_model_len=256)
    assert llm.engine.runner.fused_decode is not None
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = llm.generate([[11, 12, 13, 14]], params)[0].token_ids
    engine = llm.engine
    engine.add_request("a", [11, 12, 13, 14], params)
    outs: dict[str, list[int]] = {}
    for step in range(40):
        if step in (3, 7):
            engine.add_request(f"late{step}", list(range(20, 60 + step)), params)
        for o in engine.step():
            outs.setdefault(o.request_id, []).extend(o.token_ids_delta)
        if not engine.has_unfinished_requests():
            break
    assert outs["a"] == alone


@pytest.mark.slow
def test_the_fused_step_stays_off_where_it_does_not_apply(tiny_llama_dir, monkeypatch):
    assert _runner(tiny_llama_dir, kv_cache_dtype="int8").fused_decode is None  # 8-bit cache
    float_llm = LLM(str(tiny_llama_dir), quantization="none", num_kv_blocks=64, max_model_len=256)
    assert float_llm.engine.runner.fused_decode is None  # float projections
    monkeypatch.setenv("PAGODA_FUSED_DECODE", "0")
    assert _runner(tiny_llama_dir).fused_decode is None


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("checkpoint", ["tiny_llama_dir", "tiny_llama_d64_dir"])
def test_a_prompt_chunks_rows_are_each_the_bits_of_that_token_decoded_alone(checkpoint, dtype, request):
    """The batch-invariant prefill: a chunk's rows run together (pg_attend_rows prepares each
    block's K/V once for up to PG_ROW_GROUP of them, rows of other sequences beside) give each row
    the hidden state that token gets as a lone decode step over the same cache. With heads of 64
    and a bf16 cache on an AVX512-BF16 CPU, both sides take the bf16 products: K transposed and V
    paired once for the rows, read in place for the lone decode."""
    runner = _runner(request.getfixturevalue(checkpoint), dtype)
    seqs = _sequences(lengths=(70, 9, 37))
    entries = [_entry(t, b, 0, len(t)) for t, b in seqs] + [_entry(seqs[1][0], seqs[1][1], 8, 1)]
    entries[1] = _entry(seqs[1][0], seqs[1][1], 0, 8)  # and a decode row after the chunks
    with torch.inference_mode():
        batch = build_input_batch(entries, BLOCK, runner.device, False, fused_decode=True, fused_prefill=True)
        together = runner.fused_decode.run(batch.input_ids, batch.positions, batch.meta.slot_mapping, batch.meta)
    rows = [(s, p) for s, e in zip((0, 1, 2, 1), entries) for p in range(e.start, e.start + e.num_new_tokens)]
    batch_rows = dict(zip(((s, p) for s, p in rows), together))
    for (s, p), hidden in batch_rows.items():
        tokens, blocks = seqs[s]
        alone = _decode(runner, [(tokens[:p + 1], blocks)])[0]
        assert torch.equal(alone, hidden), f"sequence {s}, position {p}"


@pytest.mark.slow
def test_a_bf16_models_attention_takes_bf16_products_where_the_cpu_has_them(tiny_llama_d64_dir):
    """AVX512-BF16, a bf16 model and pool, heads of 64: attention's products in bf16 (q and p
    rounded, float32 sums). They change the bits (the switch is on) and stay within bf16's rounding
    of the float32 products; a float32 model keeps float32 products."""
    assert _runner(tiny_llama_d64_dir, "float32").fused_decode.attention_arithmetic() == "float32 products"
    runner = _runner(tiny_llama_d64_dir, "bfloat16")
    fused = runner.fused_decode
    if not fused.lib.pagoda_attention_bf16_products():
        assert fused.attention_arithmetic() == "float32 products"
        pytest.skip("no AVX512-BF16 on this CPU: float32 products only")
    assert fused.attention_arithmetic() == "bf16 products"
    seqs = _sequences(lengths=(5, 37, 70, 150))
    _prefill(runner, seqs)
    bf16 = _decode(runner, seqs).float()
    fused.shape.bf16_products = 0
    try:
        f32 = _decode(runner, seqs).float()
    finally:
        fused.shape.bf16_products = 1
    assert not torch.equal(bf16, f32)
    for row in range(len(seqs)):
        error = (bf16[row] - f32[row]).norm() / f32[row].norm()
        assert error < 2e-2, f"row {row}: relative error {error:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gemma3_layers_fused_give_the_torch_paths_tokens(tiny_gemma3_d64_dir, dtype, monkeypatch):
    """Gemma 3's layer in the fused step (its norms around each sublayer, GeGLU, Q/K norms, a RoPE
    table per layer, 24-token windows over the window layers' own pool, scaled embeddings): every
    row of every step fused (batch-invariant mode, prompts included), the same greedy tokens as
    the torch path, prompts and answers running past the window. (Qwen3's tiny model meets a
    near-tie within 40 tokens, where the two paths' rounding may pick either: its hidden states
    are compared above.)"""
    path = tiny_gemma3_d64_dir
    prompts = [[1 + (i * 37 + j * 11) % 4000 for j in range(n)] for i, n in enumerate((3, 17, 40, 9, 31))]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    # 5 seats (the prompts): their windows leave the rest of 64 blocks to long contexts
    llm = LLM(str(path), quantization="int4", dtype=dtype, num_kv_blocks=64, max_model_len=256, max_num_seqs=5)
    runner = llm.engine.runner
    assert runner.fused_decode is not None and runner.batch_invariant
    assert runner.window_split is not None  # the sliding layers' blocks: a pool of their own
    assert [layer.window for layer in runner.fused_decode.layers] == [24, 0, 24]
    fused = [o.token_ids for o in llm.generate(prompts, params)]
    llm.engine.block_manager.check_all_free()
    monkeypatch.setenv("PAGODA_FUSED_DECODE", "0")
    torch_path = LLM(str(path), quantization="int4", dtype=dtype, num_kv_blocks=64, max_model_len=256,
                     max_num_seqs=5)
    assert torch_path.engine.runner.fused_decode is None
    assert fused == [o.token_ids for o in torch_path.generate(prompts, params)]


def test_a_batch_names_its_last_position_for_the_rotary_bound_without_a_tensor_reduction():
    seqs = _sequences(lengths=(5, 37, 70))
    entries = [_entry(seqs[0][0], seqs[0][1], 4, 1), _entry(seqs[2][0], seqs[2][1], 0, 70),
               _entry(seqs[1][0], seqs[1][1], 36, 1)]
    for fused in (False, True):
        batch = build_input_batch(entries, BLOCK, torch.device("cpu"), False, fused_decode=fused)
        assert batch.last_position == int(batch.positions.max()) == 69
    assert build_input_batch([], BLOCK, torch.device("cpu"), False).last_position == -1
