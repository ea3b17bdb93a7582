"""A middleware base whose hooks run on the event loop under ASGI (webapp/config/middleware.py says
why). Apart from Django's app machinery, so that any middleware module can import it early."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.utils.deprecation import MiddlewareMixin


async def run_hook(method, in_thread: bool, *args):
    if in_thread:
        return await sync_to_async(method, thread_sensitive=True)(*args)
    return method(*args)


class OnTheLoop(MiddlewareMixin):
    """``MiddlewareMixin`` whose hooks run on the event loop unless ``request_in_thread`` or
    ``response_in_thread`` says the stock method would block (then in the request's thread, as
    Django does)."""

    def request_in_thread(self, request) -> bool:
        return False

    def response_in_thread(self, request, response) -> bool:
        return False

    async def __acall__(self, request):
        response = None
        if hasattr(self, "process_request"):
            response = await run_hook(self.process_request, self.request_in_thread(request), request)
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            response = await run_hook(self.process_response, self.response_in_thread(request, response),
                                      request, response)
        return response
