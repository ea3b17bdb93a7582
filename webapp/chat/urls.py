"""The chat pages: conversations, their rename and delete, and the login/logout views."""

from django.contrib.auth import views as auth_views
from django.urls import path

from webapp.accounts.views import LoginView
from webapp.chat import views

app_name = "chat"

urlpatterns = [
    path("", views.chat_page, name="index"),
    path("c/<int:conversation_id>/", views.chat_page, name="conversation"),
    path("c/<int:conversation_id>/rename", views.conversation_rename_view, name="conversation-rename"),
    path("c/<int:conversation_id>/delete", views.conversation_delete_view, name="conversation-delete"),
    path("documents/text", views.document_text_view, name="document-text"),
    path("accounts/login/", LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
]
