"""The prefix-cache probe of issue #31, run against the real server: user B guesses a word of user A's
prompt and reads ``usage.prompt_tokens_details.cached_tokens``. With the cache scoped to the key's
owner B reads the same for a right and a wrong guess, and nothing of A's; A's repeat still hits its own
cache, and a system prompt staff marked as shared hits for everyone."""

import openai
import pytest

from engine.text.tokenizer import apply_chat_template

pytestmark = pytest.mark.e2e

BLOCK = 16  # the engine's default block size, which the site serves "tiny" with
# The private word comes first in the user's message, so B's guesses share no block with each other
# beyond the chat template's own opening (which every B request shares with B's own warm-up).
RECORD = "{pin} is the PIN of Jane Roe's account at the harbour bank, and her diagnosis is kept on file."
HOUSE_STYLE = ("You are the support assistant of the harbour bank. Answer in two sentences, politely, and never "
               "ask for a PIN, a password or an account number; point to the branch for anything else.")


def chat_as(site, key):
    client = openai.OpenAI(base_url=f"{site.url}/v1", api_key=key, max_retries=0, timeout=120)

    def cached_tokens(content: str, system: str | None = None) -> int:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
        response = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=1)
        return response.usage.prompt_tokens_details.cached_tokens

    return cached_tokens


@pytest.fixture(scope="module")
def users(embedded_site):
    """Two users with a key each (A and B, as in the issue), and a system prompt staff marked as shared."""
    embedded_site.manage("shell", "-c", (
        "from django.contrib.auth import get_user_model; from webapp.chat.models import SystemPromptPreset; "
        "[get_user_model().objects.create_user(name) for name in ('tenant-a', 'tenant-b')]; "
        f"SystemPromptPreset.objects.create(name='Harbour bank', text={HOUSE_STYLE!r}, is_prefix_shared=True)"))
    keys = [embedded_site.manage("create_api_key", "--name", name, "--user", name).strip().splitlines()[-1]
            for name in ("tenant-a", "tenant-b")]
    return [chat_as(embedded_site, key) for key in keys]


def test_another_users_guess_reads_the_same_cached_tokens_right_or_wrong(users, tiny_tokenizer):
    a, b = users
    template_opening = apply_chat_template(tiny_tokenizer, [{"role": "user", "content": "x"}])
    num_opening_blocks = template_opening.index(tiny_tokenizer.encode("x", add_special_tokens=False)[0]) // BLOCK

    a_first = a(RECORD.format(pin="4711"))
    b_warm = b("Good morning, what are your opening hours?")
    b_right = b(RECORD.format(pin="4711"))
    b_wrong = b(RECORD.format(pin="9902"))
    a_again = a(RECORD.format(pin="4711"))

    assert a_first == 0 and b_warm == 0  # A's template opening is cached, and B reads none of it
    assert b_right == b_wrong == num_opening_blocks * BLOCK  # B's own warm-up, whatever the guess
    assert a_again > b_right  # A's repeat hits its own record's blocks too


def test_a_system_prompt_staff_shared_hits_for_every_user(users, tiny_tokenizer):
    a, b = users
    system_turn = apply_chat_template(tiny_tokenizer, [{"role": "system", "content": HOUSE_STYLE}],
                                      add_generation_prompt=False)
    unshared = HOUSE_STYLE.replace("harbour bank", "river bank")

    a("Where is the nearest branch?", HOUSE_STYLE)
    a("Where is the nearest branch?", unshared)
    b_shared = b("Can I open an account online?", HOUSE_STYLE)
    b_unshared = b("Can I open an account online?", unshared)

    assert len(system_turn) >= 2 * BLOCK
    assert b_shared == len(system_turn) // BLOCK * BLOCK  # the full blocks inside the shared system prompt
    assert b_unshared == 0  # the same length of text, not marked: A's copy stays A's
