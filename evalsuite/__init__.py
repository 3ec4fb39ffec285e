"""evalsuite: speculative decoding under agentic workloads, measured step by step."""

__version__ = "0.1.0"
