"""`oxrl doctor`: environment checks, each a function returning a `Check` (ok / warn / fail, finding, fix).

`diagnose.run_checks` runs them all; `report.Report` is the `--json` output. This
package file imports nothing, so that the probe processes start light.
"""
