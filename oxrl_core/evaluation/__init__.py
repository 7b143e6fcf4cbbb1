"""`oxrl eval`: sampling with vLLM, scoring with a reward, pass@k."""
