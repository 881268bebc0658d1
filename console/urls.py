"""The console's pages, mounted at /console/ by signalbox.urls."""

from django.contrib.auth import views as auth_views
from django.urls import path

from console import views, views_analytics, views_node
from console.login import login

app_name = "console"

urlpatterns = [
    path("login/", login, name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="console:login"), name="logout"),
    path("", views.overview, name="overview"),
    path("destinations/", views.destinations, name="destinations"),
    path("queues/<str:name>/", views.queue, name="queue"),
    path("queues/<str:name>/browse/", views.browse, name="browse"),
    path("queues/<str:name>/messages/<str:message_id>/", views.message, name="message"),
    path("topics/<str:name>/", views.topic, name="topic"),
    path("routing/", views.routing, name="routing"),
    path("connections/", views.connections, name="connections"),
    path("connections/<str:connection_id>/", views.connection, name="connection"),
    path("dead-letters/", views.dead_letters, name="dead-letters"),
    path("send/", views.send, name="send"),
    path("audit/", views.audit, name="audit"),
    path("node/", views_node.node, name="node"),
    # the pipeline's summary per destination (console/views_analytics.py)
    path("analytics/", views_analytics.index, name="analytics"),
    path("analytics/<str:kind>/<str:name>/", views_analytics.destination, name="analytics-destination"),
    path("analytics/<str:kind>/<str:name>/summary.json", views_analytics.summary_json,
         name="analytics-summary"),
]
