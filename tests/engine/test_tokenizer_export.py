"""The exported tokenizer files reproduce the engine's own tokenization and chat template."""

import json

import jinja2.sandbox
import pytest
from tokenizers import Tokenizer

from engine.text.tokenizer import apply_chat_template
from engine.cli.tokenizer_export import export_tokenizer


@pytest.mark.slow
def test_exported_tokenizer_and_template_match_the_engine(smollm2_path, smollm2_tokenizer, tmp_path):
    out = export_tokenizer(str(smollm2_path), tmp_path / "tok")
    meta = json.loads((out / "tokenizer_config.json").read_text())
    assert meta["eos_token"] == "<|im_end|>" and 2 in meta["eos_token_ids"]
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    messages = [{"role": "user", "content": "Héllo, naïve 🍰 world"}]
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    text = env.from_string(meta["chat_template"]).render(messages=messages, add_generation_prompt=True,
                                                        bos_token=meta["bos_token"],
                                                        eos_token=meta["eos_token"])
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids == apply_chat_template(smollm2_tokenizer, messages)
