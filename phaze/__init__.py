"""phaze: integrated accelerator architecture and device placement search for LLM training."""

__version__ = "0.1.0"
