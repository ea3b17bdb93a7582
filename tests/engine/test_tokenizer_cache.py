"""A GGUF's tokenizer is converted once, in a child process, and read back from its cache."""

import subprocess

import pytest

from engine.text.tokenizer import _convert_gguf_tokenizer, apply_chat_template, gguf_tokenizer_dir, load_tokenizer

TEXTS = ["Hello, world!", "  leading spaces and\ttabs\n\nnew lines", "naïve café — 東京 🙂",
         "<|im_start|>user\nhi<|im_end|>", "def f(x):\n    return x ** 2  # 1234567890"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]


@pytest.mark.slow
def test_cached_gguf_tokenizer_encodes_decodes_and_renders_chats_like_the_conversion(
        smollm2_path, tmp_path, monkeypatch):
    monkeypatch.setenv("PAGODA_CACHE", str(tmp_path))
    cached = load_tokenizer(smollm2_path)
    folders = list((tmp_path / "tokenizers").iterdir())
    assert len(folders) == 1 and (folders[0] / "tokenizer.json").is_file()  # no staging left
    converted = _convert_gguf_tokenizer(smollm2_path)
    assert len(cached) == len(converted) == 49152
    for text in TEXTS:
        ids = converted.encode(text)
        assert cached.encode(text) == ids
        assert cached.decode(ids) == converted.decode(ids)
        assert cached.decode(ids, skip_special_tokens=True) == converted.decode(ids, skip_special_tokens=True)
    assert cached.chat_template == converted.chat_template
    assert apply_chat_template(cached, CHAT) == apply_chat_template(converted, CHAT)
    assert (cached.bos_token_id, cached.eos_token_id, cached.pad_token_id) == (
        converted.bos_token_id, converted.eos_token_id, converted.pad_token_id)
    assert sorted(cached.all_special_tokens) == sorted(converted.all_special_tokens)


@pytest.mark.e2e
def test_a_cached_tokenizer_loads_without_converting_again(smollm2_path, tmp_path, monkeypatch):
    monkeypatch.setenv("PAGODA_CACHE", str(tmp_path))
    first = gguf_tokenizer_dir(smollm2_path)
    assert first is not None

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(subprocess, "run", no_conversion)
    assert gguf_tokenizer_dir(smollm2_path) == first
    assert load_tokenizer(smollm2_path).encode("Hello") == _convert_gguf_tokenizer(smollm2_path).encode("Hello")


@pytest.mark.slow
def test_an_unwritable_cache_falls_back_to_converting_in_process(smollm2_path, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("PAGODA_CACHE", str(blocker))
    assert gguf_tokenizer_dir(smollm2_path) is None
    tokenizer = load_tokenizer(smollm2_path)
    assert tokenizer.decode(tokenizer.encode("The capital of France")) == "The capital of France"
    assert tokenizer.chat_template


def test_copies_of_one_file_share_a_conversion_and_another_vocabulary_does_not(tmp_path):
    """The cache is named by the header's content, not the file's modification time: each copy of
    a GGUF (a test's, an upload's) converted again and the cache grew without bound."""
    import os
    import shutil

    from engine.text.tokenizer import cache_name
    from tests.engine.tiny_gguf import write_every_kind

    write_every_kind(tmp_path / "m.gguf")
    (tmp_path / "copy").mkdir()
    shutil.copy(tmp_path / "m.gguf", tmp_path / "copy" / "m.gguf")
    os.utime(tmp_path / "copy" / "m.gguf", ns=(1, 1))
    assert cache_name(tmp_path / "m.gguf") == cache_name(tmp_path / "copy" / "m.gguf")
    (tmp_path / "other").mkdir()
    write_every_kind(tmp_path / "other" / "m.gguf", vocab=3001)
    assert cache_name(tmp_path / "other" / "m.gguf") != cache_name(tmp_path / "m.gguf")
