"""run.yaml, validated: the run-level models (`run.py`), what every config model shares
(`base.py`) and the registry of backend types (`backends.py`; each type's model lives beside its
backend in `draftgen.backends`)."""

from draftgen.config.base import ConfigError
from draftgen.config.run import (
    DatasetConfig,
    DropRule,
    ModelConfig,
    RowMapping,
    RunConfig,
    SamplingChoice,
    SamplingConfig,
    load_config,
)

__all__ = [
    "ConfigError",
    "DatasetConfig",
    "DropRule",
    "ModelConfig",
    "RowMapping",
    "RunConfig",
    "SamplingChoice",
    "SamplingConfig",
    "load_config",
]
