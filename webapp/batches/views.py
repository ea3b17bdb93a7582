"""The Batch API's endpoints (OpenAI's paths and shapes): files and batches, each scoped to the
owner of the calling key. One operation per view: validate, one service or selector call."""

from __future__ import annotations

from django.http import HttpResponse
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response

from webapp.batches import selectors, services
from webapp.batches.serializers import (BatchCreateSerializer, FilePageSerializer, FileUploadSerializer,
                                        PageSerializer, batch_object, file_object, list_page)
from webapp.openai_api import errors
from webapp.openai_api.views import OpenAIApiView


def validated(serializer_class, data) -> dict:
    serializer = serializer_class(data=data)
    try:
        serializer.is_valid(raise_exception=True)
    except ValidationError as exc:
        raise errors.from_validation_error(exc) from None
    return serializer.validated_data


class FileCollectionApi(OpenAIApiView):
    """POST v1/files (multipart: ``file``, ``purpose=batch``) and GET v1/files."""

    parser_classes = [MultiPartParser, FormParser]

    def post(self, request):
        values = validated(FileUploadSerializer, request.data)
        upload = values["file"]
        file = services.file_create(api_key=request.auth, filename=upload.name, content=upload.read())
        return Response(file_object(file))

    def get(self, request):
        page = validated(FilePageSerializer, request.query_params)
        files, has_more = selectors.file_list(owner=request.user, purpose=request.query_params.get("purpose"),
                                              after=page.get("after"), limit=page["limit"])
        return Response(list_page([file_object(f) for f in files], has_more=has_more))


class FileRetrieveApi(OpenAIApiView):
    """GET and DELETE v1/files/<file_id>."""

    def get(self, request, file_id: str):
        return Response(file_object(selectors.file_get(owner=request.user, public_id=file_id)))

    def delete(self, request, file_id: str):
        services.file_delete(file=selectors.file_get(owner=request.user, public_id=file_id))
        return Response({"id": file_id, "object": "file", "deleted": True})


class FileContentApi(OpenAIApiView):
    """GET v1/files/<file_id>/content: the JSONL itself, whatever the client's Accept says (the
    openai client asks for application/binary); errors are still JSON objects."""

    def perform_content_negotiation(self, request, force=False):
        return super().perform_content_negotiation(request, force=True)

    def get(self, request, file_id: str):
        file = selectors.file_get(owner=request.user, public_id=file_id)
        with file.content.open("rb") as handle:
            return HttpResponse(handle.read(), content_type="application/jsonl")


class BatchCollectionApi(OpenAIApiView):
    """POST v1/batches (JSON, read by OpenAIApiView's parser) and GET v1/batches (``after``, ``limit``)."""

    def post(self, request):
        values = validated(BatchCreateSerializer, request.data)
        try:
            input_file = selectors.file_get(owner=request.user, public_id=values["input_file_id"])
        except errors.OpenAIError as exc:
            exc.param = "input_file_id"
            raise
        batch = services.batch_create(api_key=request.auth, input_file=input_file, endpoint=values["endpoint"],
                                      completion_window=values["completion_window"],
                                      metadata=values.get("metadata"))
        return Response(batch_object(selectors.batch_get(owner=request.user, public_id=batch.public_id)))

    def get(self, request):
        page = validated(PageSerializer, request.query_params)
        batches, has_more = selectors.batch_list(owner=request.user, after=page.get("after"), limit=page["limit"])
        return Response(list_page([batch_object(b) for b in batches], has_more=has_more))


class BatchRetrieveApi(OpenAIApiView):
    """GET v1/batches/<batch_id>."""

    def get(self, request, batch_id: str):
        return Response(batch_object(selectors.batch_get(owner=request.user, public_id=batch_id)))


class BatchCancelApi(OpenAIApiView):
    """POST v1/batches/<batch_id>/cancel."""

    def post(self, request, batch_id: str):
        batch = services.batch_cancel(batch=selectors.batch_get(owner=request.user, public_id=batch_id))
        return Response(batch_object(selectors.batch_get(owner=request.user, public_id=batch.public_id)))
