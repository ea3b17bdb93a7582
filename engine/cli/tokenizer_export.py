"""Write a checkpoint's tokenizer as plain files a process without torch can load.

    python -m engine.cli.tokenizer_export MODEL OUT_DIR

OUT_DIR receives ``tokenizer.json`` (load it with the ``tokenizers`` library) and
``tokenizer_config.json`` with at least ``chat_template``, ``bos_token``,
``eos_token``, ``eos_token_ids`` (every id that ends generation) and
``max_model_len``; an embedding model's also ``embedding`` (its config's describe(): an encoder's, or a decoder's with a pooling config). MODEL is a Hugging Face directory, a .gguf file or "smollm2".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from engine.models.loader import load_model_config
from engine.models.registry import is_embedding_checkpoint, resolve_model_path
from engine.text.tokenizer import load_tokenizer


def export_tokenizer(model: str, out_dir: str | Path) -> Path:
    path = resolve_model_path(model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(path)
    tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    if is_embedding_checkpoint(path):  # an embedding model: no chat template, no generation
        from engine.embedding_engine import load_embedding_config

        encoder = load_embedding_config(path)
        meta = {"chat_template": None, "bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token,
                "pad_token": tokenizer.pad_token, "eos_token_ids": [], "add_bos_token": False,
                "max_model_len": encoder.max_seq_length, "vocab_size": encoder.vocab_size,
                "special_tokens": sorted(tokenizer.all_special_tokens), "embedding": encoder.describe()}
        (out / "tokenizer_config.json").write_text(json.dumps(meta, indent=1))
        return out
    config = load_model_config(path)
    eos_ids = sorted(set(config.eos_token_ids) | ({tokenizer.eos_token_id} - {None}))
    meta = {
        "chat_template": tokenizer.chat_template,
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "eos_token_ids": eos_ids,
        "add_bos_token": bool(getattr(tokenizer, "add_bos_token", False)),
        "max_model_len": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "special_tokens": sorted(tokenizer.all_special_tokens),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(meta, indent=1))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(export_tokenizer(argv[0], argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
