"""HTTP (DRF) and WebSocket (Channels) adapters: frames in, broker_core calls out, nothing decided here."""
