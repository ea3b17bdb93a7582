from django.urls import path

from webapp.search import views

app_name = "search"

urlpatterns = [
    path("search/", views.search_page, name="page"),
    path("search/suggest", views.search_suggest, name="suggest"),
]
