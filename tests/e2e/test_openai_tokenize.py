"""/tokenize and /detokenize (vLLM's shapes), and n / chat logprobs through the official openai client,
against Daphne in embedded mode; Hugging Face's tokenizer and OpenAI's own types are the references."""

import httpx
import openai
import pytest

from engine.text.tokenizer import load_tokenizer

pytestmark = pytest.mark.e2e

STORY = [{"role": "system", "content": "You tell short stories."},
         {"role": "user", "content": "Tell me a story about a lighthouse keeper, café and 🍰."}]
TEXTS = ["The lighthouse keeper opened the door and", "naïve café ナイーブ 🍰", " leading space\nand lines\t"]


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    return load_tokenizer(tiny_llama_dir)


def call(site, path: str, body: dict, key: str = "all") -> httpx.Response:
    return httpx.post(f"{site.url}{path}", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {site.keys[key]}"} if key else {})


def assert_error(response: httpx.Response, status: int, param: str | None, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["param"], error["code"]) == (param, code)


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_a_prompt_gives_hugging_faces_ids_and_detokenize_gives_the_text_back(embedded_site, hf, text):
    body = call(embedded_site, "/tokenize", {"model": "tiny", "prompt": text}).json()

    assert set(body) == {"count", "max_model_len", "tokens"}
    assert body["tokens"] == hf(text).input_ids and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 512
    back = call(embedded_site, "/detokenize", {"model": "tiny", "tokens": body["tokens"]}).json()
    assert back == {"prompt": hf.decode(body["tokens"])} and back["prompt"].endswith(text)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_tokenize_messages_applies_the_chat_template_as_hugging_face_does(embedded_site, hf, add_generation_prompt):
    body = call(embedded_site, "/tokenize", {"model": "tiny", "messages": STORY,
                                             "add_generation_prompt": add_generation_prompt}).json()

    want = hf.apply_chat_template(STORY, add_generation_prompt=add_generation_prompt, tokenize=True)
    assert body["tokens"] == list(getattr(want, "input_ids", want))


def test_the_chat_prompt_tokenize_counts_is_the_one_chat_completions_bill(embedded_site):
    counted = call(embedded_site, "/tokenize", {"model": "tiny", "messages": STORY}).json()["count"]
    client = openai.OpenAI(base_url=f"{embedded_site.url}/v1", api_key=embedded_site.keys["all"], max_retries=0)

    response = client.chat.completions.create(model="tiny", messages=STORY, max_tokens=1)

    assert response.usage.prompt_tokens == counted


def test_refusals_are_openai_error_objects_naming_the_field(embedded_site):
    assert_error(call(embedded_site, "/tokenize", {"model": "tiny"}), 400, "prompt", "invalid_parameter")
    assert_error(call(embedded_site, "/tokenize", {"model": "tiny", "prompt": "a", "messages": STORY}), 400,
                 "prompt", "invalid_parameter")
    assert_error(call(embedded_site, "/tokenize", {"model": "tiny", "prompt": 5}), 400, "prompt", "invalid_parameter")
    assert_error(call(embedded_site, "/detokenize", {"model": "tiny", "tokens": [1, 10**9]}), 400, "tokens",
                 "invalid_parameter")
    assert_error(call(embedded_site, "/detokenize", {"model": "tiny", "tokens": "12"}), 400, "tokens",
                 "invalid_parameter")
    assert_error(call(embedded_site, "/tokenize", {"model": "nope", "prompt": "a"}), 404, "model", "model_not_found")


def test_a_key_sees_only_its_models_and_no_key_is_a_401(embedded_site):
    assert call(embedded_site, "/tokenize", {"model": "smollm2", "prompt": "a"}, key="all").status_code == 200
    assert_error(call(embedded_site, "/tokenize", {"model": "smollm2", "prompt": "a"}, key="tiny"), 404, "model",
                 "model_not_found")
    assert_error(call(embedded_site, "/detokenize", {"model": "smollm2", "tokens": [1]}, key="tiny"), 404,
                 "model", "model_not_found")
    assert call(embedded_site, "/tokenize", {"model": "tiny", "prompt": "a"}, key=None).status_code == 401


def test_the_openai_client_reads_n_streamed_choices_with_openais_logprobs(embedded_site):
    client = openai.OpenAI(base_url=f"{embedded_site.url}/v1", api_key=embedded_site.keys["all"], max_retries=0)

    full = client.chat.completions.create(model="tiny", messages=STORY, n=3, seed=5, max_tokens=6, logprobs=True,
                                          top_logprobs=2, extra_body={"ignore_eos": True})
    chunks = list(client.chat.completions.create(model="tiny", messages=STORY, n=3, seed=5, max_tokens=6,
                                                 logprobs=True, top_logprobs=2, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))

    assert [c.index for c in full.choices] == [0, 1, 2]
    assert len({c.message.content for c in full.choices}) == 3
    for choice in full.choices:
        assert [t.token for t in choice.logprobs.content] and len(choice.logprobs.content) == 6
        assert all(len(t.top_logprobs) == 2 and bytes(t.bytes).decode(errors="replace") for t in choice.logprobs.content)
    streamed = {0: "", 1: "", 2: ""}
    for chunk in chunks[:-1]:
        streamed[chunk.choices[0].index] += chunk.choices[0].delta.content or ""
    assert [streamed[i] for i in range(3)] == [c.message.content for c in full.choices]  # seeded: reproducible
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens == 18
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # the same prompt, again
