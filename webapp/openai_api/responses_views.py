"""OpenAI's Responses API: ``POST v1/responses`` through the one serving path
(webapp/openai_api/lifecycle.py) as the ``RESPONSES`` dialect; ``GET`` / ``DELETE
v1/responses/<id>`` and ``POST v1/responses/<id>/cancel`` on the stored responses.

``background``: the body is checked and the previous response read at once (a refusal is the
answer, as without it); the response is stored ``queued`` and answered so, and its generation runs
on this process's event loop, through the same path (admission, limits, usage record), until it
is stored ``completed`` (or ``incomplete`` / ``failed``). Cancel aborts it in the engine and stores
it ``cancelled``. The running task lives in the process that accepted the request: a cancel that
reaches another web process only marks the stored response (the generation runs out its tokens).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import View
from rest_framework.exceptions import ValidationError

from webapp.openai_api import errors
from webapp.openai_api.body import body_parse
from webapp.openai_api.dialect import Dialect
from webapp.openai_api.lifecycle import completion_create
from webapp.openai_api.models import StoredResponse
from webapp.openai_api.responses_input import ResponseInputSerializer, response_resolve
from webapp.openai_api.responses_render import ResponseStream, response_body, response_object
from webapp.openai_api.responses_store import (response_delete, response_end, response_get, response_keep,
                                               response_queue)
from webapp.openai_api.services import RESPONSES, new_request_id

logger = logging.getLogger(__name__)
BACKGROUND: dict[str, asyncio.Task] = {}  # response id -> its running generation, in this process


def _validate(body) -> dict:
    serializer = ResponseInputSerializer(data=body)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


RESPONSES_DIALECT = Dialect(endpoint=RESPONSES, validate=_validate, body=response_body, stream=ResponseStream,
                            resolve=response_resolve, keep=response_keep)


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
        if not (isinstance(body, dict) and body.get("background") is True):
            return await completion_create(request=request, dialect=RESPONSES_DIALECT)
        try:
            api_key = await sync_to_async(RESPONSES_DIALECT.key)(request)
            values = _validate(body)
            if not values["response"]["store"]:
                raise errors.invalid_parameter("background", "background responses must be stored (store: true)")
            if values["stream"]:
                raise errors.invalid_parameter("stream", "background responses are not streamed here; poll them")
            values = await sync_to_async(response_resolve)(api_key=api_key, values=values)
        except ValidationError as exc:
            return errors.from_validation_error(exc).response()
        except errors.OpenAIError as exc:
            return exc.response()
        queued = response_object(response_id=new_request_id(RESPONSES), values=values, model=values["model"],
                                 created_at=int(time.time()),
                                 status="queued")
        await sync_to_async(response_queue)(api_key=api_key, body=queued)
        task = asyncio.create_task(_background(request, queued["id"], values))
        BACKGROUND[queued["id"]] = task
        task.add_done_callback(lambda _: BACKGROUND.pop(queued["id"], None))
        return JsonResponse(queued)


async def _background(request: HttpRequest, response_id: str, values: dict) -> None:
    dialect = Dialect(endpoint=RESPONSES, validate=lambda _body: values, body=response_body, stream=ResponseStream,
                      keep=response_keep)
    try:
        response = await completion_create(request=request, dialect=dialect, request_id=response_id)
    except asyncio.CancelledError:
        await sync_to_async(response_end)(response_id=response_id, status=StoredResponse.Status.CANCELLED)
        raise
    except Exception as exc:  # the path answers its own failures; this is a last resort
        response = errors.internal_error(exc).response()
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
        task = BACKGROUND.get(response_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await sync_to_async(response_end)(response_id=response_id, status=StoredResponse.Status.CANCELLED)
        return await _answer(request, lambda key: response_get(api_key=key, response_id=response_id).body)


async def _answer(request: HttpRequest, read) -> HttpResponse:
    def run():
        return read(RESPONSES_DIALECT.key(request))

    try:
        return JsonResponse(await sync_to_async(run)())
    except errors.OpenAIError as exc:
        return exc.response()
