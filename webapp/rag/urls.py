from django.urls import path

from webapp.rag import knowledge_views, views

app_name = "rag"

urlpatterns = [
    path("rag/passages/<int:chunk_id>", views.passage_view, name="passage"),
    path("account/knowledge/", knowledge_views.knowledge_list, name="knowledge"),
    path("account/knowledge/<int:base_id>/", knowledge_views.knowledge_base, name="knowledge-base"),
    path("account/knowledge/<int:base_id>/delete", knowledge_views.knowledge_base_delete, name="knowledge-base-delete"),
    path("account/knowledge/<int:base_id>/documents/<int:document_id>/delete",
         knowledge_views.knowledge_document_delete, name="knowledge-document-delete"),
]
