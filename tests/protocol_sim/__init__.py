"""The store protocol's simulation: the agent's own store code against an in-memory Hub, in virtual time."""
