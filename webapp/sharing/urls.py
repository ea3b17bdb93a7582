from django.urls import path

from webapp.sharing import views

app_name = "sharing"

urlpatterns = [
    path("shared/", views.share_list_view, name="list"),
    path("shared/new", views.share_create_view, name="create"),
    path("shared/<int:share_id>/revoke", views.share_revoke_view, name="revoke"),
    path("shared/settings", views.sharing_settings_view, name="settings"),
    path("s/<str:token>/", views.shared_page, name="view"),
]
