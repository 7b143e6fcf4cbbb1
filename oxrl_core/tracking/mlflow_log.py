"""MLflow logging of a run's params and per-step metrics.

The store is `run.tracking_uri`, else `$MLFLOW_TRACKING_URI`, else a local
SQLite store beside the run folders (`mlflow ui --backend-store-uri sqlite:///<output_dir>/mlflow.db`).
"""

import os
import re
import time
from pathlib import Path

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

EXPERIMENT = "oxrl"
# What MLflow takes in a param or metric name: letters, digits, `_ - . / :` and spaces; anything else (the `+` of
# `train.reinforce++.kl_coeff`) becomes `_`
NOT_IN_A_NAME = re.compile(r"[^\w\-./: ]")


def mlflow_name(key: str) -> str:
    return NOT_IN_A_NAME.sub("_", key)


def tracking_uri(configured: str | None, output_dir: Path) -> str:
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(output_dir / 'mlflow.db').resolve()}"


class MlflowLog:
    def __init__(self, uri: str, run_name: str, params: dict, run_id: str | None = None):
        """Start a run and log `params`, or continue `run_id` (a resumed run)."""
        self.client = MlflowClient(uri)
        if run_id is None:
            experiment = self.client.get_experiment_by_name(EXPERIMENT)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(EXPERIMENT)
            run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            self.client.log_batch(run_id, params=[Param(mlflow_name(k), str(v)[:6000]) for k, v in params.items()])
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[Metric(mlflow_name(k), float(v), now, step) for k, v in metrics.items()]
        )

    def __enter__(self) -> "MlflowLog":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        stopped = exc_type is not None and not issubclass(exc_type, Exception)  # KeyboardInterrupt, a signal's Stopped
        status = "FINISHED" if exc_type is None else "KILLED" if stopped else "FAILED"
        self.client.set_terminated(self.run_id, status=status)


def flatten(tree: dict, prefix: str = "") -> dict:
    """{'train': {'lr': 1e-5}} -> {'train.lr': 1e-5}: MLflow params are flat."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
