"""A model's tokenizer and chat template in the web process, without torch or transformers.

Reads the two files ``python -m engine.cli.tokenizer_export`` writes (see
registry.services.modelversion_prepare_tokenizer): ``tokenizer.json`` for the ``tokenizers``
library (Rust) and ``tokenizer_config.json`` for the chat template, which is rendered the way
transformers renders it (jinja2's ImmutableSandboxedEnvironment with trim_blocks/lstrip_blocks,
loop controls, ``raise_exception``, a non-escaping ``tojson`` and ``strftime_now``) and then
encoded without adding special tokens, so the ids equal engine.text.tokenizer.apply_chat_template's.
"""

from __future__ import annotations

import copy
import functools
import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer


class ChatTemplateError(ValueError):
    """The conversation cannot be rendered: no template, or the template refused it."""


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # jinja's own tojson escapes HTML characters, which would change the prompt.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


class ModelTokenizer:
    def __init__(self, tokenizer: Tokenizer, config: dict):
        self.tokenizer = tokenizer
        self.chat_template: str | None = config.get("chat_template") or None
        self.special_tokens = {key: config.get(key) for key in ("bos_token", "eos_token", "pad_token", "unk_token")
                               if config.get(key) is not None}
        self.eos_token_ids: list[int] = list(config.get("eos_token_ids") or [])
        self.max_model_len: int | None = config.get("max_model_len")
        self.chat_stop_token_ids: list[int] = []  # a staff-set template's turn end (chat_templates.py)
        # An embedding model's EncoderConfig.describe() (dimensions, pooling, ...); None: generation.
        self.embedding: dict | None = config.get("embedding")

    @functools.cached_property
    def vocab_size(self) -> int:
        """Token ids below this are the model's (added tokens included). Kept: tokenizers builds the
        whole vocabulary to count it, 3 ms with the GIL held for Gemma 3's 262,144 tokens."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_dir(cls, directory: str | Path) -> ModelTokenizer:
        directory = Path(directory)
        config = json.loads((directory / "tokenizer_config.json").read_text())
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        tokenizer.no_truncation()  # a too long input is refused by name, never cut short
        tokenizer.no_padding()
        return cls(tokenizer, config)

    def with_chat_template(self, template: str, stop_tokens: tuple[str, ...] = ()) -> ModelTokenizer:
        """This tokenizer rendering chats with ``template`` and stopping them at ``stop_tokens``
        (KeyError naming a token the vocabulary lacks); the same tokenizer underneath."""
        other = copy.copy(self)
        other.chat_template = template
        other.chat_stop_token_ids = []
        for token in stop_tokens:
            token_id = self.tokenizer.token_to_id(token)
            if token_id is None:
                raise KeyError(f"the model's vocabulary has no {token!r} token to end a turn")
            other.chat_stop_token_ids.append(token_id)
        return other

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """A plain prompt's ids, special tokens added as the engine adds them to a text prompt."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode_token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def render_chat(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise ChatTemplateError(
                "this model has no chat template: use /v1/completions with a prompt, or ask staff to "
                "set one for this model version in the console (Models, Chat template: a preset such "
                "as ChatML, Gemma or Llama 3, or a custom jinja template)")
        try:
            return _compile(self.chat_template).render(
                messages=messages, add_generation_prompt=add_generation_prompt, tools=None,
                documents=None, **self.special_tokens)
        except jinja2.exceptions.TemplateError as exc:  # e.g. the template's raise_exception
            raise ChatTemplateError(str(exc)) from exc

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True) -> list[int]:
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt)
        # The template already wrote every special token it wants (as transformers does).
        return self.encode(text, add_special_tokens=False)


@functools.lru_cache(maxsize=16)
def load_tokenizer(directory: str) -> ModelTokenizer:
    """One ModelTokenizer per exported directory, per process (a version's directory never changes)."""
    return ModelTokenizer.from_dir(directory)
