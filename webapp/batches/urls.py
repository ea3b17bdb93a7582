"""The Batch API's v1/ paths (included before webapp.openai_api's, whose catch-all answers any
other v1/ path with a 404 error object), and the console's batches page."""

from django.urls import path

from webapp.batches import console_views, views

# API keys, not cookies, authenticate the v1/ endpoints (DRF's APIView exempts them from CSRF).
urlpatterns = [
    path("v1/files", views.FileCollectionApi.as_view(), name="file-collection"),
    path("v1/files/<str:file_id>", views.FileRetrieveApi.as_view(), name="file-retrieve"),
    path("v1/files/<str:file_id>/content", views.FileContentApi.as_view(), name="file-content"),
    path("v1/batches", views.BatchCollectionApi.as_view(), name="batch-collection"),
    path("v1/batches/<str:batch_id>", views.BatchRetrieveApi.as_view(), name="batch-retrieve"),
    path("v1/batches/<str:batch_id>/cancel", views.BatchCancelApi.as_view(), name="batch-cancel"),
    path("console/batches/", console_views.batches_page, name="console-batches"),
    path("console/batches/files/<str:file_id>", console_views.batch_file_download, name="console-batch-file"),
]
