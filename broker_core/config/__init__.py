"""Configuration: per-destination policies (entry, map, store), the broker-wide system usage, the virtual
destinations, and the TOML file they are read from. Values only: nothing here runs a script."""
