"""What `oxrl doctor` reports: one `Check` per finding, gathered in a `Report`.

`Report.model_json_schema()` is the schema of `oxrl doctor --json`.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from oxrl_core.version import __version__

Status = Literal["ok", "warn", "fail"]
SEVERITY = {"ok": 0, "warn": 1, "fail": 2}


class Check(BaseModel):
    """One finding about the environment."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="What was checked, e.g. `ram`, `gpu 0`, `torch`, `ray`.")
    status: Status = Field(description="`ok`; `warn`: works, with a caveat; `fail`: a run would break.")
    finding: str = Field(description="One line: what was found.")
    fix: str | None = Field(None, description="One line: what to do; null when the status is ok.")

    @model_validator(mode="after")
    def _fix_when_not_ok(self) -> "Check":
        if (self.status == "ok") != (self.fix is None):
            raise ValueError(f"check {self.name!r}: a fix is given exactly when the status is not ok")
        return self


class Report(BaseModel):
    """The output of `oxrl doctor --json`."""

    model_config = ConfigDict(extra="forbid")

    oxrl_version: str
    status: Status = Field(description="The worst status of all checks.")
    checks: list[Check]

    @classmethod
    def of(cls, checks: list[Check]) -> "Report":
        return cls(oxrl_version=__version__, status=worst(c.status for c in checks), checks=checks)

    def exit_code(self, strict: bool) -> int:
        """1 when a check failed, or (with `strict`) warned; else 0."""
        return int(self.status == "fail" or (strict and self.status == "warn"))


def worst(statuses) -> Status:
    return max(statuses, key=SEVERITY.__getitem__, default="ok")
