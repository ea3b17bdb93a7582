"""Usage records and their totals."""

import pytest
from django.contrib.auth import get_user_model

from webapp.keys.services import apikey_create
from webapp.usage.selectors import usage_list, usage_totals
from webapp.usage.outcome import Outcome
from webapp.usage.services import usage_record_create, usage_status
from workers.protocol import Chunk

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]


def test_totals_sum_the_tokens_of_one_keys_ended_records_only_and_count_its_running_ones():
    owner = get_user_model().objects.create_user("alice")
    mine, _ = apikey_create(owner=owner, name="mine")
    other, _ = apikey_create(owner=owner, name="other")
    for api_key, prompt, completion, status in ((mine, 10, 5, "ok"), (mine, 7, 0, "error"), (mine, 50, 20, "running"),
                                                (other, 100, 100, "ok")):
        usage_record_create(request_id=f"r{prompt}", endpoint="completions", status=status, latency=0.5,
                            api_key=api_key, user=owner, model_name="tiny", prompt_tokens=prompt,
                            completion_tokens=completion, cached_prompt_tokens=prompt // 2)

    assert usage_totals(api_key=mine) == {"requests": 2, "prompt_tokens": 17, "completion_tokens": 5,
                                          "cached_prompt_tokens": 8, "running": 1}
    assert usage_list(api_key=other).get().prompt_tokens == 100


def test_a_record_with_an_unknown_status_is_refused():
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="status"):
        usage_record_create(request_id="r", endpoint="completions", status="fine", latency=0.1)


def _choices_ended(*reasons: str) -> Outcome:
    outcome = Outcome()
    samples = [{"index": i, "text": "x", "finish_reason": reason, "num_output_tokens": 1}
               for i, reason in enumerate(reasons)]
    chunk = Chunk("r", "", [], None, True, reasons[0], 3, len(reasons), 0, 0.01)
    chunk.samples = samples
    outcome.add(chunk)
    return outcome


@pytest.mark.parametrize(("reasons", "status"), [
    (("length", "length"), "ok"),
    (("length", "abort", "abort"), "aborted"),  # the first choice ran out before the abort reached the rest
    (("abort", "stop"), "aborted"),
])
def test_a_request_with_several_choices_is_aborted_when_any_of_them_was(reasons, status):
    assert usage_status(outcome=_choices_ended(*reasons)) == status
