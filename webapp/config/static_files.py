"""WhiteNoise serving /static/ from the web process, without taking the ASGI stack off its loop.

WhiteNoise's middleware is sync-only: under Daphne, Django would run it (and so every request
passing through it, API streams included) through the one thread sync code shares. This
subclass is both sync- and async-capable: on the async path it answers a static file from a
worker thread and hands anything else straight to the async handler below it.

Files are found as ``runserver`` finds them (WHITENOISE_USE_FINDERS), so ``make run`` needs no
``collectstatic``; a STATIC_ROOT that was collected is served too, and one that was not is no
error. Security headers (nosniff, Referrer-Policy, CSP) come from the middleware above this one.
"""

from __future__ import annotations

import os

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpResponse
from whitenoise.middleware import WhiteNoiseMiddleware


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        super().__init__(get_response)
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def add_files(self, root, prefix=None):
        if os.path.isdir(root):  # an uncollected STATIC_ROOT: the finders still serve every file
            super().add_files(root, prefix)

    def __call__(self, request):
        if self.is_async:
            return self.__acall__(request)
        return super().__call__(request)

    async def __acall__(self, request):
        static_file = self.find_file(request.path_info) if self.autorefresh else self.files.get(request.path_info)
        if static_file is None:
            return await self.get_response(request)
        return await sync_to_async(self.serve_whole, thread_sensitive=False)(static_file, request)

    @staticmethod
    def serve_whole(static_file, request) -> HttpResponse:
        """The file read at once (the largest here is ~130 KB): no sync iterator for ASGI to drain."""
        answer = static_file.get_response(request.method, request.META)
        body = b""
        if answer.file is not None:
            with answer.file as f:
                body = f.read()
        response = HttpResponse(body, status=int(answer.status))
        del response["Content-Type"]
        for key, value in answer.headers:
            response[key] = value
        return response
