"""MLflow logging takes every algorithm's params: its block's name may hold characters MLflow refuses in a name."""

from pathlib import Path

from mlflow.tracking import MlflowClient

from oxrl_core.algs.registry import RL_ALGS, SL_ALGS
from oxrl_core.config.load import read_tree, validate
from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.tracking.mlflow_log import MlflowLog, flatten

REPO = Path(__file__).resolve().parents[2]


def test_each_algorithm_s_example_logs_its_params_and_a_step_to_mlflow(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # one store: its schema is made once
    for alg in [*RL_ALGS, *SL_ALGS]:
        tree = read_tree(REPO / "examples" / f"{'gspo' if alg == 'gspo-token' else alg}_tiny.yaml")
        tree["train"]["alg"] = alg
        config = validate(RLConfig if alg in RL_ALGS else SLConfig, tree)
        params = flatten(config.model_dump(mode="json", by_alias=True))
        with MlflowLog(uri, alg, params) as log:
            log.log({"loss": 1.0, "rewards/margins": 0.5}, step=1)
        run = MlflowClient(uri).get_run(log.run_id)
        assert len(run.data.params) == len(params) and run.data.metrics["rewards/margins"] == 0.5, alg
        if alg.startswith("reinforce++"):
            assert f"train.{alg.replace('+', '_')}.kl_coeff" in run.data.params
