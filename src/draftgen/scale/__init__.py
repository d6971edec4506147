"""Beyond one client: sharded runs (`--shard I/N`), shared budgets across shards, Ray."""
