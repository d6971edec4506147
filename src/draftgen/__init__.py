"""draftgen: token-exact training data for speculative-decoding draft models."""

__version__ = "0.1.0"
