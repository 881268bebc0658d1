"""The operators' web console: views over broker_core state and operations, live via WebSocket."""
