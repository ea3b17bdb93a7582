"""The OpenAI-compatible API's explicit v1/ paths, one view per operation; any other v1/ path
answers an OpenAI error object (404), never the site's HTML page."""

from django.urls import path, re_path
from django.views.decorators.csrf import csrf_exempt

from webapp.openai_api import anthropic_views, embedding_views, responses_views, tokenize_views, views

# API keys, not cookies, authenticate these endpoints, so CSRF protection does not apply.
urlpatterns = [
    path("v1/openapi.json", views.openapi_schema, name="openapi-schema"),
    path("v1/models", views.ModelListApi.as_view(), name="model-list"),
    path("v1/models/<str:model>", views.ModelRetrieveApi.as_view(), name="model-retrieve"),
    path("v1/chat/completions", csrf_exempt(views.ChatCompletionCreateApi.as_view()), name="chat-completion-create"),
    path("v1/completions", csrf_exempt(views.CompletionCreateApi.as_view()), name="completion-create"),
    path("v1/embeddings", csrf_exempt(embedding_views.EmbeddingCreateApi.as_view()), name="embedding-create"),
    path("v1/messages", csrf_exempt(anthropic_views.MessageCreateApi.as_view()), name="message-create"),
    path("v1/messages/count_tokens", csrf_exempt(anthropic_views.MessageCountTokensApi.as_view()),
         name="message-count-tokens"),
    path("v1/responses", csrf_exempt(responses_views.ResponseCreateApi.as_view()), name="response-create"),
    path("v1/responses/<str:response_id>", csrf_exempt(responses_views.ResponseDetailApi.as_view()),
         name="response-detail"),
    path("v1/responses/<str:response_id>/cancel", csrf_exempt(responses_views.ResponseCancelApi.as_view()),
         name="response-cancel"),
    path("tokenize", tokenize_views.TokenizeApi.as_view(), name="tokenize"),  # vLLM's paths, outside v1/
    path("detokenize", tokenize_views.DetokenizeApi.as_view(), name="detokenize"),
    re_path(r"^v1(?:/|$)", views.unknown_url, name="v1-unknown"),
]
