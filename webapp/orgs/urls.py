"""Members' own pages under /account/ (webapp/orgs/member_views.py)."""

from django.urls import path

from webapp.orgs import member_views

app_name = "account"
urlpatterns = [
    path("", member_views.account_home, name="home"),
    path("keys/", member_views.key_create, name="key-create"),
    path("keys/<int:key_id>/revoke/", member_views.key_revoke, name="key-revoke"),
    path("teams/<int:team_id>/", member_views.team_page, name="team"),
    path("teams/<int:team_id>/members/", member_views.member_set, name="member-set"),
    path("teams/<int:team_id>/members/<int:user_id>/remove/", member_views.member_remove, name="member-remove"),
]
