"""A tiny random sentence-transformers BERT checkpoint, saved by sentence-transformers itself
(modules.json, 1_Pooling/config.json, 2_Normalize, sentence_bert_config.json) around a random
transformers BertModel and a small WordPiece vocabulary that spells any lowercase ASCII text."""

from __future__ import annotations

import string
from pathlib import Path

WORDS = ("the", "a", "cat", "dog", "sat", "on", "mat", "river", "flows", "to", "sea", "pagoda",
         "serves", "models", "embedding", "vector", "of", "and", "is", "in")
MAX_SEQ_LENGTH = 48


def tiny_vocab() -> list[str]:
    letters = list(string.ascii_lowercase + string.digits + string.punctuation)
    return (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(WORDS) + letters
            + [f"##{c}" for c in string.ascii_lowercase + string.digits])


def save_tiny_sentence_bert(directory: Path, *, pooling: str = "mean", normalize: bool = True,
                            seed: int = 0) -> Path:
    """Write the checkpoint to ``directory`` (created) and return it."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    directory = Path(directory)
    hf_dir = directory.parent / f"{directory.name}-hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    vocab_file = hf_dir / "vocab.txt"
    vocab_file.write_text("\n".join(tiny_vocab()) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab_file), do_lower_case=True)
    config = BertConfig(vocab_size=len(tiny_vocab()), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(seed)
    BertModel(config).eval().save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    transformer = models.Transformer(str(hf_dir), max_seq_length=MAX_SEQ_LENGTH)
    modules = [transformer, models.Pooling(config.hidden_size, pooling_mode=pooling)]
    if normalize:
        modules.append(models.Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(directory))
    return directory
