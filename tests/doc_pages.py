"""The pages a user reads and the examples they show. Every test that runs a page's examples reads them from here,
so an example added to any page is run (or parsed) by the suite without a test naming it."""

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", REPO / "FAQ.md", REPO / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]
# Run for real, in order, by tests/integration/test_quickstart.py (its commands build on each other's outputs).
QUICKSTART = DOCS / "quickstart.md"
# A command the suite cannot run says why, in a trailing comment of one of these forms.
NOT_RUN_MARKERS = ("needs a GPU", "needs a GPU host", "needs several machines", "needs Slurm", "needs the Hub")

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


@dataclass(frozen=True)
class Command:
    """One line of a bash block: the command, and the comment after it (two spaces, then #)."""

    where: str
    page: Path
    text: str
    comment: str

    @property
    def marker(self) -> str | None:
        return next((m for m in NOT_RUN_MARKERS if self.comment.startswith(m)), None)


def blocks(lang: str, pages: list[Path] = PAGES) -> list[Block]:
    found = []
    for page in pages:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == lang:
                found.append(Block(page, text.count("\n", 0, match.start()) + 1, lang, match.group(2)))
    return found


def commands(prefix: str = "", pages: list[Path] = PAGES) -> list[Command]:
    """Every line of every bash block (of `pages`) that starts with `prefix`."""
    found = []
    for block in blocks("bash", pages):
        for offset, line in enumerate(block.text.splitlines(), start=1):
            text, _, comment = line.partition("  #")
            if text.strip() and text.strip().startswith(prefix):
                found.append(
                    Command(
                        f"{block.page.relative_to(REPO)}:{block.line + offset}",
                        block.page,
                        text.strip(),
                        comment.strip().removeprefix("#").strip(),
                    )
                )
    return found


def quickstart_lines() -> set[str]:
    """The quick start's commands, which its integration test runs in order, wherever a page repeats them."""
    return {c.text for c in commands(pages=[QUICKSTART])}
