"""`oxrl train sl` and `oxrl train rl`."""

from pathlib import Path

import typer
from rich.console import Console

from oxrl_core.algs.registry import RL_ALGS, SL_ALGS
from oxrl_core.config.load import dump_config

train_app = typer.Typer(
    help="Train a model: supervised/preference (sl) or reinforcement learning (rl).", no_args_is_help=True
)

CONFIG = typer.Option(
    None,
    "--config",
    "-c",
    help="YAML config file (every key: docs/reference/config.md); without one, the overrides alone are the config.",
)
OVERRIDES = typer.Argument(
    None, help="Dotted overrides applied after the file, e.g. train.lr=2e-5 train.steps=10.", show_default=False
)
DRY_RUN = typer.Option(False, "--dry-run", help="Validate, print the resolved config as YAML and exit.")


@train_app.command("sl")
def sl(
    alg: str = typer.Option(
        None,
        "--alg",
        help=f"One of: {', '.join(SL_ALGS)} (default: train.alg, else sft).",
        autocompletion=lambda incomplete: _starting_with(SL_ALGS, incomplete),
    ),
    config: Path = CONFIG,
    overrides: list[str] = OVERRIDES,
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in run.output_dir/run.name from its last checkpoint."
    ),
    strict: bool = typer.Option(False, "--strict", help="Make a bad data record fatal instead of skipped and counted."),
    dry_run: bool = DRY_RUN,
) -> None:
    """Supervised and preference training on DeepSpeed: SFT, CPT, KD, DPO, IPO, SimPO, ORPO, RM, KTO, RFT, SPIN, Online DPO."""
    from oxrl_core.resolve.run import resolve_run  # imports torch: not for every `oxrl --help`

    resolved = resolve_run("sl", config, _with_flags(overrides, alg, strict))
    if dry_run:
        _dry_run(resolved)
        return
    from oxrl_cli.render import render_sl_summary
    from oxrl_core.loops.train import train  # after validation: a refused config or a dry run need not import it

    console = Console()
    render_sl_summary(train(resolved, resume, console), console)


@train_app.command("rl")
def rl(
    alg: str = typer.Option(
        None,
        "--alg",
        help=f"One of: {', '.join(RL_ALGS)} (default: train.alg, else cispo).",
        autocompletion=lambda incomplete: _starting_with(RL_ALGS, incomplete),
    ),
    config: Path = CONFIG,
    overrides: list[str] = OVERRIDES,
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in run.output_dir/run.name from its last checkpoint."
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Make a bad prompt record fatal instead of skipped and counted."
    ),
    dry_run: bool = DRY_RUN,
) -> None:
    """Reinforcement learning: vLLM rollouts, verifiable rewards, DeepSpeed updates, all under Ray."""
    from oxrl_core.resolve.run import resolve_run  # imports torch: not for every `oxrl --help`

    resolved = resolve_run("rl", config, _with_flags(overrides, alg, strict))
    if dry_run:
        _dry_run(resolved)
        return
    from oxrl_cli.render import render_rl_summary
    from oxrl_core.loops.train import train  # after validation: a refused config or a dry run need not import it

    console = Console()
    render_rl_summary(train(resolved, resume, console), console)


def _starting_with(names: tuple[str, ...], incomplete: str) -> list[str]:
    """Shell completion of `--alg`."""
    return [name for name in names if name.startswith(incomplete)]


def _dry_run(resolved) -> None:
    """Print the resolved config. A run that scores samples resolves its reward function here as it would (a
    shipped name, or `module:function` imported), so a typo fails now and not after the engines have started."""
    config = resolved.config
    if resolved.algorithm.rewards:
        from oxrl_core.rewards import resolve_reward

        resolve_reward(
            config.reward.func, config.reward.kwargs, config.reward.judge if resolved.algorithm.loop == "rl" else None
        )
    typer.echo(dump_config(config), nl=False)


def _with_flags(overrides: list[str] | None, alg: str | None, strict: bool) -> list[str]:
    """Command-line flags are overrides too, applied last."""
    flags = list(overrides or [])
    if alg is not None:
        flags.append(f"train.alg={alg}")
    if strict:
        flags.append("data.strict=true")
    return flags
