"""Content-Security-Policy on every response: scripts, styles and images from this site only.

No page has inline script or style (templates/ load everything from static/), so the policy
needs no 'unsafe-inline' and no nonces. ``img-src 'self' data:`` is what keeps model output
rendered on the chat page from loading a remote image (a prompt-injection exfiltration path:
the URL would carry the conversation out). The WebSocket host is named explicitly because
browsers before CSP Level 3 do not let 'self' match ws:/wss:.
"""

from __future__ import annotations

from django.core.exceptions import DisallowedHost

from webapp.config.on_the_loop import OnTheLoop

HEADER = "Content-Security-Policy"


def content_security_policy(host: str | None) -> str:
    """The policy for a response served under ``host`` (None: a host Django refused)."""
    sockets = f" ws://{host} wss://{host}" if host else ""
    return "; ".join([
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        f"connect-src 'self'{sockets}",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ])


class ContentSecurityPolicyMiddleware(OnTheLoop):
    """Sets the policy unless a view set its own (a header: on the event loop under ASGI)."""

    def process_response(self, request, response):
        if HEADER not in response:
            try:
                host = request.get_host()
            except DisallowedHost:
                host = None
            response[HEADER] = content_security_policy(host)
        return response
