"""Root URLs: health, metrics, admin, the OpenAPI schema and its interactive page, the REST gateway.

Only /healthz answers anonymous users (/metrics answers its own token only: signalbox/metrics.py). The
schema and its page are for authenticated users (SPECTACULAR_SETTINGS' SERVE_PERMISSIONS: a token or the
console's session), as the API they describe: they tell which version and which features this
deployment runs, and nobody needs them without an account (the public reference is docs/api.md). The
page sends an anonymous browser to the console's login first.
"""

from django.contrib import admin
from django.contrib.auth.decorators import login_required
from django.urls import include, path, re_path
from django.views.generic import TemplateView
from drf_spectacular.views import SpectacularSwaggerView

from gateway.api.schema import SchemaView
from gateway.api.webconsole_xml import WebConsoleXmlView
from signalbox.health import healthz
from signalbox.metrics import metrics_view

urlpatterns = [
    path("", TemplateView.as_view(template_name="signalbox/index.html"), name="index"),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),  # Prometheus (docs/metrics.md)
    # ActiveMQ's web console XML feeds (Telegraf's activemq input), before the admin site's own pages
    re_path(r"^admin/xml/(?P<feed>[^/]*)\.jsp$", WebConsoleXmlView.as_view(),
            name="webconsole-xml"),
    path("admin/", admin.site.urls),
    path("api/schema/", SchemaView.as_view(), name="openapi-schema"),
    path("api/docs/", login_required(SpectacularSwaggerView.as_view(url_name="openapi-schema"),
                                     login_url="console:login"), name="openapi-docs"),
    path("api/", include("gateway.api.urls")),
    path("console/", include("console.urls")),  # the web console
]

# Under /api/ a missing resource or a crash is a problem-details response like every other error.
handler404 = "gateway.api.errors.not_found"
handler500 = "gateway.api.errors.server_error"
