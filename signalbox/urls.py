"""Root URLs: health, admin, the OpenAPI schema; gateway and console mount their own URLs here."""

from django.contrib import admin
from django.urls import path
from django.views.generic import TemplateView
from drf_spectacular.views import SpectacularAPIView

from signalbox.health import healthz

urlpatterns = [
    path("", TemplateView.as_view(template_name="signalbox/index.html"), name="index"),
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="openapi-schema"),
]
