"""Executed tools for closed agent loops (bfcl_loop.py: BFCL-v3's simulated multi-turn backends)."""
