"""The engine's public behaviour: requests in, deltas out, errors that name what was wrong."""

import pytest

from engine import (LLM, ContextLengthExceededError, InvalidParameterError, LLMEngine,
                    RequestNotFoundError, SamplingParams)
from engine.config import EngineConfig


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), num_kv_blocks=64, max_model_len=256)


@pytest.fixture(scope="module")
def smollm2_llm(smollm2_path):
    return LLM(str(smollm2_path), num_kv_blocks=256, max_model_len=1024)


def drain(engine: LLMEngine) -> dict[str, list]:
    outs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs.setdefault(o.request_id, []).append(o)
    return outs


@pytest.mark.slow
def test_generate_returns_results_in_input_order_with_text_and_finish_reason(tiny):
    prompts = [[5, 6, 7], [8] * 30, [9, 10]]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (3, 9, 5)]
    outs = tiny.generate(prompts, params)
    assert [len(o.token_ids) for o in outs] == [3, 9, 5]
    assert [o.prompt_token_ids for o in outs] == prompts
    assert all(o.finish_reason == "length" for o in outs)
    assert outs[1].text == tiny.tokenizer.decode(outs[1].token_ids, skip_special_tokens=True)


@pytest.mark.slow
def test_streamed_deltas_join_to_the_final_text_including_non_ascii(smollm2_llm):
    prompt = [{"role": "user", "content": "Write the word 'café' and the emoji 🍰 three times, "
                                          "then say 'naïve' in Japanese: ナイーブ."}]
    from engine.text.tokenizer import apply_chat_template
    ids = apply_chat_template(smollm2_llm.tokenizer, prompt)
    deltas = list(smollm2_llm.stream(ids, SamplingParams(temperature=0, max_tokens=48)))
    text = "".join(d.text_delta for d in deltas)
    token_ids = [t for d in deltas for t in d.token_ids_delta]
    assert text == smollm2_llm.tokenizer.decode(token_ids, skip_special_tokens=True)
    assert any(ord(c) > 127 for c in text), text
    assert all("\ufffd" not in d.text_delta for d in deltas)
    assert deltas[-1].finished and not any(d.finished for d in deltas[:-1])


def test_seeded_sampling_is_reproducible_whatever_shares_the_batch(tiny):
    seeded = SamplingParams(temperature=1.0, max_tokens=12, seed=1234, ignore_eos=True)
    alone = tiny.generate([[11, 12, 13]], seeded)[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    batch = tiny.generate([[40, 41], [11, 12, 13], [7] * 20], [others, seeded, others])
    assert batch[1].token_ids == alone
    different_seed = tiny.generate([[11, 12, 13]], SamplingParams(
        temperature=1.0, max_tokens=12, seed=99, ignore_eos=True))[0].token_ids
    assert different_seed != alone


def test_stop_string_ends_output_and_is_excluded(smollm2_llm):
    from engine.text.tokenizer import apply_chat_template
    ids = apply_chat_template(smollm2_llm.tokenizer, [{"role": "user", "content": "Count from 1 to 10, comma separated."}])
    full = smollm2_llm.generate(ids, SamplingParams(temperature=0, max_tokens=40))[0].text
    assert "5" in full
    stopped = smollm2_llm.generate(ids, SamplingParams(temperature=0, max_tokens=40, stop=["5"]))[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == "5"
    assert stopped.text == full[:full.index("5")]
    deltas = list(smollm2_llm.stream(ids, SamplingParams(temperature=0, max_tokens=40, stop=["5"])))
    assert all("5" not in d.text_delta for d in deltas)


def test_stop_token_ids_and_eos_end_the_request(tiny):
    free = tiny.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    target = free.token_ids[4]
    stopped = tiny.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                        stop_token_ids=[target]))[0]
    first = free.token_ids.index(target)
    assert stopped.token_ids == free.token_ids[:first + 1]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == target


# A prompt whose greedy answer has a margin: "What is the capital of France?" opens with "The"
# only 0.08 nats ahead of "L" in transformers fp32, a tie in bf16 logits on some paths.
EOS_PROMPT = "What is 2 + 2?"


def test_eos_stops_unless_ignore_eos(smollm2_llm):
    from engine.text.tokenizer import apply_chat_template
    ids = apply_chat_template(smollm2_llm.tokenizer, [{"role": "user", "content": EOS_PROMPT}])
    stops = smollm2_llm.generate(ids, SamplingParams(temperature=0, max_tokens=64))[0]
    assert stops.finish_reason == "stop" and stops.token_ids[-1] == 2
    ignores = smollm2_llm.generate(ids, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))[0]
    assert ignores.finish_reason == "length" and len(ignores.token_ids) == 64


def test_min_tokens_holds_back_eos(smollm2_llm):
    from engine.text.tokenizer import apply_chat_template
    ids = apply_chat_template(smollm2_llm.tokenizer, [{"role": "user", "content": EOS_PROMPT}])
    short = smollm2_llm.generate(ids, SamplingParams(temperature=0, max_tokens=64))[0]
    held = smollm2_llm.generate(ids, SamplingParams(temperature=0, max_tokens=64, min_tokens=len(short.token_ids) + 5))[0]
    assert len(held.token_ids) >= len(short.token_ids) + 5
    assert 2 not in held.token_ids[:len(short.token_ids) + 4]


def test_logprobs_of_chosen_and_top_tokens(tiny):
    out = tiny.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=4, logprobs=3,
                                                    ignore_eos=True))[0]
    assert len(out.logprobs) == 4
    for token, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == token
        assert len(lp.top) == 3
        assert lp.top[0][0] == token  # greedy: the chosen token is the most likely
        assert lp.logprob == pytest.approx(lp.top[0][1])
        assert lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]


def test_abort_frees_blocks_and_is_reported_once(tiny):
    engine = tiny.engine
    engine.add_request("keep", [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
    engine.add_request("drop", [4] * 40, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    engine.abort_request("drop")
    outs = drain(engine)
    assert outs["drop"][-1].finish_reason == "abort" and len(outs["drop"]) == 1
    assert outs["keep"][-1].finish_reason == "length"
    engine.block_manager.check_all_free()
    with pytest.raises(RequestNotFoundError):
        engine.abort_request("drop")


def test_request_that_can_never_fit_is_rejected_at_admission(tiny):
    with pytest.raises(ContextLengthExceededError, match="maximum context length is 256"):
        tiny.engine.add_request("long", [1] * 200, SamplingParams(max_tokens=100))
    # 64 blocks of 16 tokens = 1024 > 256, so use a tiny pool to hit the KV limit instead.
    assert tiny.engine.num_unfinished_requests == 0


@pytest.mark.slow
def test_request_larger_than_the_whole_kv_pool_is_rejected(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), num_kv_blocks=4, max_model_len=256)
    with pytest.raises(ContextLengthExceededError, match="KV cache holds 64 tokens"):
        llm.engine.add_request("big", [1] * 60, SamplingParams(max_tokens=10))


@pytest.mark.parametrize("kwargs,param", [
    (dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"), (dict(top_k=-2), "top_k"),
    (dict(max_tokens=0), "max_tokens"), (dict(min_p=1.5), "min_p"), (dict(logprobs=99), "logprobs"),
    (dict(presence_penalty=3), "presence_penalty"), (dict(stop=[1]), "stop"),
    (dict(min_tokens=9, max_tokens=3), "min_tokens"), (dict(repetition_penalty=0), "repetition_penalty"),
])
def test_bad_sampling_parameters_name_the_parameter(kwargs, param):
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(**kwargs)
    assert e.value.param == param and param in str(e.value)


def test_bad_engine_settings_and_prompts_name_the_parameter(tiny):
    with pytest.raises(InvalidParameterError) as e:
        EngineConfig(model="x", block_size=10)
    assert e.value.param == "block_size"
    with pytest.raises(InvalidParameterError) as e:
        LLM("smollm2", max_num_seq=3)
    assert e.value.param == "max_num_seq"
    with pytest.raises(InvalidParameterError) as e:
        tiny.engine.add_request("r", [1, 10**9])
    assert e.value.param == "prompt"
    with pytest.raises(InvalidParameterError) as e:
        tiny.engine.add_request("r", [])
    assert e.value.param == "prompt"
    tiny.engine.add_request("dup", [1])
    with pytest.raises(InvalidParameterError) as e:
        tiny.engine.add_request("dup", [1])
    assert e.value.param == "request_id"
    tiny.engine.abort_request("dup")
    drain(tiny.engine)


@pytest.mark.slow
def test_reset_counters_zeroes_the_totals_but_keeps_the_prefix_cache(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_kv_blocks=64, max_model_len=256))
    prompt = list(range(5, 5 + 40))  # two full blocks of 16, then a partial one
    engine.add_request("warm", prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    drain(engine)
    before = engine.stats()
    engine.reset_counters()
    zeroed = engine.stats()
    engine.add_request("again", prompt, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    again = drain(engine)["again"][-1]

    assert before.num_prompt_tokens == 40 and before.num_generation_tokens == 4
    assert before.prefix_cache_queried_tokens > 0
    assert (zeroed.num_prompt_tokens, zeroed.num_generation_tokens, zeroed.prefix_cache_queried_tokens,
            zeroed.prefix_cache_hit_tokens, zeroed.num_preemptions) == (0, 0, 0, 0, 0)
    assert again.num_cached_tokens == 32  # the cache itself survived the reset
    after = engine.stats()
    # computed prompt tokens only: the 32 served by the cache are hits, not computed
    assert (after.num_prompt_tokens, after.num_generation_tokens, after.prefix_cache_hit_tokens) == (8, 2, 32)


def test_a_tenants_prompt_is_cached_for_it_alone_and_a_shared_prefix_for_everyone(tiny):
    from engine.tenancy import Tenant

    greedy = SamplingParams(temperature=0, max_tokens=1)
    prompt = list(range(300, 341))  # two full blocks of 16 before the last one
    runs = [("a", Tenant("user:1"), 0), ("b", Tenant("user:2"), 0), ("a-again", Tenant("user:1"), 0),
            ("c", Tenant("user:3"), 16), ("d", Tenant("user:4"), 16)]
    cached = {}
    for rid, tenant, shared in runs:
        tiny.engine.add_request(rid, prompt if shared == 0 else [7] + prompt, greedy, tenant=tenant,
                                shared_prefix_len=shared)
        cached[rid] = drain(tiny.engine)[rid][-1].num_cached_tokens

    assert cached == {"a": 0, "b": 0, "a-again": 32, "c": 0, "d": 16}


@pytest.mark.parametrize("kwargs,param", [
    (dict(shared_prefix_len=4), "shared_prefix_len"), (dict(shared_prefix_len=-1), "shared_prefix_len"),
    (dict(shared_prefix_len=1.0), "shared_prefix_len"), (dict(tenant="user:1"), "tenant"),
])
def test_a_bad_tenancy_names_its_parameter_and_stores_nothing(tiny, kwargs, param):
    with pytest.raises(InvalidParameterError) as e:
        tiny.engine.add_request("bad-tenancy", [1, 2, 3], **kwargs)
    assert e.value.param == param
    assert not tiny.engine.has_request("bad-tenancy")
