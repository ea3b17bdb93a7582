"""webapp/config/after_ready.py: start-up work from an AppConfig.ready() runs in a thread of its
own once the apps are ready, and what it raises is logged, not lost with the thread."""

import logging

from webapp.config.after_ready import when_apps_ready


def test_the_work_runs_in_a_thread_of_its_own():
    ran = []
    thread = when_apps_ready(lambda: ran.append(1), "counting", "pagoda-test-after-ready")
    thread.join(5)
    assert ran == [1] and thread.name == "pagoda-test-after-ready" and thread.daemon


def test_what_the_work_raises_is_logged_with_its_name(caplog):
    def work():
        raise RuntimeError("no database yet")

    with caplog.at_level(logging.ERROR, logger="webapp.config.after_ready"):
        when_apps_ready(work, "warming the tokenizers", "pagoda-test-after-ready").join(5)
    assert "warming the tokenizers failed" in caplog.text and "no database yet" in caplog.text
