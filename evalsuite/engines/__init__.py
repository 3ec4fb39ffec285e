"""Other engines that replay the same trajectories and write the same records (today: vLLM)."""
