"""Every model family and RoPE scaling type, greedy token for token identical to transformers'
own model in float32 on a tiny random checkpoint: a batch of mixed prompt lengths, the same with
prefill chunked into 8-token steps, and with a KV pool so small that sequences are preempted
and recomputed. The tiny checkpoints come from transformers' own config classes."""

import pytest
import torch

from engine import LLM, SamplingParams

from tests.engine.test_hf_parity import EXACT, assert_same, hf_greedy

NUM_TOKENS = 32
# Tiny sizes with head_dim 16 (8 rotary frequencies); the vocabulary is the SmolLM2 tokenizer's.
# Weights drawn with std 0.3, not 0.02: attention scores then span several units, so the tokens
# depend on the positions (with 0.02 attention is near uniform and a wrong RoPE table went unseen).
SIZES = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=128, tie_word_embeddings=False, bos_token_id=1,
             eos_token_id=2, initializer_range=0.3)
PROMPT_LENGTHS = (3, 17, 40, 9, 31)
# A seat for each prompt: Gemma 3's window layers then keep a window for each of the 5 and the
# rest of a small pool goes to long contexts (kv_pool_sizing.window_split); with 128 seats the
# windows would take these pools whole and Gemma 3 would run on one pool of every layer.
SEATS = dict(max_num_seqs=len(PROMPT_LENGTHS))
# RoPE scaling: sequences run from below the original context (48) to past it (40 + 32 tokens).
ORIGINAL = 48
SHORT = [1.0 + i / 8 for i in range(8)]
LONG = [2.0 + i / 2 for i in range(8)]
ROPE_SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    # dynamic stretches max_position_embeddings (here 48) by its factor: a 96-token context
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "yarn-mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
                    "mscale": 2.0, "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "longrope": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                 "original_max_position_embeddings": ORIGINAL},
}


def prompts_of(lengths=PROMPT_LENGTHS):
    return [[1 + (i * 37 + j * 11) % 4000 for j in range(n)] for i, n in enumerate(lengths)]


def save_tiny(directory, model_class, config, tokenizer):
    torch.manual_seed(0)
    model_class(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def assert_matches_transformers(path, prompts=None, num_tokens=NUM_TOKENS, num_kv_blocks=10,
                               max_model_len=None):
    """Greedy tokens equal transformers' (fp32): whole batch, chunked prefill, and preemption."""
    from transformers import AutoModelForCausalLM

    prompts = prompts or prompts_of()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    reference = [hf_greedy(hf, p, num_tokens, [-1]) for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)
    llm = LLM(str(path), num_kv_blocks=64, **EXACT, **SEATS)
    assert_same(llm.generate(prompts, params), reference)
    llm.engine.block_manager.check_all_free()
    chunked = LLM(str(path), num_kv_blocks=64, max_num_batched_tokens=8, **EXACT, **SEATS)
    assert_same(chunked.generate(prompts, params), reference)
    # 10 blocks of 16 tokens: the longest request alone needs 5, all together 17
    small = LLM(str(path), num_kv_blocks=num_kv_blocks, enable_prefix_caching=False,
                max_num_batched_tokens=16, max_model_len=max_model_len, **EXACT, **SEATS)
    assert_same(small.generate(prompts, params), reference)
    assert small.engine.stats().num_preemptions > 0
    small.engine.block_manager.check_all_free()
    return llm


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(ROPE_SCALINGS))
def test_llama_rope_scaling_matches_transformers(kind, tmp_path, smollm2_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = {**SIZES, "max_position_embeddings": ORIGINAL} if kind == "dynamic" else SIZES
    config = LlamaConfig(**sizes, rope_scaling=dict(ROPE_SCALINGS[kind]))
    path = save_tiny(tmp_path, LlamaForCausalLM, config, smollm2_tokenizer)
    llm = assert_matches_transformers(path)
    assert llm.engine.model_config.rope_scaling["rope_type"] == kind.split("-")[0]
    if kind == "dynamic":
        assert llm.engine.max_model_len == 2 * ORIGINAL


@pytest.mark.slow
def test_qwen3_matches_transformers(tmp_path, smollm2_tokenizer):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = save_tiny(tmp_path, Qwen3ForCausalLM, Qwen3Config(**SIZES), smollm2_tokenizer)
    llm = assert_matches_transformers(path)
    assert llm.engine.model_config.architecture == "qwen3" and llm.engine.model_config.qk_norm


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["top2-normalised", "top3-with-a-dense-layer"])
def test_qwen3_moe_matches_transformers(variant, tmp_path, smollm2_tokenizer):
    """Top-k routing over 8 experts, batched per step; renormalised top-2 weights, or the raw
    softmax weights of 3 experts with layer 1's MLP dense (mlp_only_layers)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    moe = dict(num_experts=8, moe_intermediate_size=32)
    if variant == "top2-normalised":
        moe.update(num_experts_per_tok=2, norm_topk_prob=True)
    else:
        moe.update(num_experts_per_tok=3, norm_topk_prob=False, mlp_only_layers=[1])
    path = save_tiny(tmp_path, Qwen3MoeForCausalLM, Qwen3MoeConfig(**SIZES, **moe),
                     smollm2_tokenizer)
    llm = assert_matches_transformers(path)
    cfg = llm.engine.model_config
    assert cfg.architecture == "qwen3_moe" and cfg.num_experts == 8
    assert cfg.moe_layers == ([True, True] if variant == "top2-normalised" else [True, False])
    # every expert of layer 0 was routed some token in this batch (so each one's weights mattered)
    block = llm.engine.runner.model.model.layers[0].mlp
    prompt = torch.tensor(prompts_of()[2])
    hidden = llm.engine.runner.model.model.embed_tokens(prompt)
    assert set(block.route(hidden)[1].flatten().tolist()) == set(range(8))


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["sliding-window", "longrope"])
def test_phi3_matches_transformers(variant, tmp_path, smollm2_tokenizer):
    """Phi-3's fused qkv_proj / gate_up_proj load whole. Its longrope (the factor from
    max_position_embeddings / original_max_position_embeddings, so an attention factor of
    sqrt(1 + ln 2 / ln 80)) within the original context: past it transformers' Phi-3 recomputes
    the whole cache with the long factors (its prepare_inputs_for_generation), which a paged
    cache does not (engine/layers/rope_scaling.py)."""
    from transformers import Phi3Config, Phi3ForCausalLM

    if variant == "sliding-window":  # every layer sees the last 24 tokens: prompts run past it
        config = Phi3Config(**SIZES, sliding_window=24)
    else:
        config = Phi3Config(**{**SIZES, "max_position_embeddings": 160},
                            original_max_position_embeddings=80,
                            rope_scaling={"type": "longrope", "short_factor": SHORT,
                                          "long_factor": LONG})
    path = save_tiny(tmp_path, Phi3ForCausalLM, config, smollm2_tokenizer)
    llm = assert_matches_transformers(path)
    model = llm.engine.runner.model
    assert "model.layers.0.self_attn.qkv_proj.weight" in dict(model.named_parameters())
    if variant == "longrope":
        assert llm.engine.model_config.rope_scaling["rope_type"] == "longrope"


@pytest.fixture(scope="module")
def tiny_gemma3_dir(tmp_path_factory, smollm2_tokenizer):
    """Three layers, sliding (8 tokens) / global / sliding, each with its own RoPE base, linear
    scaling on the global one, soft-capped logits, a query_pre_attn_scalar of its own."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        **{**SIZES, "num_hidden_layers": 3, "tie_word_embeddings": True}, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        query_pre_attn_scalar=24, final_logit_softcapping=30.0)
    return save_tiny(tmp_path_factory.mktemp("tiny_gemma3"), Gemma3ForCausalLM, config,
                     smollm2_tokenizer)


@pytest.mark.slow
def test_gemma3_matches_transformers(tiny_gemma3_dir):
    from transformers import AutoModelForCausalLM

    # the small pool: 14 blocks for contexts of 80 tokens (5 blocks), split in two groups (the 5
    # seats' windows, 16 full blocks: 3 full-length sequences against one pool's 2), preempting
    llm = assert_matches_transformers(tiny_gemma3_dir, num_kv_blocks=14, max_model_len=80)
    cfg = llm.engine.model_config
    assert cfg.layer_sliding_windows == [8, None, 8]
    assert (cfg.local_rope_theta, cfg.rope_theta) == (10_000.0, 1_000_000.0)
    # A prompt whose first 32 tokens come from the prefix cache: the window reaches into them.
    prompt = prompts_of()[2][:35] + [7, 8, 9]  # the batch's 40-token prompt, another tail
    hf = AutoModelForCausalLM.from_pretrained(tiny_gemma3_dir, dtype=torch.float32).eval()
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=NUM_TOKENS,
                                                ignore_eos=True))[0]
    assert out.num_cached_tokens == 32
    assert out.token_ids == hf_greedy(hf, prompt, NUM_TOKENS, [-1])


@pytest.mark.slow
def test_gemma3_window_blocks_freed_fit_more_full_length_sequences(tiny_gemma3_dir):
    """48 one-layer blocks: one pool of every layer holds 2 sequences of 128 tokens (8 blocks
    each); with the window layers' blocks freed as decoding passes the window (8 tokens), 3
    run side by side to 128 tokens without a preemption, still transformers' tokens (3 seats: the
    window group holds their 3 windows)."""
    from transformers import AutoModelForCausalLM

    llm = LLM(str(tiny_gemma3_dir), num_kv_blocks=16, max_num_batched_tokens=16, max_num_seqs=3,
              enable_prefix_caching=False, **EXACT)
    split = llm.engine.runner.window_split
    assert (split.num_seqs, split.num_seqs_without_freeing()) == (3, 2)
    prompts = prompts_of((8, 8, 8))
    prompts = [[p + i for p in prompt] for i, prompt in enumerate(prompts)]
    params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    assert llm.engine.stats().num_preemptions == 0
    manager = llm.engine.block_manager
    assert manager.num_window_blocks == 8  # 3 x 8 blocks of tokens went through 8 window blocks
    hf = AutoModelForCausalLM.from_pretrained(tiny_gemma3_dir, dtype=torch.float32).eval()
    assert_same(outputs, [hf_greedy(hf, p, 120, [-1]) for p in prompts])
    manager.check_all_free()


@pytest.mark.slow
def test_gemma3_sliding_window_is_what_changes_long_prompts(tiny_gemma3_dir, smollm2_tokenizer,
                                                            tmp_path):
    """The window matters: with it widened past every sequence, a prompt longer than the window
    gives other tokens (so the parity above exercises the masking), a prompt within it the same."""
    import json
    import shutil

    wide = tmp_path / "wide"
    shutil.copytree(tiny_gemma3_dir, wide)
    config = json.loads((wide / "config.json").read_text())
    config["sliding_window"] = 4096
    (wide / "config.json").write_text(json.dumps(config))
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
    short, long = prompts_of((6, 40))
    windowed = LLM(str(tiny_gemma3_dir), num_kv_blocks=32, **EXACT, **SEATS).generate([short, long], params)
    full = LLM(str(wide), num_kv_blocks=32, **EXACT, **SEATS).generate([short, long], params)
    assert windowed[1].token_ids != full[1].token_ids
    assert windowed[0].token_ids[:2] == full[0].token_ids[:2]  # until the sequence passes 8


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "gemma3", "qwen3_moe"])
def test_the_fused_cpu_decode_step_takes_qwen3_and_gemma3_layers_and_declines_experts(
        family, tmp_path, request, smollm2_tokenizer):
    """With int4 weights the C decode step computes Qwen3's Q/K norms and Gemma 3's layers (its
    norms, GeGLU, two RoPE tables, 8-token windows), every row of a step (batch-invariant mode):
    the same greedy tokens as the torch path (int4 rounding moves them off transformers', so the
    torch path is the reference). A Qwen3-MoE layer's experts keep the torch path."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from engine.kernels.cpu import decode_step
    from engine.models.fused_decode import ENV

    if decode_step.library() is None:
        pytest.skip("no C compiler or no AVX2/FMA/F16C here")
    if family == "qwen3":
        path = save_tiny(tmp_path / "q3", Qwen3ForCausalLM, Qwen3Config(**SIZES), smollm2_tokenizer)
    elif family == "qwen3_moe":
        path = save_tiny(tmp_path / "moe", Qwen3MoeForCausalLM,
                         Qwen3MoeConfig(**SIZES, num_experts=8, moe_intermediate_size=32), smollm2_tokenizer)
    else:
        path = request.getfixturevalue("tiny_gemma3_dir")
    int4 = dict(quantization="int4", dtype="float32", num_kv_blocks=32, **SEATS)
    llm = LLM(str(path), **int4)
    runner = llm.engine.runner
    assert (runner.fused_decode is None) == (family == "qwen3_moe")
    assert runner.batch_invariant == (family != "qwen3_moe")
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
    fused_allowed = llm.generate(prompts_of(), params)
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as m:
        m.setenv(ENV, "0")
        torch_path = LLM(str(path), **int4).generate(prompts_of(), params)
    assert_same(fused_allowed, [o.token_ids for o in torch_path])
