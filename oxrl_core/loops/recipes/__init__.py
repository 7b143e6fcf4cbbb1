"""What differs between runs (the harness, `loops/harness.py`, has the rest): offline supervised and preference
training, self-play supervised training (RFT, SPIN, Online DPO), and policy-gradient RL. Each has `step` and
`evaluate`, read top to bottom."""
