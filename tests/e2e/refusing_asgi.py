"""An ASGI application that answers every HTTP request 503 at once, reading nothing: the yardstick
of tests/e2e/test_load_shedding.py, Daphne's own pace through a burst of connections."""


async def application(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"error": {"code": "server_overloaded"}}'})
