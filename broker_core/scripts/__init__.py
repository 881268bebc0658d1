"""The Lua scripts (lua/, lua/includes/) and how they are loaded and run (library.py)."""
