"""A tiny random decoder embedding checkpoint, Qwen3-Embedding style: a transformers Qwen3 (or
Llama) decoder folder with a small tokenizer (tests/engine/tiny_bert.py's WordPiece vocabulary,
which spells any lowercase ASCII text: the SmolLM2 one's 49,152 entries cost seconds a test), plus sentence-transformers' modules.json,
1_Pooling/config.json (last-token pooling by default) and, optionally, 2_Normalize."""

from __future__ import annotations

import json
from pathlib import Path

from tests.engine.tiny_bert import tiny_vocab

SIZES = dict(vocab_size=len(tiny_vocab()), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
             tie_word_embeddings=True, bos_token_id=2, eos_token_id=3, pad_token_id=0, initializer_range=0.3)

# family -> transformers' config and model classes, and what the family adds to SIZES (Gemma 3: a
# sliding window shorter than the longer test inputs, so the windowed mask is exercised).
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"sliding_window": 8, "query_pre_attn_scalar": 16,
                                                          "layer_types": ["sliding_attention", "full_attention"]}),
}


def write_pooling_config(directory: Path, *, pooling: str = "lasttoken", normalize: bool = True,
                         hidden_size: int = SIZES["hidden_size"]) -> None:
    """sentence-transformers' files around a transformers folder (as SentenceTransformer.save
    writes them for Qwen3-Embedding: legacy pooling_mode_* keys)."""
    directory = Path(directory)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (directory / "2_Normalize").mkdir(exist_ok=True)
    (directory / "modules.json").write_text(json.dumps(modules, indent=2))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    modes = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
             "max": "pooling_mode_max_tokens", "lasttoken": "pooling_mode_lasttoken"}
    pooling_config = {"word_embedding_dimension": hidden_size, **{key: mode == pooling for mode, key in modes.items()},
                      "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
                      "include_prompt": True}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 96,
                                                                     "do_lower_case": False}))


def save_tiny_decoder(directory: Path, *, family: str = "qwen3", seed: int = 0) -> Path:
    """A plain random decoder checkpoint (a generation model) with the small tokenizer ([CLS]
first, [SEP] last: the last token of every text is the same special one, as Qwen3-Embedding's
<|endoftext|>)."""
    import torch
    import transformers as tf
    from transformers import BertTokenizerFast

    config_class, model_class, extra = FAMILIES[family]
    directory = Path(directory)
    torch.manual_seed(seed)
    getattr(tf, model_class)(getattr(tf, config_class)(**SIZES, **extra)).eval().save_pretrained(directory)
    vocab_file = directory / "vocab.txt"
    vocab_file.write_text("\n".join(tiny_vocab()) + "\n")
    BertTokenizerFast(vocab_file=str(vocab_file), do_lower_case=True).save_pretrained(directory)
    return directory


def save_tiny_decoder_embedding(directory: Path, *, family: str = "qwen3", pooling: str = "lasttoken",
                                normalize: bool = True, seed: int = 0) -> Path:
    """Write the checkpoint to ``directory`` (created) and return it."""
    directory = save_tiny_decoder(directory, family=family, seed=seed)
    write_pooling_config(directory, pooling=pooling, normalize=normalize)
    return directory
