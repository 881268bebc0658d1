"""The console's pages, mounted at /console/ by signalbox.urls."""

from django.contrib.auth import views as auth_views
from django.urls import path

from console import views, views_analytics, views_node
from console.login import login
from gateway import paths  # noqa: F401 - registers the `segment` converter (names in paths)

app_name = "console"

urlpatterns = [
    path("login/", login, name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="console:login"), name="logout"),
    path("", views.overview, name="overview"),
    path("destinations/", views.destinations, name="destinations"),
    path("queues/<segment:name>/", views.queue, name="queue"),
    path("queues/<segment:name>/browse/", views.browse, name="browse"),
    path("queues/<segment:name>/messages/<segment:message_id>/", views.message, name="message"),
    path("topics/<segment:name>/", views.topic, name="topic"),
    path("routing/", views.routing, name="routing"),
    path("connections/", views.connections, name="connections"),
    path("connections/<segment:connection_id>/", views.connection, name="connection"),
    path("dead-letters/", views.dead_letters, name="dead-letters"),
    path("send/", views.send, name="send"),
    path("audit/", views.audit, name="audit"),
    path("node/", views_node.node, name="node"),
    # the pipeline's summary per destination (console/views_analytics.py)
    path("analytics/", views_analytics.index, name="analytics"),
    path("analytics/<str:kind>/<segment:name>/", views_analytics.destination, name="analytics-destination"),
    path("analytics/<str:kind>/<segment:name>/summary.json", views_analytics.summary_json,
         name="analytics-summary"),
]
