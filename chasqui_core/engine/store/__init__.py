"""The Redis layer: connections (one server, a cluster, Sentinel), where each queue's keys live, and the Lua
scripts every atomic change goes through (``lua/``, loaded once by ``scripts.py``). Nothing here knows what a
worker or a console is."""
