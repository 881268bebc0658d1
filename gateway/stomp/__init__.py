"""STOMP 1.0/1.1/1.2 over WebSocket: `frames` is the pure codec, `protocol` the session that maps frames
to broker_core calls (ActiveMQ's STOMP mapping, shared/spec/activemq-semantics.md Appendix A)."""
