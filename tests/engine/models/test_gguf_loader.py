"""GGUF checkpoints read back exactly as transformers' own GGUF loader reads them."""

import gguf
import numpy as np
import pytest
import torch
from transformers import (AutoModelForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig,
                          LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from engine.errors import ModelLoadError
from engine.models.gguf_loader import unpermute_qk
from engine.models.loader import iter_weights, load_model_config


@pytest.mark.slow
def test_smollm2_config_comes_from_gguf_metadata(smollm2_path, smollm2_tokenizer):
    config = load_model_config(smollm2_path)
    assert config.architecture == "llama"
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (30, 576, 1536)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (9, 3, 64)
    assert config.vocab_size == 49152
    assert config.rope_theta == 100000.0
    assert config.rope_scaling is None
    assert config.rms_norm_eps == 1e-5
    assert config.max_position_embeddings == 8192
    assert config.tie_word_embeddings is True
    assert config.attention_bias is False
    assert smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>") in config.eos_token_ids
    assert config.bos_token_id == smollm2_tokenizer.convert_tokens_to_ids("<|im_start|>")


@pytest.mark.slow
def test_smollm2_weights_equal_transformers_gguf_load(smollm2_path, hf_smollm2):
    # Equality of q_proj/k_proj proves the llama.cpp row permutation is undone.
    reference = hf_smollm2.state_dict()
    reference.pop("lm_head.weight")  # tied to the embedding
    source = iter_weights(smollm2_path, load_model_config(smollm2_path))
    assert len(source) == len(reference)
    names = []
    for name, tensor in source:
        names.append(name)
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, reference[name]), name
    assert sorted(names) == sorted(reference)


def test_unpermute_inverts_llama_cpp_permute_for_weights_and_biases():
    def llama_cpp_permute(weights, n_head, n_head_kv):
        # convert_hf_to_gguf.py LlamaModel.permute
        if n_head_kv is not None and n_head != n_head_kv:
            n_head = n_head_kv
        return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
                .swapaxes(1, 2).reshape(weights.shape))

    k_weight = torch.randn(2 * 16, 64)  # 2 kv heads of head_dim 16
    q_bias = torch.randn(4 * 16)
    assert torch.equal(unpermute_qk(llama_cpp_permute(k_weight, 4, 2), 2), k_weight)
    assert torch.equal(unpermute_qk(llama_cpp_permute(q_bias, 4, 4), 4), q_bias)
    assert not torch.equal(llama_cpp_permute(k_weight, 4, 2), k_weight)


SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             tie_word_embeddings=False, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


GEMMA3_LAYER_NAMES = {
    **GGUF_LAYER_NAMES, "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
}


def write_gguf(path, arch, model, permute_qk, extra=None, layer_names=GGUF_LAYER_NAMES):
    """A float32 GGUF written the way llama.cpp's convert_hf_to_gguf.py writes it (Gemma's norm
    weights plus one); extra(writer) adds more (metadata, tensors) before it is written."""
    config = model.config
    writer = gguf.GGUFWriter(path, arch)
    if extra is not None:
        extra(writer)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    rope = config.rope_parameters  # Gemma 3: per layer type; the GGUF's base is the global one
    writer.add_rope_freq_base(rope.get("full_attention", rope)["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_eot_token_id(5)
    heads = config.num_attention_heads
    for name, tensor in model.state_dict().items():
        array = tensor.numpy()
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        elif name == "lm_head.weight":
            if config.tie_word_embeddings:
                continue  # llama.cpp writes no output.weight for a tied head
            gguf_name = "output.weight"
        else:
            _, _, layer, *module, kind = name.split(".")
            module = ".".join(module)
            gguf_name = f"blk.{layer}.{layer_names[module]}.{kind}"
            if permute_qk and module in ("self_attn.q_proj", "self_attn.k_proj"):
                n_head = heads if module == "self_attn.q_proj" else config.num_key_value_heads
                array = (array.reshape(n_head, 2, array.shape[0] // n_head // 2, *array.shape[1:])
                         .swapaxes(1, 2).reshape(array.shape))
        if arch == "gemma3" and name.endswith("norm.weight"):
            array = array + 1
        writer.add_tensor(gguf_name, np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("arch, model_class, config_class, permute_qk", [
    ("llama", LlamaForCausalLM, LlamaConfig, True),
    ("qwen2", Qwen2ForCausalLM, Qwen2Config, False),  # NEOX rope: llama.cpp does not permute
])
def test_written_gguf_weights_equal_transformers_gguf_load(
        tmp_path, arch, model_class, config_class, permute_qk):
    torch.manual_seed(0)
    path = tmp_path / f"tiny-{arch}.gguf"
    write_gguf(path, arch, model_class(config_class(**SMALL)).eval(), permute_qk)

    config = load_model_config(path)
    assert config.architecture == arch
    assert config.attention_bias is (arch == "qwen2")
    assert config.tie_word_embeddings is False
    assert config.eos_token_ids == [2, 5]
    reference = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32).state_dict()
    seen = dict(iter_weights(path, config))
    assert sorted(seen) == sorted(reference)
    for name, tensor in seen.items():
        assert torch.equal(tensor, reference[name]), name


def test_written_gemma3_gguf_reads_as_transformers_reads_it(tmp_path):
    """Gemma's own tensor names, its norms stored plus one, no Q/K permutation, the layer pattern
    and local RoPE base that llama.cpp fixes rather than stores."""
    torch.manual_seed(0)
    path = tmp_path / "tiny-gemma3.gguf"
    sizes = {**SMALL, "num_hidden_layers": 7, "head_dim": 16, "tie_word_embeddings": True}
    model = Gemma3ForCausalLM(Gemma3TextConfig(**sizes, sliding_window=32)).eval()
    for name, param in model.named_parameters():  # norms away from their zero initialisation
        if name.endswith("norm.weight"):
            param.data.normal_()

    def extra(writer):
        writer.add_key_length(16)
        writer.add_value_length(16)
        writer.add_sliding_window(32)
    write_gguf(path, "gemma3", model, False, extra=extra, layer_names=GEMMA3_LAYER_NAMES)

    config = load_model_config(path)
    assert config.architecture == "gemma3" and config.qk_norm and config.tie_word_embeddings
    assert config.layer_sliding_windows == [32] * 5 + [None, 32]
    assert (config.local_rope_theta, config.query_pre_attn_scalar) == (10_000.0, 16)
    reference = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32).state_dict()
    reference.pop("lm_head.weight")  # tied
    seen = dict(iter_weights(path, config))
    assert sorted(seen) == sorted(reference)
    for name, tensor in seen.items():
        assert torch.equal(tensor, reference[name]), name


# qwen3: a family we run from safetensors only (its GGUF tensor names are not mapped yet)
@pytest.mark.parametrize("arch", ["phi2", "qwen3"])
def test_unsupported_gguf_architecture_is_refused_by_name(tmp_path, arch):
    path = tmp_path / f"{arch}.gguf"
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=rf"'{arch}'.*supported: gemma3, llama, mistral, qwen2$"):
        load_model_config(path)
