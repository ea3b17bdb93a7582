"""Hugging Face tokenizers for our checkpoints, and chat prompts rendered to token ids."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from engine.errors import InvalidParameterError, ModelLoadError
from engine.models.registry import checkpoint_format, resolve_model_path


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer; a GGUF one is converted from the file's metadata (~4 s on CPU)."""
    path = resolve_model_path(str(path))
    try:
        if checkpoint_format(path) == "gguf":
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            if not tokenizer.chat_template:
                tokenizer.chat_template = _gguf_chat_template(path)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load the tokenizer of {str(path)!r}: {exc}") from exc
    return tokenizer


def _gguf_chat_template(path: Path) -> str | None:
    from gguf import GGUFReader

    field = GGUFReader(path).fields.get("tokenizer.chat_template")
    return None if field is None else field.contents()


def apply_chat_template(tokenizer: PreTrainedTokenizerBase, messages: list[dict],
                        add_generation_prompt: bool = True) -> list[int]:
    """Token ids of `messages` rendered with the tokenizer's chat template."""
    if not tokenizer.chat_template:
        raise InvalidParameterError(
            "messages", "this model has no chat template; send a plain prompt instead")
    from jinja2 import TemplateError

    try:
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    except TemplateError as exc:  # the template itself rejects e.g. an unknown role
        raise InvalidParameterError("messages", str(exc)) from exc
    # transformers 5 returns a BatchEncoding; older versions a list (nested when batched).
    if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):
        if len(ids) != 1:
            raise InvalidParameterError("messages", "expected one conversation, got a batch")
        ids = ids[0]
    return [int(i) for i in ids]
