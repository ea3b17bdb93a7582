"""Branches in headless Chromium against a real Daphne serving the bundled SmolLM2: a question
edited twice shows ‹ 1/3 › … ‹ 3/3 ›, and each version's answer comes back intact as the page
moves between them. Screenshots: test-artifacts/chat-branches-*.png."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.e2e.test_chat_browser import ask, browser, manage  # noqa: F401
from tests.e2e.test_chat_reattach_browser import logged_in_page

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

USERNAME, PASSWORD = "branch-tester", "branch-tester-pw-93"
QUESTIONS = ("Name a fruit.", "Name a colour.", "Name an animal.")


@pytest.fixture(scope="module")
def chat_site(embedded_site):
    manage(embedded_site, "createsuperuser", "--noinput", "--username", USERNAME, "--email", "b@example.com",
           env={"DJANGO_SUPERUSER_PASSWORD": PASSWORD})
    return embedded_site


@pytest.fixture
def page(browser, chat_site):
    page = logged_in_page(browser, chat_site, USERNAME, PASSWORD)
    yield page
    page.context.close()


def shown(page) -> tuple[str, str, str]:
    """(the question shown, its version counter, the answer shown)."""
    question = page.locator(".message.user").first
    return (question.locator(".body").inner_text(), question.locator(".branch-count").inner_text(),
            page.locator(".message.assistant .body").last.inner_text())


def answered(page) -> str:
    """The answer, once it is stored (its footer shows its token count)."""
    expect(page.locator(".message.assistant.waiting, .message.assistant.streaming")).to_have_count(0)
    expect(page.locator(".message.assistant .meta").last).to_contain_text("tokens")
    return page.locator(".message.assistant .body").last.inner_text()


def edit_first_question(page, text: str, version: int) -> str:
    page.locator(".message.user .edit").first.click()
    page.fill(".edit-box", text)
    page.get_by_role("button", name="Save & send").click()
    expect(page.locator(".message.user .branch-count")).to_have_text(f"{version}/{version}")
    return answered(page)


def test_editing_twice_keeps_three_versions_and_each_answer_comes_back(page, chat_site, artifacts_dir):
    ask(page, QUESTIONS[0], max_tokens=12)
    answers = [answered(page)]
    for version, question in enumerate(QUESTIONS[1:], start=2):
        answers.append(edit_first_question(page, question, version))
        expect(page.locator(".message.user .body")).to_have_text(question)
    assert shown(page) == (QUESTIONS[2], "3/3", answers[2])
    page.screenshot(path=str(artifacts_dir / "chat-branches-3of3.png"))

    previous = page.get_by_role("button", name="Previous version")
    next_ = page.get_by_role("button", name="Next version")
    for index in (1, 0):
        previous.click()
        expect(page.locator(".message.user .branch-count")).to_have_text(f"{index + 1}/3")
        assert shown(page) == (QUESTIONS[index], f"{index + 1}/3", answers[index])
    page.screenshot(path=str(artifacts_dir / "chat-branches-1of3.png"))
    expect(previous).to_be_disabled()
    next_.click()
    expect(page.locator(".message.user .branch-count")).to_have_text("2/3")
    assert shown(page) == (QUESTIONS[1], "2/3", answers[1])

    # A link to a message on another branch (as a search result gives) opens the branch it is on.
    colour = page.evaluate("() => document.querySelector('.message.user').dataset.id")
    next_.click()
    expect(page.locator(".message.user .branch-count")).to_have_text("3/3")
    page.goto(page.url.split("#")[0] + "#message-" + colour)
    expect(page.locator(".message.user .branch-count")).to_have_text("2/3")
    expect(page.locator(".message.user .body")).to_have_text(QUESTIONS[1])

    # The version shown is the one a reload shows, and the one the next message continues.
    page.reload()
    expect(page.locator(".message.user .branch-count").first).to_have_text("2/3")
    ask(page, "And another?", max_tokens=12)
    expect(page.locator(".message.user .body")).to_have_text([QUESTIONS[1], "And another?"])
    expect(page.locator(".message.assistant")).to_have_count(2)
    answered(page)
    assert page.locator(".message.assistant .body").first.inner_text() == answers[1]
    page.screenshot(path=str(artifacts_dir / "chat-branches-continued.png"))


def test_the_settings_panel_sends_every_parameter_and_a_refused_one_is_pointed_at(page, chat_site, artifacts_dir):
    page.click("summary")
    for field, value in (("#top-k", "1"), ("#min-p", "0.05"), ("#presence-penalty", "0.5"),
                         ("#frequency-penalty", "0.5"), ("#repetition-penalty", "1.1"), ("#seed", "7"),
                         ("#max-tokens", "6"), ("#temperature", "0.8")):
        page.fill(field, value)
    page.fill("#stop-sequences", "###\nEND")
    page.screenshot(path=str(artifacts_dir / "chat-settings.png"))
    page.click("summary")
    page.fill("#prompt", "Say hello.")
    page.press("#prompt", "Enter")
    answered(page)
    conversation = page.url.rstrip("/").split("/")[-1]
    sampling = manage(chat_site, "shell", "-c", "from webapp.chat.models import Conversation; "
                      f"print(Conversation.objects.get(pk={conversation}).sampling)")
    # top_p untouched: smollm2's shipped chat default (webapp/chat/shipped_defaults.py), not the page's 0.95
    assert sampling.strip().splitlines()[-1] == str({"max_tokens": 6, "temperature": 0.8, "top_p": 0.9, "top_k": 1, "min_p": 0.05,
                                    "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1,
                                    "seed": 7, "stop": ["###", "END"]})

    page.reload()  # the conversation's settings come back with it
    expect(page.locator("#seed")).to_have_value("7")
    page.evaluate("document.getElementById('top-p').value = '0'")  # below what the API takes
    page.fill("#prompt", "Again.")
    page.press("#prompt", "Enter")
    expect(page.locator("#settings-error")).to_contain_text("top_p")
    expect(page.locator("#top-p")).to_be_focused()
    page.screenshot(path=str(artifacts_dir / "chat-settings-refused.png"))
