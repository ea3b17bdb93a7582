"""Who a request belongs to in the engine (workers.protocol.GenerateRequest.tenant).

The engine scopes its prefix cache to the tenant (and shares the batch fairly between tenants), so
the tenant is whoever authenticated, never anything in the request body: an API key's owner for the
OpenAI-compatible API and the Batch API (the batch's key's owner), the logged-in user for the chat
page. A user's chat turns and the requests of the keys they own are one tenant.
"""


def user_tenant(user_id: int) -> str:
    return f"user:{user_id}"
