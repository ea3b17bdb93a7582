"""A follower of an answer another web process runs (webapp/chat/follow.py) shows every numbered
frame once and in order, whatever order the snapshot and the group's frames arrive in: frames
from before the snapshot are dropped, frames after it wait for their turn, a repeated or an older
snapshot changes nothing, and the last frame ends the following; and on the owner's side, a follower
that goes silent stops counting as a listener. The cross-process path itself
is tests/e2e/test_chat_reattach_processes.py."""

from __future__ import annotations

import asyncio

import pytest

from webapp.chat.follow import Follower
from webapp.chat.generations import Generation
from webapp.chat.relay import RedisAnswerBoard

START = {"type": "start", "request_id": "chat-x", "user_message": {"id": 1}, "conversation": {"id": 7}}


def delta(text: str) -> dict:
    return {"type": "delta", "text": text}


def follower(shown: list, ended: list) -> Follower:
    entry = {"request_id": "chat-x", "owner": "specific.owner!1", "user": 3, "start_frame": START}
    board = RedisAnswerBoard("redis://127.0.0.1:1/0")  # never asked here: frames come in by hand
    return Follower(board=board, entry=entry, conversation_id=7, user_id=3, channel_name="specific.me!1",
                    emit=shown.append, on_end=ended.append)


def resume(text: str, seq: int) -> dict:
    return {"type": "chat.resume", "request_id": "chat-x", "seq": seq,
            "frame": {**START, "type": "resume", "text": text}}


def frames(first: int, *items: dict) -> dict:
    return {"type": "chat.frames", "request_id": "chat-x", "first": first, "frames": list(items)}


@pytest.mark.asyncio
async def test_frames_around_the_snapshot_are_shown_once_and_in_order():
    shown, ended = [], []
    f = follower(shown, ended)
    f.on_frames(frames(1, delta("a"), delta("b")))  # published before the snapshot was taken...
    f.on_frames(frames(3, delta("c")))  # ...and after it, yet arrived before it
    assert shown == []  # nothing is shown before the text so far
    f.on_resume(resume("ab", 2))
    f.on_frames(frames(5, delta("e")))  # ahead of frame 4: waits
    f.on_frames(frames(3, delta("c"), delta("d")))  # frame 3 again, and 4
    f.on_resume(resume("a", 1))  # an older snapshot (a second ask answered late): ignored
    f.on_frames(frames(6, {"type": "done", "message": {"content": "abcde"}}))
    f.on_frames(frames(7, delta("late")))  # nothing after the last frame
    await asyncio.sleep(0)

    assert [x["type"] for x in shown] == ["resume", "delta", "delta", "delta", "done"]
    assert shown[0]["text"] + "".join(x["text"] for x in shown[1:4]) == shown[-1]["message"]["content"]
    assert ended == [f] and f.ended


@pytest.mark.asyncio
async def test_a_fresh_snapshot_after_a_lost_frame_shows_the_whole_text_again():
    shown, ended = [], []
    f = follower(shown, ended)
    f.on_resume(resume("ab", 2))
    f.on_frames(frames(4, delta("d")))  # frame 3 was lost on the way
    assert [x["type"] for x in shown] == ["resume"] and f.waiting_since is not None
    f.on_resume(resume("abcd", 4))  # what the follower asks for once the gap is old enough
    f.on_frames(frames(5, delta("e")))
    assert [x.get("text") for x in shown] == ["ab", "abcd", "e"]
    assert f.waiting_since is None and not ended


def test_a_follower_elsewhere_counts_as_a_listener_until_it_goes_silent(settings):
    """The owner's side: a remote listener that stops saying "chat.hear" (its process died) lapses,
    so the cap on unheard answers applies to the answer again."""
    settings.PAGODA_CHAT_RELAY_TTL_S = 3
    generation = Generation(turn=None, start_frame=START)
    assert not generation.heard
    generation.hear_remote("specific.web2!a")
    assert generation.heard and generation.unheard_since is None
    generation.remote["specific.web2!a"] -= 3.5  # silent for longer than the registry's lifetime
    assert not generation.heard
    generation.hear_remote("specific.web2!a")  # its next "chat.hear"
    assert generation.heard
    generation.remote.clear()
    generation.listeners.add(asyncio.Queue())
    assert generation.heard
