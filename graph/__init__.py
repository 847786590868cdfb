"""Building the EGG graph, its routers, checkpoints and time travel, and the CLI."""
