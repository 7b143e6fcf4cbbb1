"""The model registry: the scout behind `oxrl onboard`, the entry schema, the shipped entries (entries/*.yaml)."""
