"""The chat pages: conversations, their rename, delete, export and import, and the login/logout views."""

from django.contrib.auth import views as auth_views
from django.urls import path

from webapp.accounts.views import LoginView
from webapp.chat import transfer_views, views

app_name = "chat"

urlpatterns = [
    path("", views.chat_page, name="index"),
    path("c/<int:conversation_id>/", views.chat_page, name="conversation"),
    path("c/<int:conversation_id>/rename", views.conversation_rename_view, name="conversation-rename"),
    path("c/<int:conversation_id>/delete", views.conversation_delete_view, name="conversation-delete"),
    path("c/<int:conversation_id>/export.<str:fmt>", transfer_views.conversation_export_view,
         name="conversation-export"),
    path("export/conversations.<str:fmt>", transfer_views.conversations_export_view, name="conversations-export"),
    path("import", transfer_views.conversations_import_view, name="conversations-import"),
    path("documents/text", views.document_text_view, name="document-text"),
    path("accounts/login/", LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
]
