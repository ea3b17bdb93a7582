from django.urls import path

from webapp.rag import views

app_name = "rag"

urlpatterns = [
    path("rag/passages/<int:chunk_id>", views.passage_view, name="passage"),
]
