"""The folder names the scale-out machinery keeps inside a run folder. A module of its own, and
light, so that the config (which forbids datasets to take these names) does not import the
shard code and what it reads the run folder with (numpy)."""

SHARDS_DIR = "shards"
"""Each shard's own run folder is SHARDS_DIR/I-of-N."""
