"""OpenAI's Responses API: ``POST v1/responses`` through the one serving path
(webapp/openai_api/lifecycle.py) as the ``RESPONSES`` dialect; ``GET`` / ``DELETE
v1/responses/<id>`` and ``POST v1/responses/<id>/cancel`` on the stored responses.

``background``: the request goes through the same path as any other up to its answer: the key
check, the body, the key's limits (it takes one of the key's concurrent requests, held until its
usage record is written, as a foreground request holds it), the previous response read. Any
refusal is the answer, with its usage record, as without ``background``. It also takes one of the
key's MAX_BACKGROUND_PER_KEY background places (across every web process, in the limit store; a
killed process's places lapse with its lease), so that a key without a concurrency limit cannot
start unbounded work that no connection holds open (the ASGI gate counts only open requests).
The response is then stored ``queued`` and answered so, and its generation runs in a task of this
process (``completion_continue``), stored ``in_progress`` once that task starts it, then
``completed`` / ``incomplete`` / ``failed``. Cancel stores it ``cancelled`` and aborts it: its task
when it runs in this process (the usage record says aborted; cancelled before its generation
began, an aborted record with nothing billed is written then, and the key's slot freed), else
through the workers' abort (the engine request has the response's id), the owning process then
recording what was generated while the stored status stays ``cancelled``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import View

from webapp.keys.enforcement import LimitExceeded, apikey_background_release, apikey_background_take
from webapp.keys.limits import LimitStoreUnavailable
from webapp.keys.models import ApiKey
from webapp.openai_api import errors
from webapp.openai_api.body import body_parse
from webapp.openai_api.dialect import Dialect
from webapp.openai_api.lifecycle import completion_abandon, completion_continue, completion_create
from webapp.openai_api.models import StoredResponse
from webapp.openai_api.responses_input import ResponseInputSerializer, response_resolve
from webapp.openai_api.responses_render import ResponseStream, response_body, response_object
from webapp.openai_api.responses_store import (response_delete, response_end, response_get, response_keep,
                                               response_queue, response_start)
from webapp.openai_api.services import RESPONSES, model_target_for_key
from workers.connect import get_engine_client

logger = logging.getLogger(__name__)
BACKGROUND: dict[str, asyncio.Task] = {}  # response id -> its running generation, in this process
MAX_BACKGROUND_PER_KEY = 16  # background responses one key may have running at once


def _validate(body) -> dict:
    serializer = ResponseInputSerializer(data=body)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


RESPONSES_DIALECT = Dialect(endpoint=RESPONSES, validate=_validate, body=response_body, stream=ResponseStream,
                            resolve=response_resolve, keep=response_keep)
# The generation of a background response, its previous response resolved before it was queued.
_BACKGROUND_RUN = Dialect(endpoint=RESPONSES, validate=_validate, body=response_body, stream=ResponseStream,
                          keep=response_keep)


def _validate_background(body) -> dict:
    values = _validate(body)
    if not values["response"]["store"]:
        raise errors.invalid_parameter("background", "background responses must be stored (store: true)")
    if values["stream"]:
        raise errors.invalid_parameter("stream", "background responses are not streamed here; poll them")
    return values


def _background_take(api_key: ApiKey, request_id: str) -> None:
    try:
        apikey_background_take(api_key=api_key, request_id=request_id, limit=MAX_BACKGROUND_PER_KEY)
    except LimitExceeded as exc:
        raise errors.limit_exceeded(exc.code, exc.message, exc.retry_after) from exc
    except LimitStoreUnavailable as exc:
        raise errors.limits_unavailable() from exc


def _background_queue(api_key: ApiKey, request_id: str, values: dict) -> tuple[dict, dict]:
    """The previous response read, a background place taken, the response stored ``queued``."""
    values = response_resolve(api_key=api_key, values=values)
    _background_take(api_key, request_id)
    queued = response_object(response_id=request_id, values=values, model=values["model"],
                             created_at=int(time.time()), status="queued")
    try:
        response_queue(api_key=api_key, body=queued)
    except BaseException:
        apikey_background_release(api_key=api_key, request_id=request_id)
        raise
    return values, queued


async def _background_start(*, request_id: str, dialect: Dialect, api_key: ApiKey, values: dict,
                            started: float) -> HttpResponse:
    """``respond`` of an admitted background request: queue it and answer; its task generates it."""
    values, queued = await sync_to_async(_background_queue)(api_key, request_id, values)
    task = asyncio.create_task(_background(request_id, api_key, values, started))
    BACKGROUND[request_id] = task
    task.add_done_callback(lambda _: BACKGROUND.pop(request_id, None))
    response = JsonResponse(queued)
    response["X-Request-Id"] = request_id
    return response


BACKGROUND_DIALECT = Dialect(endpoint=RESPONSES, validate=_validate_background, respond=_background_start)


class ResponsesView(View):
    async def http_method_not_allowed(self, request, *args, **kwargs):
        allowed = [m.upper() for m in self.http_method_names if m != "options"]
        return errors.method_not_allowed(request.method, allowed).response()


class ResponseCreateApi(ResponsesView):
    """POST v1/responses."""

    http_method_names = ["post"]

    async def post(self, request: HttpRequest) -> HttpResponse:
        try:
            body = body_parse(request)
        except errors.OpenAIError:
            body = None  # refused by the serving path, with its usage record
        is_background = isinstance(body, dict) and body.get("background") is True
        return await completion_create(request=request, dialect=BACKGROUND_DIALECT if is_background
                                       else RESPONSES_DIALECT)


async def _background(response_id: str, api_key: ApiKey, values: dict, started: float) -> None:
    """The generation of a background response, in a thread-sensitive context of its own: it
    outlives the POST that started it, whose context (Django's, per request) ends with that POST,
    and its database work must stay on one thread in order. On the POST's, the running record was
    written in the POST's thread while a cancel's aborted record went to a new one, each unaware of
    the other: two records, one running for good (CI caught it)."""
    async with ThreadSensitiveContext():
        await _generate_in_background(response_id, api_key, values, started)


async def _generate_in_background(response_id: str, api_key: ApiKey, values: dict, started: float) -> None:
    try:
        try:
            await sync_to_async(response_start)(response_id=response_id)
        except Exception:  # only its polled status: the generation (and its usage record) must still run
            logger.warning("could not mark response %s in progress", response_id, exc_info=True)
        response = await completion_continue(request_id=response_id, dialect=_BACKGROUND_RUN, api_key=api_key,
                                             values=values, started=started)
    except asyncio.CancelledError:
        await sync_to_async(response_end)(response_id=response_id, status=StoredResponse.Status.CANCELLED)
        raise
    except Exception as exc:  # the path answers its own failures; this is a last resort
        response = errors.internal_error(exc).response()
    finally:
        await sync_to_async(apikey_background_release)(api_key=api_key, request_id=response_id)
    if response.status_code >= 400:
        error = json.loads(response.content)["error"]
        await sync_to_async(response_end)(response_id=response_id, status=StoredResponse.Status.FAILED,
                                          error={"code": error["code"] or "server_error",
                                                 "message": error["message"]})


class ResponseDetailApi(ResponsesView):
    """GET and DELETE v1/responses/<id>."""

    http_method_names = ["get", "delete"]

    async def get(self, request: HttpRequest, response_id: str) -> HttpResponse:
        return await _answer(request, lambda key: response_get(api_key=key, response_id=response_id).body)

    async def delete(self, request: HttpRequest, response_id: str) -> HttpResponse:
        return await _answer(request, lambda key: response_delete(api_key=key, response_id=response_id))


class ResponseCancelApi(ResponsesView):
    """POST v1/responses/<id>/cancel: a background response's generation aborted."""

    http_method_names = ["post"]

    async def post(self, request: HttpRequest, response_id: str) -> HttpResponse:
        def check(key) -> dict:
            stored = response_get(api_key=key, response_id=response_id)
            if not stored.body.get("background"):
                raise errors.invalid_parameter(None, "Only background responses can be cancelled.")
            return {}

        answer = await _answer(request, check)
        if answer.status_code >= 400:
            return answer
        await sync_to_async(response_end)(response_id=response_id, status=StoredResponse.Status.CANCELLED)
        task = BACKGROUND.get(response_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await completion_abandon(response_id)  # cancelled before its generation began
        else:  # running in another web process, or ended: the workers drop it if one holds it
            await _abort_elsewhere(request, response_id)
        return await _answer(request, lambda key: response_get(api_key=key, response_id=response_id).body)


async def _answer(request: HttpRequest, read) -> HttpResponse:
    def run():
        return read(RESPONSES_DIALECT.key(request))

    try:
        return JsonResponse(await sync_to_async(run)())
    except errors.OpenAIError as exc:
        return exc.response()


async def _abort_elsewhere(request: HttpRequest, response_id: str) -> None:
    def model_slug() -> str | None:
        api_key = RESPONSES_DIALECT.key(request)
        stored = response_get(api_key=api_key, response_id=response_id)
        try:
            return model_target_for_key(api_key=api_key, slug=stored.body.get("model") or "")[0].model.slug
        except errors.OpenAIError:
            return None  # the model is gone: nothing of it runs

    try:
        slug = await sync_to_async(model_slug)()
        if slug is not None:
            await get_engine_client(settings.REDIS_URL).abort(slug, response_id)
    except Exception:  # best effort: the response is stored cancelled either way
        logger.warning("could not abort response %s in the workers", response_id, exc_info=True)
