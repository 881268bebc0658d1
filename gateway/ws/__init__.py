"""What the WebSocket protocols share: a connection's link to the broker (subscriptions, pushing, leases,
the bounded send buffer), authentication and permissions, and the JSON protocol at /ws/v1."""
