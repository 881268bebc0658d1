"""Root URLs: health, metrics, admin, the OpenAPI schema and its interactive page, the REST gateway."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import TemplateView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from signalbox.health import healthz
from signalbox.metrics import metrics_view

urlpatterns = [
    path("", TemplateView.as_view(template_name="signalbox/index.html"), name="index"),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),  # Prometheus (docs/metrics.md)
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="openapi-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="openapi-schema"), name="openapi-docs"),
    path("api/", include("gateway.api.urls")),
    path("console/", include("console.urls")),  # the web console
]

# Under /api/ a missing resource or a crash is a problem-details response like every other error.
handler404 = "gateway.api.errors.not_found"
handler500 = "gateway.api.errors.server_error"
