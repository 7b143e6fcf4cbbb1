"""oxrl's version: what `oxrl --version`, the doctor's report and issue reports print."""

__version__ = "0.1.0"
