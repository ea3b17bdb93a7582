"""Tokenizers load from both checkpoint formats and render chat prompts to flat token ids."""

import json
import shutil

import pytest

from engine.errors import InvalidParameterError
from engine.text.tokenizer import apply_chat_template, load_tokenizer

TEXT = "Hello, world! Ünïcödé and   spaces\n\tdone."
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


def test_gguf_tokenizer_round_trips_text(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode(TEXT, add_special_tokens=False)
    assert ids and all(isinstance(i, int) for i in ids)
    assert smollm2_tokenizer.decode(ids) == TEXT


def test_gguf_chat_template_uses_im_start_framing(smollm2_tokenizer):
    ids = apply_chat_template(smollm2_tokenizer, MESSAGES)
    assert isinstance(ids, list) and all(type(i) is int for i in ids)
    text = smollm2_tokenizer.decode(ids)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    im_start = smollm2_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(im_start) == 3  # one special token each, not the text spelled out


def test_chat_template_without_generation_prompt_ends_after_last_turn(smollm2_tokenizer):
    ids = apply_chat_template(smollm2_tokenizer, MESSAGES, add_generation_prompt=False)
    assert smollm2_tokenizer.decode(ids).endswith("Hi there<|im_end|>\n")


def test_hf_directory_tokenizer_matches_the_gguf_one(tiny_llama_dir, smollm2_tokenizer):
    tokenizer = load_tokenizer(tiny_llama_dir)
    assert tokenizer.encode(TEXT) == smollm2_tokenizer.encode(TEXT)
    assert apply_chat_template(tokenizer, MESSAGES) == apply_chat_template(smollm2_tokenizer,
                                                                           MESSAGES)


@pytest.mark.slow
def test_tokenizer_without_chat_template_refuses_messages(tiny_llama_dir, tmp_path):
    directory = tmp_path / "base"
    shutil.copytree(tiny_llama_dir, directory)
    (directory / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(directory)
    assert not tokenizer.chat_template
    with pytest.raises(InvalidParameterError) as error:
        apply_chat_template(tokenizer, MESSAGES)
    assert error.value.param == "messages"
