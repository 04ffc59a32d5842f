"""Mutation testing of the broker's rules: ``mutate`` runs cosmic-ray, and ``lua``
mutates the Redis store's Lua scripts."""
